/*
 * enqueue_insert.c: enqueue's SPI statements (see enqueue_insert.h). Each is prepared on
 * its first use in a backend and kept (SPI_keepplan), with a generic plan from the start:
 * an insert of parameters has nothing to choose, so planning it per call would be waste.
 * A kept plan is re-planned by Postgres itself when a table it uses changes (a dropped
 * and recreated extension too). The door functions pin search_path, so the plans are
 * never re-planned for a caller's search_path.
 *
 * Records go straight into their generation's partition (outbox_log_<gen>): the caller
 * knows the generation, and tuple routing through outbox_log cost a partition lookup
 * and its setup on every statement.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "enqueue_insert.h"

#define LOG_GENERATIONS 3
#define LOG_COLUMNS                                                                                \
	"(gen, lane, caller_key, id, enqueued_by, enqueued_by_session, topic, idempotency_key, "       \
	"message_key, content_type, headers, payload)"
/* Only records with a caller's key can meet the dedupe index (it is partial). */
#define ON_KEY_CONFLICT " ON CONFLICT (gen, topic, idempotency_key) WHERE caller_key DO NOTHING"

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

static void
spi_connect(void)
{
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
}

static Datum
nullable(void *p)
{
	return PointerGetDatum(p);
}

bool
enqueue_insert_log_record(int gen, const LogRecord *r)
{
	static SPIPlanPtr plans[LOG_GENERATIONS][2];
	SPIPlanPtr *plan = &plans[gen][r->caller_key ? 1 : 0];
	Datum values[10];
	char nulls[10];
	int ret;
	bool inserted;

	Assert(gen >= 0 && gen < LOG_GENERATIONS);
	spi_connect();
	if (*plan == NULL)
	{
		Oid types[10] = {INT2OID, INT8OID, OIDOID,  OIDOID,   TEXTOID,
						 TEXTOID, TEXTOID, TEXTOID, JSONBOID, BYTEAOID};

		*plan = keep_plan(psprintf("INSERT INTO wal_delivery.outbox_log_%d " LOG_COLUMNS
								   " VALUES (%d, $1, %s, $2, $3, $4, $5, $6, $7, $8, $9, $10)%s",
								   gen, gen, r->caller_key ? "true" : "false",
								   r->caller_key ? ON_KEY_CONFLICT " RETURNING id" : ""),
						  10, types);
	}
	values[0] = Int16GetDatum((int16) (r->id % 8));
	values[1] = Int64GetDatum(r->id);
	values[2] = ObjectIdGetDatum(GetOuterUserId());
	values[3] = ObjectIdGetDatum(GetSessionUserId());
	values[4] = PointerGetDatum(r->topic);
	values[5] = PointerGetDatum(r->idempotency_key);
	values[6] = nullable(r->message_key);
	values[7] = PointerGetDatum(r->content_type);
	values[8] = nullable(r->headers);
	values[9] = PointerGetDatum(r->payload);
	memset(nulls, ' ', sizeof(nulls));
	nulls[6] = r->message_key == NULL ? 'n' : ' ';
	nulls[8] = r->headers == NULL ? 'n' : ' ';
	ret = SPI_execute_plan(*plan, values, nulls, false, 0);
	if (ret != SPI_OK_INSERT && ret != SPI_OK_INSERT_RETURNING)
		elog(ERROR, "inserting into the outbox log failed: %s", SPI_result_code_string(ret));
	inserted = SPI_processed == 1;
	SPI_finish();
	return inserted;
}

static Datum
array_of(int n, Datum *values, const bool *nulls, Oid type)
{
	int16 typlen;
	bool typbyval;
	char typalign;
	int dims[1] = {n};
	int lbs[1] = {1};

	get_typlenbyvalalign(type, &typlen, &typbyval, &typalign);
	return PointerGetDatum(
		construct_md_array(values, (bool *) nulls, 1, dims, lbs, type, typlen, typbyval, typalign));
}

static int
compare_int64(const void *a, const void *b)
{
	int64 x = *(const int64 *) a, y = *(const int64 *) b;

	return x < y ? -1 : x > y;
}

void
enqueue_insert_log_batch(int gen, int n, const int64 *ids, const bool *ids_nulls,
						 const bool *caller_keys, text *topic, Datum *idempotency_keys,
						 Datum *message_keys, const bool *message_key_nulls, text *content_type,
						 Datum *headers, const bool *headers_nulls, Datum *payloads, bool *inserted)
{
	static SPIPlanPtr plans[LOG_GENERATIONS][2];
	bool any_caller_key = false;
	SPIPlanPtr *plan;
	Datum values[10];
	Datum *id_values = palloc(sizeof(Datum) * n);
	Datum *caller_values = palloc(sizeof(Datum) * n);
	int64 *returned;
	int ret;

	Assert(gen >= 0 && gen < LOG_GENERATIONS);
	for (int i = 0; i < n; i++)
	{
		id_values[i] = Int64GetDatum(ids[i]);
		caller_values[i] = BoolGetDatum(caller_keys[i]);
		any_caller_key |= caller_keys[i] && !ids_nulls[i];
	}
	plan = &plans[gen][any_caller_key ? 1 : 0];
	values[0] = ObjectIdGetDatum(GetOuterUserId());
	values[1] = ObjectIdGetDatum(GetSessionUserId());
	values[2] = PointerGetDatum(topic);
	values[3] = PointerGetDatum(content_type);
	values[4] = array_of(n, id_values, ids_nulls, INT8OID);
	values[5] = array_of(n, caller_values, NULL, BOOLOID);
	values[6] = array_of(n, idempotency_keys, NULL, TEXTOID);
	values[7] = array_of(n, message_keys, message_key_nulls, TEXTOID);
	values[8] = array_of(n, headers, headers_nulls, JSONBOID);
	values[9] = array_of(n, payloads, NULL, BYTEAOID);

	spi_connect();
	if (*plan == NULL)
	{
		Oid types[10] = {OIDOID,       OIDOID,       TEXTOID,      TEXTOID,       INT8ARRAYOID,
						 BOOLARRAYOID, TEXTARRAYOID, TEXTARRAYOID, JSONBARRAYOID, BYTEAARRAYOID};

		*plan = keep_plan(
			psprintf("INSERT INTO wal_delivery.outbox_log_%d " LOG_COLUMNS
					 " SELECT %d, (u.id %% 8)::smallint, u.caller_key, u.id, $1, $2, $3, u.ikey,"
					 " u.mkey, $4, u.headers, u.payload"
					 " FROM unnest($5, $6, $7, $8, $9, $10) WITH ORDINALITY"
					 " AS u(id, caller_key, ikey, mkey, headers, payload, i)"
					 " WHERE u.id IS NOT NULL ORDER BY u.i%s RETURNING id",
					 gen, gen, any_caller_key ? ON_KEY_CONFLICT : ""),
			10, types);
	}
	ret = SPI_execute_plan(*plan, values, NULL, false, 0);
	if (ret != SPI_OK_INSERT_RETURNING)
		elog(ERROR, "inserting into the outbox log failed: %s", SPI_result_code_string(ret));

	returned = palloc(sizeof(int64) * (SPI_processed + 1));
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		bool isnull;

		returned[r] =
			DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 1, &isnull));
	}
	qsort(returned, SPI_processed, sizeof(int64), compare_int64);
	for (int i = 0; i < n; i++)
		inserted[i] = !ids_nulls[i] && bsearch(&ids[i], returned, SPI_processed, sizeof(int64),
											   compare_int64) != NULL;
	SPI_finish();
}

int64
enqueue_repeated_key_id(text *topic, text *key)
{
	static SPIPlanPtr plan;
	Datum values[2] = {PointerGetDatum(topic), PointerGetDatum(key)};
	bool isnull;
	int64 id;

	spi_connect();
	if (plan == NULL)
	{
		Oid types[2] = {TEXTOID, TEXTOID};

		plan = keep_plan("SELECT wal_delivery.repeated_key_id($1, $2)", 2, types);
	}
	if (SPI_execute_plan(plan, values, NULL, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "wal_delivery.repeated_key_id failed");
	id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();
	return id;
}

/* Runs a one-value SELECT; the value is copied out of SPI's memory. */
static Datum
select_one(SPIPlanPtr plan, Datum *values, const char *nulls, Oid type, bool *isnull)
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
	SPI_finish();
	return result;
}

Datum
enqueue_sql_one(text *topic, bytea *payload, text *content_type, text *idempotency_key,
				text *message_key, Jsonb *headers, bool *isnull)
{
	static SPIPlanPtr plan;
	Datum values[6] = {nullable(topic),           nullable(payload),     nullable(content_type),
					   nullable(idempotency_key), nullable(message_key), nullable(headers)};
	char nulls[6];

	for (int i = 0; i < 6; i++)
		nulls[i] = DatumGetPointer(values[i]) == NULL ? 'n' : ' ';
	spi_connect();
	if (plan == NULL)
	{
		Oid types[6] = {TEXTOID, BYTEAOID, TEXTOID, TEXTOID, TEXTOID, JSONBOID};

		plan = keep_plan("SELECT wal_delivery.enqueue_payload($1, $2, $3, $4, $5, $6)", 6, types);
	}
	return select_one(plan, values, nulls, INT8OID, isnull);
}

Datum
enqueue_sql_batch(PayloadKind kind, Datum *args, const bool *arg_nulls, bool *isnull)
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

	for (int i = 0; i < 5; i++)
		nulls[i] = arg_nulls[i] ? 'n' : ' ';
	spi_connect();
	if (plans[kind] == NULL)
	{
		Oid types[5] = {TEXTOID, payload_types[kind], TEXTARRAYOID, TEXTARRAYOID, JSONBARRAYOID};

		plans[kind] =
			keep_plan(psprintf("SELECT wal_delivery.enqueue_payload_batch($1, %s, $3, $4, $5)",
							   payloads_sql[kind]),
					  5, types);
	}
	return select_one(plans[kind], args, nulls, INT8ARRAYOID, isnull);
}
