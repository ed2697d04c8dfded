/*
 * bgworkers.c: registering the extension's background workers with the postmaster.
 *
 * The workers are found by name (bgw_function_name) in this library, so registering them
 * needs none of their code: the relay and the reconciler depend on nothing here.
 */
#include "postgres.h"

#include "miscadmin.h"
#include "postmaster/bgworker.h"

#include "bgworkers.h"
#include "settings.h"

/*
 * One background worker: connected to a database, started once recovery is over,
 * restarted 5 s after it exits with code 1 or crashes.
 */
static void
register_worker(const char *function, const char *name, const char *type, int arg)
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

void
register_background_workers(void)
{
	for (int i = 0; i < wal_delivery_relay_workers; i++)
	{
		char name[BGW_MAXLEN];

		snprintf(name, sizeof(name), "wal_delivery relay %d", i);
		register_worker("wal_delivery_relay_main", name, "wal_delivery relay", i);
	}
	/* Without a relay nothing ships, so there is nothing to create topics for. */
	if (wal_delivery_relay_workers > 0)
		register_worker("wal_delivery_reconcile_main", "wal_delivery reconciler",
						"wal_delivery reconciler", 0);
}
