/*
 * enqueue_trace.c: the session's trace context into a record's headers (see
 * enqueue_trace.h). Only called while wal_delivery.traceparent is set: an untraced
 * enqueue costs one test of the setting.
 */
#include "postgres.h"

#include "enqueue_trace.h"
#include "shared/record_contract.h"
#include "shared/trace_context.h"

static void
push_string(JsonbParseState **state, JsonbIteratorToken token, const char *s, int len)
{
	JsonbValue v;

	v.type = jbvString;
	v.val.string.val = (char *) s;
	v.val.string.len = len;
	pushJsonbValue(state, token, &v);
}

static void
push_pair(JsonbParseState **state, const char *name, const char *value)
{
	push_string(state, WJB_KEY, name, strlen(name));
	push_string(state, WJB_VALUE, value, strlen(value));
}

/* Whether the object names header wanted, in any case (header names ignore case). */
static bool
names(Jsonb *headers, const char *wanted)
{
	JsonbIterator *it = JsonbIteratorInit(&headers->root);
	JsonbValue v;
	JsonbIteratorToken tok;

	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
		if (tok == WJB_KEY && record_header_named(v.val.string.val, v.val.string.len, wanted))
			return true;
	return false;
}

Jsonb *
enqueue_trace_headers(Jsonb *headers)
{
	JsonbParseState *state = NULL;
	JsonbValue *result;

	if (headers != NULL && (JB_ROOT_IS_SCALAR(headers) || !JB_ROOT_IS_OBJECT(headers) ||
							names(headers, TRACEPARENT_HEADER)))
		return headers;
	pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	if (headers != NULL)
	{
		JsonbIterator *it = JsonbIteratorInit(&headers->root);
		JsonbValue v;
		JsonbIteratorToken tok;

		while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
			if (tok == WJB_KEY || tok == WJB_VALUE)
				pushJsonbValue(&state, tok, &v);
	}
	push_pair(&state, TRACEPARENT_HEADER, wal_delivery_traceparent);
	/* A record's own tracestate stays: a key given twice would keep only the last. */
	if (wal_delivery_tracestate != NULL && wal_delivery_tracestate[0] != '\0' &&
		(headers == NULL || !names(headers, TRACESTATE_HEADER)))
		push_pair(&state, TRACESTATE_HEADER, wal_delivery_tracestate);
	result = pushJsonbValue(&state, WJB_END_OBJECT, NULL);
	return JsonbValueToJsonb(result);
}
