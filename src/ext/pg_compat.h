/*
 * pg_compat.h: what differs between the Postgres major versions the extension builds
 * for (15, Debian 12's, to 17), in one place: one wrapper per difference, each with what
 * changed, in which version, and why the wrapper's choice is right for wal_delivery.
 * The other files call the wrappers and never test PG_VERSION_NUM themselves.
 */
#ifndef PG_COMPAT_H
#define PG_COMPAT_H

#include "postgres.h"

#include "executor/executor.h"

#if PG_VERSION_NUM < 150000
#error "wal_delivery needs Postgres 15 or later"
#endif

/*
 * ExecInsertIndexTuples: Postgres 16 added a last argument, onlySummarizing (insert into
 * the summarizing indexes, BRIN, alone: for a HOT update that changed no other index's
 * columns). The log writer inserts new rows, never HOT updates, so every index gets its
 * entry: false, which is what 15 did.
 */
static inline List *
compat_ExecInsertIndexTuples(ResultRelInfo *rri, TupleTableSlot *slot, EState *estate, bool update,
							 bool noDupErr, bool *specConflict, List *arbiterIndexes)
{
#if PG_VERSION_NUM >= 160000
	return ExecInsertIndexTuples(rri, slot, estate, update, noDupErr, specConflict, arbiterIndexes,
								 false);
#else
	return ExecInsertIndexTuples(rri, slot, estate, update, noDupErr, specConflict, arbiterIndexes);
#endif
}

/*
 * appendBinaryStringInfo's data: Postgres 16 made it const void * (it was const char *).
 * The extension only calls it; fuzz/pg_stubs.c, which defines it for the fuzz targets,
 * declares its parameter with this type so that it matches the server's header.
 */
#if PG_VERSION_NUM >= 160000
typedef const void *compat_binary_data;
#else
typedef const char *compat_binary_data;
#endif

/*
 * get_guc_variables: Postgres 16 moved the settings into a hash table and made this
 * return a palloc'd array sorted by name, with its length through the argument (15 returns
 * its own array, and GetNumConfigOptions its length). Callers pfree the array on 16 and
 * later only (compat_free_guc_variables).
 */
#include "utils/guc_tables.h"

static inline struct config_generic **
compat_get_guc_variables(int *num_vars)
{
#if PG_VERSION_NUM >= 160000
	return get_guc_variables(num_vars);
#else
	*num_vars = GetNumConfigOptions();
	return get_guc_variables();
#endif
}

static inline void
compat_free_guc_variables(struct config_generic **vars)
{
#if PG_VERSION_NUM >= 160000
	pfree(vars);
#else
	(void) vars;
#endif
}

#endif /* PG_COMPAT_H */
