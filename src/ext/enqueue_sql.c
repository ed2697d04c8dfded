/*
 * enqueue_sql.c: enqueue's SPI statements (see enqueue_sql.h). Each is prepared on its
 * first use in a backend and kept (SPI_keepplan), with a generic plan from the start: a
 * call of a function on parameters has nothing to choose, so planning it per call would
 * be waste. A kept plan is re-planned by Postgres itself when what it uses changes (a
 * dropped and recreated extension too).
 *
 * Each statement runs as the door's owner with search_path pinned, as a SECURITY DEFINER
 * function with SET search_path would, and only here: the door itself is SECURITY
 * INVOKER, since its C path needs neither (it reads and writes relations by oid, which
 * checks no privilege and resolves no name), and the definer's switch is a cost on every
 * call (bench/enqueue/instructions counts it).
 * A pinned search_path also means the kept plans are never re-planned for a caller's.
 */
#include "postgres.h"

#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

#include "enqueue_sql.h"

static SPIPlanPtr
keep_plan(const char *sql, int nargs, Oid *argtypes)
{
	SPIPlanPtr plan = SPI_prepare_cursor(sql, nargs, argtypes, CURSOR_OPT_GENERIC_PLAN);

	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for \"%s\": %s", sql, SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "SPI_keepplan failed");
	return plan;
}

/* The caller's user and GUC level, given back by spi_finish. */
typedef struct Caller
{
	Oid user;
	int security_context;
	int guc_nest_level;
} Caller;

static Oid
owner_of(Oid function)
{
	HeapTuple tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(function));
	Oid owner;

	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for function %u", function);
	owner = ((Form_pg_proc) GETSTRUCT(tuple))->proowner;
	ReleaseSysCache(tuple);
	return owner;
}

/*
 * Becomes the door's owner with search_path pinned, as fmgr does for SECURITY DEFINER
 * ... SET search_path; an error on the way out is undone by the (sub)transaction's abort,
 * as it is for such a function.
 */
static void
spi_connect(Oid door, Caller *caller)
{
	Oid owner = owner_of(door);

	GetUserIdAndSecContext(&caller->user, &caller->security_context);
	caller->guc_nest_level = NewGUCNestLevel();
	(void) set_config_option("search_path", "pg_catalog, pg_temp", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	SetUserIdAndSecContext(owner, caller->security_context | SECURITY_LOCAL_USERID_CHANGE);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
}

static void
spi_finish(const Caller *caller)
{
	SPI_finish();
	AtEOXact_GUC(true, caller->guc_nest_level);
	SetUserIdAndSecContext(caller->user, caller->security_context);
}

static Datum
nullable(void *p)
{
	return PointerGetDatum(p);
}

int64
enqueue_repeated_key_id(Oid door, text *topic, text *key, bytea *payload, text *content_type,
						text *message_key, Jsonb *headers)
{
	static SPIPlanPtr plan;
	Datum values[6] = {PointerGetDatum(topic),       PointerGetDatum(key),
					   PointerGetDatum(payload),     PointerGetDatum(content_type),
					   PointerGetDatum(message_key), PointerGetDatum(headers)};
	char nulls[6] = {' ', ' ', ' ', ' ', message_key ? ' ' : 'n', headers ? ' ' : 'n'};
	Caller caller;
	bool isnull;
	int64 id;

	spi_connect(door, &caller);
	if (plan == NULL)
	{
		Oid types[6] = {TEXTOID, TEXTOID, BYTEAOID, TEXTOID, TEXTOID, JSONBOID};

		plan = keep_plan("SELECT wal_delivery.repeated_key_id($1, $2, $3, $4, $5, $6)", 6, types);
	}
	if (SPI_execute_plan(plan, values, nulls, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "wal_delivery.repeated_key_id failed");
	id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	spi_finish(&caller);
	return id;
}

/* Runs a one-value SELECT; the value is copied out of SPI's memory. */
static Datum
select_one(const Caller *caller, SPIPlanPtr plan, Datum *values, const char *nulls, Oid type,
		   bool *isnull)
{
	int16 typlen;
	bool typbyval;
	Datum result;

	if (SPI_execute_plan(plan, values, nulls, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "enqueue's SQL path returned no row");
	result = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, isnull);
	get_typlenbyvalalign(type, &typlen, &typbyval, &(char){0});
	if (!*isnull)
		result = SPI_datumTransfer(result, typbyval, typlen);
	spi_finish(caller);
	return result;
}

Datum
enqueue_sql_one(Oid door, text *topic, bytea *payload, text *content_type, text *idempotency_key,
				text *message_key, Jsonb *headers, bool *isnull)
{
	static SPIPlanPtr plan;
	Datum values[6] = {nullable(topic),           nullable(payload),     nullable(content_type),
					   nullable(idempotency_key), nullable(message_key), nullable(headers)};
	char nulls[6];
	Caller caller;

	for (int i = 0; i < 6; i++)
		nulls[i] = DatumGetPointer(values[i]) == NULL ? 'n' : ' ';
	spi_connect(door, &caller);
	if (plan == NULL)
	{
		Oid types[6] = {TEXTOID, BYTEAOID, TEXTOID, TEXTOID, TEXTOID, JSONBOID};

		plan = keep_plan("SELECT wal_delivery.enqueue_payload($1, $2, $3, $4, $5, $6)", 6, types);
	}
	return select_one(&caller, plan, values, nulls, INT8OID, isnull);
}

Datum
enqueue_sql_batch(Oid door, PayloadKind kind, Datum *args, const bool *arg_nulls, bool *isnull)
{
	static SPIPlanPtr plans[3];
	static const char *const payloads_sql[3] = {
		[PAYLOAD_JSONB] = "wal_delivery.utf8_payloads($2::text[]), 'application/json'",
		[PAYLOAD_TEXT] = "wal_delivery.utf8_payloads($2), 'text/plain; charset=utf-8'",
		[PAYLOAD_BYTEA] = "$2, 'application/octet-stream'"};
	static const Oid payload_types[3] = {[PAYLOAD_JSONB] = JSONBARRAYOID,
										 [PAYLOAD_TEXT] = TEXTARRAYOID,
										 [PAYLOAD_BYTEA] = BYTEAARRAYOID};
	char nulls[5];
	Caller caller;

	for (int i = 0; i < 5; i++)
		nulls[i] = arg_nulls[i] ? 'n' : ' ';
	spi_connect(door, &caller);
	if (plans[kind] == NULL)
	{
		Oid types[5] = {TEXTOID, payload_types[kind], TEXTARRAYOID, TEXTARRAYOID, JSONBARRAYOID};

		plans[kind] =
			keep_plan(psprintf("SELECT wal_delivery.enqueue_payload_batch($1, %s, $3, $4, $5)",
							   payloads_sql[kind]),
					  5, types);
	}
	return select_one(&caller, plans[kind], args, nulls, INT8ARRAYOID, isnull);
}
