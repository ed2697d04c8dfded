/*
 * worker_spi.c: how the background workers run their statements: each pass or task in a short
 * transaction of its own, SPI for the statements, plans kept for the ones every pass runs,
 * and arrays for parameters, so one statement marks a whole batch.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "storage/lmgr.h"
#include "utils/array.h"
#include "utils/guc.h"
#include "utils/snapmgr.h"

#include "settings.h"
#include "worker_spi.h"

void
worker_connect(void)
{
	BackgroundWorkerInitializeConnection(wal_delivery_database, NULL, 0);
	/* Over the database's and the role's settings, as a SECURITY DEFINER's SET clause is. */
	SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_OVERRIDE);
}

void
worker_xact_begin(const char *activity)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, activity);
}

bool
worker_xact_begin_in_extension(const char *activity)
{
	Oid extension;

	worker_xact_begin(activity);
	extension = get_extension_oid("wal_delivery", true);
	if (!OidIsValid(extension))
		return false;
	/*
	 * DROP EXTENSION locks the extension before its tables; a pass that took table locks
	 * first, in another order, deadlocked with it. Once this lock is ours, the drop
	 * waits for the transaction, and a drop that went first has committed: look again.
	 */
	LockDatabaseObject(ExtensionRelationId, extension, 0, AccessShareLock);
	return get_extension_oid("wal_delivery", true) == extension;
}

void
worker_xact_end(void)
{
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
}

void
spi_exec_or_fail(const char *sql, int nargs, Oid *types, Datum *values)
{
	int rc = SPI_execute_with_args(sql, nargs, types, values, NULL, false, 0);

	if (rc < 0)
		elog(ERROR, "wal_delivery: SPI failed (%d) on: %s", rc, sql);
}

/*
 * Planning the statements every pass runs (the claim, and per lane its cursor, its batch
 * and the cursor's move) on every pass was most of an idle relay's CPU, since each commit
 * wakes a pass. The plan cache re-plans by itself after DDL on what they read (a TRUNCATE
 * of a generation, the extension dropped and created again).
 */
void
spi_exec_kept(SPIPlanPtr *plan, const char *sql, int nargs, Oid *types, Datum *values,
			  const char *nulls)
{
	int rc;

	if (*plan == NULL)
	{
		SPIPlanPtr p = SPI_prepare(sql, nargs, types);

		if (p == NULL)
			elog(ERROR, "wal_delivery: could not prepare (%s): %s",
				 SPI_result_code_string(SPI_result), sql);
		if (SPI_keepplan(p) != 0)
			elog(ERROR, "wal_delivery: could not keep the plan of: %s", sql);
		*plan = p;
	}
	rc = SPI_execute_plan(*plan, values, nulls, false, 0);
	if (rc < 0)
		elog(ERROR, "wal_delivery: SPI failed (%d) on: %s", rc, sql);
}

Datum
int8_array(int64 *values, int n)
{
	Datum *elems = palloc(sizeof(Datum) * Max(n, 1));

	for (int i = 0; i < n; i++)
		elems[i] = Int64GetDatum(values[i]);
	return PointerGetDatum(
		construct_array(elems, n, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
}

Datum
text_array(Datum *texts, int n)
{
	return PointerGetDatum(construct_array(texts, n, TEXTOID, -1, false, TYPALIGN_INT));
}
