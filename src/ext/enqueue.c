/*
 * enqueue.c: the door (wal_enqueue, wal_enqueue_batch) in C.
 *
 * Why C: the PL/pgSQL door cost an application's transaction much of the throughput of a
 * plain INSERT of the same row (bench/enqueue compares the two): a PL/pgSQL call per
 * level, a query each for the topic, the generation and the key, and the record's rules
 * checked in PL/pgSQL. Here a record of a topic without a processor costs the topic and
 * generation from a per-backend cache (enqueue_cache.c), a key's reads through indexes
 * (enqueue_lookup.c), a check in C (enqueue_check.c) and a heap insert with its index
 * inserts (log_writer.c).
 *
 * Everything else goes the SQL path, unchanged: wal_delivery.enqueue_payload(_batch), as
 * the SQL door called it. That is a topic with a processor (the row table and its state
 * machine), and any call that is not surely valid: a missing topic, a NULL payload, a
 * record that may break a rule, arrays that do not line up. The SQL path raises the same
 * errors with the same SQLSTATEs as before, from one place.
 *
 * Rights: the door is SECURITY INVOKER. Its C path opens the extension's relations by oid,
 * which checks no privilege and looks up no name; only the SQL path runs as the door's
 * owner with search_path pinned (enqueue_sql.c). A writer may still call nothing but the
 * door: it has no privilege on the extension's tables or other functions.
 *
 * Visibility: each call reads under a new snapshot after a command counter increment,
 * as the PL/pgSQL statements it replaces did (a record enqueued earlier in the same
 * statement or transaction is found by its key).
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "fmgr.h"
#include "mb/pg_wchar.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"

#include "enqueue_cache.h"
#include "enqueue_check.h"
#include "enqueue_sql.h"
#include "enqueue_lookup.h"
#include "enqueue_trace.h"
#include "log_writer.h"

PG_FUNCTION_INFO_V1(wal_delivery_enqueue_jsonb);
PG_FUNCTION_INFO_V1(wal_delivery_enqueue_bytea);
PG_FUNCTION_INFO_V1(wal_delivery_enqueue_text);
PG_FUNCTION_INFO_V1(wal_delivery_enqueue_batch_jsonb);
PG_FUNCTION_INFO_V1(wal_delivery_enqueue_batch_bytea);
PG_FUNCTION_INFO_V1(wal_delivery_enqueue_batch_text);

static const char *const content_types[] = {[PAYLOAD_JSONB] = "application/json",
											[PAYLOAD_TEXT] = "text/plain; charset=utf-8",
											[PAYLOAD_BYTEA] = "application/octet-stream"};

/* convert_to(s, 'UTF8') as bytea. */
static bytea *
utf8_bytea(const char *s, int len)
{
	const char *utf8 = pg_server_to_any(s, len, PG_UTF8);
	int utf8_len = utf8 == s ? len : (int) strlen(utf8);
	bytea *result = palloc(VARHDRSZ + utf8_len);

	SET_VARSIZE(result, VARHDRSZ + utf8_len);
	memcpy(VARDATA(result), utf8, utf8_len);
	return result;
}

/* A payload argument as the bytes stored (the SQL door's convert_to). */
static bytea *
payload_bytes(PayloadKind kind, Datum value)
{
	if (kind == PAYLOAD_JSONB)
	{
		Jsonb *jb = DatumGetJsonbP(value);
		char *s = JsonbToCString(NULL, &jb->root, VARSIZE(jb));

		return utf8_bytea(s, strlen(s));
	}
	if (kind == PAYLOAD_TEXT)
	{
		text *t = DatumGetTextPP(value);

		return utf8_bytea(VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t));
	}
	return DatumGetByteaPP(value);
}

/* gen_random_uuid()::text: a version 4 UUID from the strong random source. */
static text *
generated_key(void)
{
	uint8 b[16];
	char s[37];
	int o = 0;

	if (!pg_strong_random(b, sizeof(b)))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR), errmsg("could not generate random values")));
	b[6] = (b[6] & 0x0f) | 0x40;
	b[8] = (b[8] & 0x3f) | 0x80;
	for (int i = 0; i < 16; i++)
	{
		if (i == 4 || i == 6 || i == 8 || i == 10)
			s[o++] = '-';
		o += sprintf(s + o, "%02x", b[i]);
	}
	return cstring_to_text_with_len(s, 36);
}

/* The door runs as its caller (see enqueue_sql.c): the sequence is the extension's own. */
static int64
next_outbox_id(void)
{
	return nextval_internal(enqueue_relation_oid("outbox_ids"), false);
}

/* The fresh snapshot each call reads under (see the file comment). */
static void
begin_reads(void)
{
	CommandCounterIncrement();
	PushActiveSnapshot(GetTransactionSnapshot());
}

/* Where the C path may take a topic's records: into generation *gen of the log. */
static bool
log_topic(text *topic, EnqueueTopic *t, int *gen)
{
	if (!enqueue_cached_topic(topic, t) || t->has_processor || t->has_writers)
		return false;
	*gen = enqueue_cached_generation();
	return *gen >= 0;
}

/* One record into the log, as enqueue_payload does; false: the SQL path must take it. */
static bool
enqueue_log_record(Oid door, text *topic, bytea *payload, text *content_type, text *caller_key,
				   text *message_key, Jsonb *headers, int64 *id)
{
	EnqueueTopic t;
	int gen;
	EnqueueRecord record = {payload, caller_key, caller_key != NULL, message_key, headers};
	LogRecord row;
	LogWriter *writer;
	bool inserted;

	if (!log_topic(topic, &t, &gen))
		return false;
	if (record.idempotency_key == NULL)
		record.idempotency_key = generated_key();
	if (!enqueue_record_surely_valid(&record, t.max_payload_bytes))
		return false;
	/*
	 * The first enqueue of a key wins; a repeat wakes nobody. The current generation is
	 * left to the insert's ON CONFLICT (a repeat of a key it holds costs a killed tuple).
	 */
	if (caller_key != NULL)
	{
		KeyLookup *lookup = enqueue_key_lookup_begin(gen);
		bool seen = enqueue_key_lookup(lookup, topic, caller_key, id);

		enqueue_key_lookup_end(lookup);
		if (seen)
		{
			/* A retry of the same record, or the 23W01 error of a different one. */
			*id = enqueue_repeated_key_id(door, topic, caller_key, payload, content_type,
										  message_key, headers);
			return true;
		}
	}

	row.id = next_outbox_id();
	row.caller_key = caller_key != NULL;
	row.topic = topic;
	row.idempotency_key = record.idempotency_key;
	row.message_key = message_key;
	row.content_type = content_type;
	row.headers = headers;
	row.payload = payload;
	writer = log_writer_open(gen);
	inserted = log_writer_insert(writer, &row);
	log_writer_close(writer);
	if (!inserted)
	{
		/* An earlier or concurrent enqueue of the key (or an invisible one: 40001). */
		*id = enqueue_repeated_key_id(door, topic, caller_key, payload, content_type, message_key,
									  headers);
		return true;
	}
	*id = row.id;
	return true;
}

static Datum
enqueue_one(FunctionCallInfo fcinfo, PayloadKind kind)
{
	text *topic = PG_ARGISNULL(0) ? NULL : PG_GETARG_TEXT_PP(0);
	bytea *payload = PG_ARGISNULL(1) ? NULL : payload_bytes(kind, PG_GETARG_DATUM(1));
	text *caller_key = PG_ARGISNULL(2) ? NULL : PG_GETARG_TEXT_PP(2);
	text *message_key = PG_ARGISNULL(3) ? NULL : PG_GETARG_TEXT_PP(3);
	Jsonb *headers = PG_ARGISNULL(4) ? NULL : PG_GETARG_JSONB_P(4);
	text *content_type = cstring_to_text(content_types[kind]);
	bool isnull;
	Datum id;

	/* Before either path: both store, check and compare the headers the record will have. */
	if (enqueue_trace_set())
		headers = enqueue_trace_headers(headers);

	if (topic != NULL && payload != NULL)
	{
		int64 log_id;
		bool taken;

		begin_reads();
		taken = enqueue_log_record(fcinfo->flinfo->fn_oid, topic, payload, content_type, caller_key,
								   message_key, headers, &log_id);
		PopActiveSnapshot();
		if (taken)
			PG_RETURN_INT64(log_id);
	}
	id = enqueue_sql_one(fcinfo->flinfo->fn_oid, topic, payload, content_type, caller_key,
						 message_key, headers, &isnull);
	if (isnull)
		PG_RETURN_NULL();
	return id;
}

Datum
wal_delivery_enqueue_jsonb(PG_FUNCTION_ARGS)
{
	return enqueue_one(fcinfo, PAYLOAD_JSONB);
}

Datum
wal_delivery_enqueue_bytea(PG_FUNCTION_ARGS)
{
	return enqueue_one(fcinfo, PAYLOAD_BYTEA);
}

Datum
wal_delivery_enqueue_text(PG_FUNCTION_ARGS)
{
	return enqueue_one(fcinfo, PAYLOAD_TEXT);
}

/* A batch argument's elements in order (bounds ignored); false if it has 2+ dimensions. */
typedef struct BatchArray
{
	bool given; /* the argument was not NULL */
	int n;
	Datum *values;
	bool *nulls;
} BatchArray;

static bool
batch_array(Datum arg, bool arg_null, Oid element_type, BatchArray *out)
{
	ArrayType *a;
	int16 typlen;
	bool typbyval;
	char typalign;

	memset(out, 0, sizeof(*out));
	if (arg_null)
		return true;
	a = DatumGetArrayTypeP(arg);
	if (ARR_NDIM(a) > 1)
		return false;
	get_typlenbyvalalign(element_type, &typlen, &typbyval, &typalign);
	deconstruct_array(a, element_type, typlen, typbyval, typalign, &out->values, &out->nulls,
					  &out->n);
	out->given = true;
	return true;
}

/* wal_enqueue_batch's result: the ids in input order. */
static ArrayType *
batch_ids(int n, const int64 *ids)
{
	Datum *values = palloc(sizeof(Datum) * (n + 1));

	for (int i = 0; i < n; i++)
		values[i] = Int64GetDatum(ids[i]);
	return construct_array(values, n, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE);
}

/*
 * A batch of records of one topic into the log, as enqueue_payload_batch does; NULL: the
 * SQL path must take it. Its arguments' shapes are checked by the caller.
 */
static ArrayType *
enqueue_log_batch(Oid door, text *topic, PayloadKind kind, const BatchArray *payloads,
				  const BatchArray *caller_keys, const BatchArray *message_keys,
				  const BatchArray *headers)
{
	int n = payloads->n;
	EnqueueTopic t;
	int gen;
	text *content_type = cstring_to_text(content_types[kind]);
	LogRecord *rows = palloc(sizeof(LogRecord) * (n + 1));
	int64 *ids = palloc(sizeof(int64) * (n + 1));
	bool *found = palloc0(sizeof(bool) * (n + 1));
	bool *inserted = palloc0(sizeof(bool) * (n + 1));
	KeyLookup *lookup;

	if (!log_topic(topic, &t, &gen))
		return NULL;
	for (int i = 0; i < n; i++)
	{
		LogRecord *row = &rows[i];
		EnqueueRecord record;

		if (payloads->nulls[i])
			return NULL;
		row->caller_key = caller_keys->given && !caller_keys->nulls[i];
		row->topic = topic;
		row->idempotency_key =
			row->caller_key ? DatumGetTextPP(caller_keys->values[i]) : generated_key();
		row->message_key = !message_keys->given || message_keys->nulls[i]
							   ? NULL
							   : DatumGetTextPP(message_keys->values[i]);
		row->content_type = content_type;
		row->headers =
			!headers->given || headers->nulls[i] ? NULL : DatumGetJsonbP(headers->values[i]);
		row->payload = payload_bytes(kind, payloads->values[i]);
		record.payload = row->payload;
		record.idempotency_key = row->idempotency_key;
		record.caller_key = row->caller_key;
		record.message_key = row->message_key;
		record.headers = row->headers;
		if (!enqueue_record_surely_valid(&record, t.max_payload_bytes))
			return NULL;
	}

	/*
	 * In input order, a key seen before keeps its record and takes no id; the writer's
	 * ON CONFLICT check finds a key in the current generation, this batch's included.
	 */
	lookup = enqueue_key_lookup_begin(gen);
	if (n > 0)
	{
		LogWriter *writer = log_writer_open(gen);

		for (int i = 0; i < n; i++)
		{
			found[i] = rows[i].caller_key &&
					   enqueue_key_lookup(lookup, topic, rows[i].idempotency_key, &ids[i]);
			if (found[i])
				continue;
			rows[i].id = ids[i] = next_outbox_id();
			inserted[i] = log_writer_insert(writer, &rows[i]);
		}
		log_writer_close(writer);
	}
	enqueue_key_lookup_end(lookup);

	/*
	 * A caller's key seen before, or whose insert was skipped (a record of this batch or a
	 * concurrent one): the id of the record it names, if it is this record (a retry).
	 */
	for (int i = 0; i < n; i++)
		if (rows[i].caller_key && (found[i] || !inserted[i]))
			ids[i] = enqueue_repeated_key_id(door, topic, rows[i].idempotency_key, rows[i].payload,
											 content_type, rows[i].message_key, rows[i].headers);
	return batch_ids(n, ids);
}

/*
 * The headers argument with the session's trace context in each record's headers (see
 * enqueue_trace.h): one element per payload. Arguments of the wrong shape are left as
 * they are, for the SQL path to refuse.
 */
static void
batch_trace_headers(FunctionCallInfo fcinfo, Oid payload_type, Datum *arg, bool *arg_null)
{
	BatchArray payloads, headers;
	Datum *values;

	if (PG_ARGISNULL(1) || !batch_array(PG_GETARG_DATUM(1), false, payload_type, &payloads) ||
		!batch_array(*arg, *arg_null, JSONBOID, &headers) ||
		(headers.given && headers.n != payloads.n))
		return;
	values = palloc(sizeof(Datum) * (payloads.n + 1));
	for (int i = 0; i < payloads.n; i++)
		values[i] = JsonbPGetDatum(enqueue_trace_headers(
			headers.given && !headers.nulls[i] ? DatumGetJsonbP(headers.values[i]) : NULL));
	*arg = PointerGetDatum(construct_array(values, payloads.n, JSONBOID, -1, false, TYPALIGN_INT));
	*arg_null = false;
}

static Datum
enqueue_batch(FunctionCallInfo fcinfo, PayloadKind kind)
{
	static const Oid payload_types[] = {
		[PAYLOAD_JSONB] = JSONBOID, [PAYLOAD_TEXT] = TEXTOID, [PAYLOAD_BYTEA] = BYTEAOID};
	BatchArray payloads, caller_keys, message_keys, headers;
	Datum args[5];
	bool nulls[5];
	bool isnull;
	Datum ids;

	for (int i = 0; i < 5; i++)
	{
		args[i] = PG_ARGISNULL(i) ? (Datum) 0 : PG_GETARG_DATUM(i);
		nulls[i] = PG_ARGISNULL(i);
	}
	if (enqueue_trace_set())
		batch_trace_headers(fcinfo, payload_types[kind], &args[4], &nulls[4]);
	if (!PG_ARGISNULL(0) && !PG_ARGISNULL(1) &&
		batch_array(args[1], false, payload_types[kind], &payloads) &&
		batch_array(args[2], nulls[2], TEXTOID, &caller_keys) &&
		batch_array(args[3], nulls[3], TEXTOID, &message_keys) &&
		batch_array(args[4], nulls[4], JSONBOID, &headers) &&
		(!caller_keys.given || caller_keys.n == payloads.n) &&
		(!message_keys.given || message_keys.n == payloads.n) &&
		(!headers.given || headers.n == payloads.n))
	{
		ArrayType *result;

		begin_reads();
		result = enqueue_log_batch(fcinfo->flinfo->fn_oid, PG_GETARG_TEXT_PP(0), kind, &payloads,
								   &caller_keys, &message_keys, &headers);
		PopActiveSnapshot();
		if (result != NULL)
			PG_RETURN_ARRAYTYPE_P(result);
	}
	ids = enqueue_sql_batch(fcinfo->flinfo->fn_oid, kind, args, nulls, &isnull);
	if (isnull)
		PG_RETURN_NULL();
	return ids;
}

Datum
wal_delivery_enqueue_batch_jsonb(PG_FUNCTION_ARGS)
{
	return enqueue_batch(fcinfo, PAYLOAD_JSONB);
}

Datum
wal_delivery_enqueue_batch_bytea(PG_FUNCTION_ARGS)
{
	return enqueue_batch(fcinfo, PAYLOAD_BYTEA);
}

Datum
wal_delivery_enqueue_batch_text(PG_FUNCTION_ARGS)
{
	return enqueue_batch(fcinfo, PAYLOAD_TEXT);
}
