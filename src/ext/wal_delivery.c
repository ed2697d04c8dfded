/*
 * wal_delivery.c: the extension's entry point.
 *
 * _PG_init runs when the library is loaded. Loaded through shared_preload_libraries it
 * also reserves shared memory and registers the relay background workers; loaded any
 * other way (a CREATE EXTENSION on a server without the preload) it still defines its
 * settings so SQL functions work, and says in the log what is missing.
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "utils/builtins.h"

#include "bgworkers.h"
#include "otlp_sender.h"
#include "relay_wakeup.h"
#include "settings.h"
#include "wal_delivery.h"

PG_MODULE_MAGIC;

PG_FUNCTION_INFO_V1(wal_delivery_library_version);
PG_FUNCTION_INFO_V1(wal_delivery_invoking_role);

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static void
wal_delivery_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	relay_wakeup_request_shmem();
	otlp_sender_request_shmem();
}

static void
wal_delivery_shmem_startup(void)
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	relay_wakeup_init_shmem();
	otlp_sender_init_shmem();
}

void
_PG_init(void)
{
	define_settings();
	relay_wakeup_register_xact_callback();

	if (!process_shared_preload_libraries_in_progress)
	{
		ereport(LOG, (errmsg("wal_delivery is loaded without shared_preload_libraries"),
					  errhint("Add wal_delivery to shared_preload_libraries and restart "
							  "the server so its background workers start.")));
		return;
	}

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = wal_delivery_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = wal_delivery_shmem_startup;
	register_background_workers();
}

Datum
wal_delivery_library_version(PG_FUNCTION_ARGS)
{
	PG_RETURN_TEXT_P(cstring_to_text(WAL_DELIVERY_VERSION));
}

/*
 * The role that called into a SECURITY DEFINER function (current_user there is the
 * owner), so each outbox row records who enqueued it.
 */
Datum
wal_delivery_invoking_role(PG_FUNCTION_ARGS)
{
	PG_RETURN_OID(GetOuterUserId());
}
