/*
 * maintenance.c: the periodic tasks that belong to other parts of the system, run by
 * relay 0 every wal_delivery.maintenance_interval.
 *
 * They need a process inside the server that runs on a clock, and the relay is the one
 * the extension always has; none of them ships anything. Each task is one SQL function,
 * named for the part that owns it, run in a short transaction of its own so a slow one
 * holds no lock over a pass.
 */
#include "postgres.h"

#include "postmaster/interrupt.h"

#include "maintenance.h"
#include "worker_spi.h"

typedef struct MaintenanceTask
{
	const char *owner; /* the part of the system whose task it is */
	const char *sql;   /* returns how many rows it handled */
	int batch;         /* > 0: run again while a run handles this many (more to do) */
} MaintenanceTask;

static const MaintenanceTask tasks[] = {
	/* processing (processing.sql): rows whose lease ran out go back, or die */
	{"processing", "SELECT wal_delivery.expire_processing_leases()", 0},
	/* retention (retention.sql): rows that reached an end state are removed */
	{"retention", "SELECT wal_delivery.purge_finished_rows(1000)", 1000},
	/* the log outbox (retention.sql): a shipped generation is truncated, the current sealed */
	{"log outbox", "SELECT wal_delivery.rotate_outbox_log()", 0},
};

/* One run of a task; how many rows it handled (0 while the extension is missing). */
static int64
run_task_once(const MaintenanceTask *task)
{
	int64 handled = 0;
	char activity[256];

	snprintf(activity, sizeof(activity), "wal_delivery maintenance for %s: %s", task->owner,
			 task->sql);
	if (worker_xact_begin_in_extension(activity))
	{
		bool isnull;

		spi_exec_or_fail(task->sql, 0, NULL, NULL);
		handled =
			DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	}
	worker_xact_end();
	return handled;
}

void
run_maintenance(void)
{
	for (int i = 0; i < (int) lengthof(tasks); i++)
	{
		const MaintenanceTask *task = &tasks[i];

		while (run_task_once(task) == task->batch && task->batch > 0 && !ShutdownRequestPending)
			;
	}
}
