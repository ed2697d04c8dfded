/*
 * worker_spi.h: how the background workers run their statements (worker_spi.c).
 */
#ifndef WORKER_SPI_H
#define WORKER_SPI_H

#include "postgres.h"

#include "executor/spi.h"

/*
 * Connects the background worker to wal_delivery.database with search_path pinned to
 * pg_catalog, pg_temp: the workers run as a superuser, and the database's owner, who
 * need not be one, may set the database's search_path (ALTER DATABASE ... SET) to a
 * schema whose functions would then run for every unqualified name the workers use.
 */
void worker_connect(void);

/*
 * A short transaction with SPI connected and a snapshot pushed; activity is what
 * pg_stat_activity shows meanwhile. worker_xact_end commits it and shows idle.
 */
void worker_xact_begin(const char *activity);

/*
 * worker_xact_begin, then whether wal_delivery is installed, holding a lock on the
 * extension that makes a concurrent DROP EXTENSION wait for this transaction instead
 * of deadlocking with it. Every transaction that reads wal_delivery's tables begins so.
 */
bool worker_xact_begin_in_extension(const char *activity);
void worker_xact_end(void);

/* Runs sql once; an SPI failure is an ERROR that names the statement. */
void spi_exec_or_fail(const char *sql, int nargs, Oid *types, Datum *values);

/*
 * Runs sql through a plan kept for the session in *plan (prepared on first use);
 * nulls as SPI_execute_plan's.
 */
void spi_exec_kept(SPIPlanPtr *plan, const char *sql, int nargs, Oid *types, Datum *values,
				   const char *nulls);

/* Parameters: an int8[] of n values, a text[] of n text datums. */
Datum int8_array(int64 *values, int n);
Datum text_array(Datum *texts, int n);

#endif
