/*
 * wal_delivery.c: the extension's entry point.
 *
 * _PG_init runs when the library is loaded. Loaded through shared_preload_libraries it
 * is also where later parts register background workers and shared memory; loaded any
 * other way (a plain CREATE EXTENSION on a server without the preload) it still defines
 * its settings so SQL functions work, and says what is missing.
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/guc.h"

#include "wal_delivery.h"

PG_MODULE_MAGIC;

PG_FUNCTION_INFO_V1(wal_delivery_library_version);

void
_PG_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		ereport(LOG,
				(errmsg("wal_delivery is loaded without shared_preload_libraries"),
				 errhint("Add wal_delivery to shared_preload_libraries and restart "
						 "the server so its background workers start.")));

	MarkGUCPrefixReserved("wal_delivery");
}

Datum
wal_delivery_library_version(PG_FUNCTION_ARGS)
{
	PG_RETURN_TEXT_P(cstring_to_text(WAL_DELIVERY_VERSION));
}
