/*
 * enqueue_check.c: the SQL door on the record contract (see enqueue_check.h).
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "mb/pg_wchar.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "enqueue_check.h"
#include "shared/record_contract.h"

PG_FUNCTION_INFO_V1(wal_delivery_check_record);
PG_FUNCTION_INFO_V1(wal_delivery_check_content_type);
PG_FUNCTION_INFO_V1(wal_delivery_record_limit);
PG_FUNCTION_INFO_V1(wal_delivery_reserved_header_names);
PG_FUNCTION_INFO_V1(wal_delivery_topic_name_problem);

/* A text value as the UTF-8 bytes the contract judges (and Kafka gets). */
static record_bytes
text_bytes(text *t)
{
	record_bytes b = {NULL, 0};
	char *data;
	int len;

	if (t == NULL)
		return b;
	data = VARDATA_ANY(t);
	len = VARSIZE_ANY_EXHDR(t);
	if (GetDatabaseEncoding() != PG_UTF8 && GetDatabaseEncoding() != PG_SQL_ASCII)
	{
		data = pg_server_to_any(data, len, PG_UTF8);
		len = strlen(data);
	}
	b.data = data;
	b.len = (size_t) len;
	return b;
}

/*
 * Fills headers from a JSON object of strings. False when the jsonb is not that shape;
 * then *shape_error says why (NULL: the object holds more headers than headers has room
 * for, which the contract refuses by count).
 */
static bool
jsonb_headers(Jsonb *jb, record_header *headers, int room, int *n, const char **shape_error,
			  char **bad_name, Jsonb **bad_value)
{
	JsonbIterator *it;
	JsonbValue v;
	JsonbIteratorToken tok;

	*n = 0;
	*shape_error = NULL;
	if (JB_ROOT_IS_SCALAR(jb) || !JB_ROOT_IS_OBJECT(jb))
	{
		*shape_error = "object";
		return false;
	}
	it = JsonbIteratorInit(&jb->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY)
		{
			if (*n == room)
				return true; /* counted by JB_ROOT_COUNT instead */
			headers[*n].name.data = v.val.string.val;
			headers[*n].name.len = (size_t) v.val.string.len;
		}
		else if (tok == WJB_VALUE)
		{
			if (v.type != jbvString)
			{
				*shape_error = "string";
				*bad_name = pnstrdup(headers[*n].name.data, headers[*n].name.len);
				*bad_value = JsonbValueToJsonb(&v);
				return false;
			}
			headers[*n].value.data = v.val.string.val;
			headers[*n].value.len = (size_t) v.val.string.len;
			(*n)++;
		}
	}
	return true;
}

/* The record's fields; headers must have room for RECORD_MAX_HEADERS + 1. */
static void
fields_of(record_fields *f, const char *topic, bytea *payload, text *ikey, text *mkey,
		  record_header *headers, int n_headers, int total_headers)
{
	memset(f, 0, sizeof(*f));
	f->topic.data = topic;
	f->topic.len = topic ? strlen(topic) : 0;
	if (payload != NULL)
	{
		f->payload.data = VARDATA_ANY(payload);
		f->payload.len = VARSIZE_ANY_EXHDR(payload);
	}
	f->idempotency_key = text_bytes(ikey);
	if (f->idempotency_key.data == NULL)
		f->idempotency_key.data = "";
	f->message_key = text_bytes(mkey);
	f->headers = headers;
	/* Over the limit: the contract refuses by count before it reads a header. */
	f->n_headers = total_headers > RECORD_MAX_HEADERS ? total_headers : n_headers;
}

bool
enqueue_record_surely_valid(const EnqueueRecord *record, int32 max_payload_bytes)
{
	record_header headers[RECORD_MAX_HEADERS + 1];
	record_fields f;
	record_problem p;
	int n = 0, total = 0;
	const char *shape;
	char *bad_name;
	Jsonb *bad_value;

	if (record->payload == NULL || record->idempotency_key == NULL)
		return false;
	if (record->headers != NULL)
	{
		total = JB_ROOT_IS_SCALAR(record->headers) ? 0 : JB_ROOT_COUNT(record->headers);
		if (total > RECORD_MAX_HEADERS ||
			!jsonb_headers(record->headers, headers, RECORD_MAX_HEADERS, &n, &shape, &bad_name,
						   &bad_value))
			return false;
	}
	fields_of(&f, NULL, record->payload, record->idempotency_key, record->message_key, headers, n,
			  total);
	return record_check(&f, record_limit(max_payload_bytes), &p);
}

static void
raise_problem(const char *prefix, const record_problem *p)
{
	ereport(ERROR, (errcode(MAKE_SQLSTATE(p->sqlstate[0], p->sqlstate[1], p->sqlstate[2],
										  p->sqlstate[3], p->sqlstate[4])),
					errmsg("%s%s", prefix, p->message), errhint("%s", p->hint)));
}

/*
 * wal_delivery.check_record(topic, max_payload_bytes, position, payload, idempotency_key,
 * key, headers): raises the contract's error for a record that breaks a rule. position is
 * the record's place in a batch (1 = first), NULL for wal_enqueue.
 */
Datum
wal_delivery_check_record(PG_FUNCTION_ARGS)
{
	char *topic = PG_ARGISNULL(0) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(0));
	int32 max_payload_bytes = PG_ARGISNULL(1) ? 0 : PG_GETARG_INT32(1);
	char prefix[64] = "";
	record_header headers[RECORD_MAX_HEADERS + 1];
	record_fields f;
	record_problem p;
	int n = 0, total = 0;

	if (!PG_ARGISNULL(2))
		snprintf(prefix, sizeof(prefix), "record %d of the batch: ", PG_GETARG_INT32(2));
	if (!PG_ARGISNULL(6))
	{
		Jsonb *jb = PG_GETARG_JSONB_P(6);
		const char *shape;
		char *bad_name = NULL;
		Jsonb *bad_value = NULL;

		total = JB_ROOT_IS_SCALAR(jb) || !JB_ROOT_IS_OBJECT(jb) ? 0 : JB_ROOT_COUNT(jb);
		if (!jsonb_headers(jb, headers, RECORD_MAX_HEADERS + 1, &n, &shape, &bad_name, &bad_value))
		{
			char *shown = shape[0] == 'o'
							  ? JsonbToCString(NULL, &jb->root, VARSIZE(jb))
							  : JsonbToCString(NULL, &bad_value->root, VARSIZE(bad_value));

			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 shape[0] == 'o'
						 ? errmsg("%sheaders must be a JSON object of strings, got %.200s", prefix,
								  shown)
						 : errmsg("%sheader \"%s\" must be a string, got %.200s", prefix, bad_name,
								  shown),
					 errhint("For example {\"trace-id\": \"abc\"}; put numbers in quotes.")));
		}
	}
	fields_of(&f, topic, PG_ARGISNULL(3) ? NULL : PG_GETARG_BYTEA_PP(3),
			  PG_ARGISNULL(4) ? NULL : PG_GETARG_TEXT_PP(4),
			  PG_ARGISNULL(5) ? NULL : PG_GETARG_TEXT_PP(5), headers, n, total);
	if (!record_check(&f, record_limit(max_payload_bytes), &p))
		raise_problem(prefix, &p);
	PG_RETURN_VOID();
}

/* wal_delivery.check_content_type(text): raises the contract's error for a bad one. */
Datum
wal_delivery_check_content_type(PG_FUNCTION_ARGS)
{
	record_fields f = {0};
	record_problem p;

	f.payload.data = "";
	f.idempotency_key.data = "k";
	f.idempotency_key.len = 1;
	f.content_type = PG_ARGISNULL(0) ? (record_bytes){"", 0} : text_bytes(PG_GETARG_TEXT_PP(0));
	if (!record_check(&f, INT64_MAX, &p))
		raise_problem("", &p);
	PG_RETURN_VOID();
}

/* wal_delivery.record_limit(max_payload_bytes) */
Datum
wal_delivery_record_limit(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT32((int32) record_limit(PG_GETARG_INT32(0)));
}

/* wal_delivery.reserved_header_names() */
Datum
wal_delivery_reserved_header_names(PG_FUNCTION_ARGS)
{
	Datum *names = palloc(sizeof(Datum) * record_n_reserved_headers);

	for (int i = 0; i < record_n_reserved_headers; i++)
		names[i] = CStringGetTextDatum(record_reserved_headers[i]);
	PG_RETURN_ARRAYTYPE_P(
		construct_array(names, record_n_reserved_headers, TEXTOID, -1, false, TYPALIGN_INT));
}

/* wal_delivery.topic_name_problem(name): why it is not a topic name, or NULL. */
Datum
wal_delivery_topic_name_problem(PG_FUNCTION_ARGS)
{
	text *name;
	const char *problem;

	if (PG_ARGISNULL(0))
		PG_RETURN_TEXT_P(cstring_to_text("it is NULL"));
	name = PG_GETARG_TEXT_PP(0);
	problem = record_topic_name_problem(VARDATA_ANY(name), VARSIZE_ANY_EXHDR(name));
	if (problem == NULL)
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(cstring_to_text(problem));
}
