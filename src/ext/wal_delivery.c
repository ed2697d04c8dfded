/*
 * wal_delivery.c: the extension's entry point and its settings.
 *
 * _PG_init runs when the library is loaded. Loaded through shared_preload_libraries it
 * also reserves shared memory and registers the relay background workers; loaded any
 * other way (a CREATE EXTENSION on a server without the preload) it still defines its
 * settings so SQL functions work, and says in the log what is missing.
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "utils/builtins.h"
#include "utils/guc.h"

#include "reconcile.h"
#include "relay.h"
#include "relay_wakeup.h"
#include "wal_delivery.h"

PG_MODULE_MAGIC;

PG_FUNCTION_INFO_V1(wal_delivery_library_version);
PG_FUNCTION_INFO_V1(wal_delivery_invoking_role);

/* wal_delivery.force_delete: lets DELETE of a topic or destination drop undelivered rows. */
bool wal_delivery_force_delete = false;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static void
wal_delivery_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	relay_wakeup_request_shmem();
}

static void
wal_delivery_shmem_startup(void)
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	relay_wakeup_init_shmem();
}

static void
define_settings(void)
{
	DefineCustomBoolVariable(
		"wal_delivery.force_delete",
		"Allows deleting a topic or destination that still has undelivered records.",
		"The undelivered records of a deleted topic are removed with it. Set it only for "
		"the transaction that deletes (SET LOCAL).",
		&wal_delivery_force_delete, false, PGC_USERSET, 0, NULL, NULL, NULL);
	define_relay_settings();
	define_reconcile_settings();
	MarkGUCPrefixReserved("wal_delivery");
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
	register_relay_workers();
	if (wal_delivery_relay_workers > 0)
		register_reconcile_worker();
}

/*
 * Registers one of the extension's background workers: connected to a database, started
 * once recovery is over, restarted 5 s after it exits with code 1 or crashes.
 */
void
register_wal_delivery_worker(const char *function, const char *name, const char *type, int arg)
{
	BackgroundWorker worker;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 5;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "wal_delivery");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "%s", function);
	snprintf(worker.bgw_name, BGW_MAXLEN, "%s", name);
	snprintf(worker.bgw_type, BGW_MAXLEN, "%s", type);
	worker.bgw_main_arg = Int32GetDatum(arg);
	RegisterBackgroundWorker(&worker);
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
