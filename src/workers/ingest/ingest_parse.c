/*
 * ingest_parse.c: a request's body and headers into records (see ingest_parse.h).
 */
#include "ingest_parse.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "common/log.h"
#include "ingest/ingest_json_member.h"
#include "shared/trace_context.h"

#define HEADER_PREFIX     "X-Wal-Header-"
#define HEADER_PREFIX_LEN (sizeof(HEADER_PREFIX) - 1)

static char *
must_strndup(const char *s, size_t n)
{
	char *copy = strndup(s, n);

	if (copy == NULL)
		fatal("event=out_of_memory what=ingest_parse");
	return copy;
}

static enum MHD_Result
take_header(void *arg, enum MHD_ValueKind kind, const char *name, size_t name_len,
			const char *value, size_t value_len)
{
	ingest_record *r = arg;

	(void) kind;
	if (name_len < HEADER_PREFIX_LEN || strncasecmp(name, HEADER_PREFIX, HEADER_PREFIX_LEN) != 0)
		return MHD_YES;
	ingest_record_add_header(r, name + HEADER_PREFIX_LEN, name_len - HEADER_PREFIX_LEN,
							 value ? value : "", value ? value_len : 0);
	return MHD_YES;
}

/* A request header with its length; false when the request has none. */
static bool
header(ingest_request *req, const char *name, const char **value, size_t *len)
{
	return MHD_lookup_connection_value_n(req->connection, MHD_HEADER_KIND, name, strlen(name),
										 value, len) == MHD_YES &&
		   *value != NULL;
}

/* The request's trace context (its traceparent and tracestate headers), for its records. */
typedef struct request_trace
{
	const char *traceparent; /* NULL: the request has none */
	size_t traceparent_len;
	const char *tracestate; /* NULL: none */
	size_t tracestate_len;
} request_trace;

/*
 * Reads the request's trace context; false, answered 400 naming the problem, when a header
 * cannot be read (a repeated one was refused before: ingest_http.c's single_headers).
 */
static bool
read_request_trace(ingest_request *req, request_trace *t)
{
	trace_context tc;
	const char *problem = NULL;

	memset(t, 0, sizeof(*t));
	if (header(req, TRACEPARENT_HEADER, &t->traceparent, &t->traceparent_len))
		problem = trace_context_parse(t->traceparent, t->traceparent_len, &tc);
	else
		t->traceparent = NULL;
	if (problem == NULL && header(req, TRACESTATE_HEADER, &t->tracestate, &t->tracestate_len))
		problem = tracestate_check(t->tracestate, t->tracestate_len);
	else if (problem == NULL)
		t->tracestate = NULL;
	if (problem == NULL)
		return true;
	ingest_request_fail(req, 400, "bad_request",
						"the request's %s header: %s (W3C Trace Context, for example "
						"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01)",
						t->tracestate ? TRACESTATE_HEADER : TRACEPARENT_HEADER, problem);
	return false;
}

static bool
has_header(const ingest_record *r, const char *name)
{
	/* ingest_record_add_header keeps names lowercase. */
	for (int i = 0; i < r->n_headers; i++)
		if (strcmp(r->header_names[i], name) == 0)
			return true;
	return false;
}

/* The request's context into a record that brings no traceparent of its own. */
static void
take_request_trace(ingest_record *r, const request_trace *t)
{
	if (t->traceparent == NULL || has_header(r, TRACEPARENT_HEADER))
		return;
	ingest_record_add_header(r, TRACEPARENT_HEADER, strlen(TRACEPARENT_HEADER), t->traceparent,
							 t->traceparent_len);
	if (t->tracestate != NULL && !has_header(r, TRACESTATE_HEADER))
		ingest_record_add_header(r, TRACESTATE_HEADER, strlen(TRACESTATE_HEADER), t->tracestate,
								 t->tracestate_len);
}

/* The answer to a record the contract refused; prefix says where (a batch's line). */
static void
refuse_record(ingest_request *req, const char *prefix, const record_problem *p)
{
	ingest_request_fail_field(req, p->http_status,
							  p->http_status == 413 ? "too_large" : "bad_record", p->field, "%s%s",
							  prefix, p->message);
}

/* Fills the record's topic and routing from the request's topic. */
static void
set_topic(ingest_record *r, const ingest_topic *topic)
{
	r->topic = must_strndup(topic->name, strlen(topic->name));
	r->acks = topic->acks;
	/* A topic the login may not write goes to the outbox door, which refuses it (403). */
	r->needs_processing = topic->needs_processing || !topic->writable;
}

bool
ingest_parse_single(ingest_request *req)
{
	ingest_record *r;
	record_problem problem;
	const char *value;
	size_t len;
	request_trace trace;

	if (!read_request_trace(req, &trace))
		return false;
	r = ingest_record_new();
	set_topic(r, req->topic);
	r->payload = req->body ? req->body : must_strndup("", 0);
	r->payload_len = req->body_len;
	req->body = NULL; /* the record owns it now */
	if (header(req, MHD_HTTP_HEADER_CONTENT_TYPE, &value, &len))
		ingest_record_set_content_type(r, value, len);
	else
		ingest_record_set_content_type(r, "application/octet-stream", 24);
	if (header(req, "Idempotency-Key", &value, &len))
		ingest_record_set_key(r, value, len);
	else
		ingest_record_generate_key(r);
	if (header(req, "X-Wal-Key", &value, &len))
		ingest_record_set_message_key(r, value, len);
	MHD_get_connection_values_n(req->connection, MHD_HEADER_KIND, take_header, r);
	take_request_trace(r, &trace);
	if (!ingest_record_check(r, req->topic->record_limit, &problem))
	{
		refuse_record(req, "", &problem);
		ingest_record_release(r);
		return false;
	}
	ingest_request_add_record(req, r);
	return true;
}

/*
 * Standard base64, strictly: the alphabet only, "=" padding only at the end (then to a
 * multiple of 4) and no lone last character. A lax decoder would store "QUJD=junk" as
 * "ABC" or "=QUJD" as nothing: a record other than the one sent. -1 when it is not base64.
 */
static long
base64_decode(const char *in, size_t len, char *out)
{
	unsigned int acc = 0;
	int bits = 0;
	long n = 0;
	size_t data_len = len;

	while (data_len > 0 && len - data_len < 2 && in[data_len - 1] == '=')
		data_len--;
	if ((data_len < len && len % 4 != 0) || data_len % 4 == 1)
		return -1;
	for (size_t i = 0; i < data_len; i++)
	{
		char c = in[i];
		int v;

		if (c >= 'A' && c <= 'Z')
			v = c - 'A';
		else if (c >= 'a' && c <= 'z')
			v = c - 'a' + 26;
		else if (c >= '0' && c <= '9')
			v = c - '0' + 52;
		else if (c == '+')
			v = 62;
		else if (c == '/')
			v = 63;
		else
			return -1;
		acc = (acc << 6) | (unsigned int) v;
		bits += 6;
		if (bits >= 8)
		{
			bits -= 8;
			out[n++] = (char) ((acc >> bits) & 0xff);
		}
	}
	return n;
}

/* Sets a line's shape error (not the contract's: how the line itself is written). */
static bool
bad_line(record_problem *p, const char *field, const char *message)
{
	memset(p, 0, sizeof(*p));
	p->http_status = 400;
	p->field = field;
	snprintf(p->message, sizeof(p->message), "%s", message);
	return false;
}

/* The members a batch line may have. */
static const char *const line_members[] = {
	"value", "value_base64", "idempotency_key", "key", "headers", "content_type", NULL};

/*
 * A member the line may not have, NULL when none: a misspelt "idempotencyKey" would
 * otherwise be ignored, the record given a generated key, and every retry of it stored
 * again as another record.
 */
static const char *
unknown_member(json_t *line)
{
	const char *name;
	json_t *member;

	json_object_foreach(line, name, member)
	{
		int i = 0;

		(void) member;
		while (line_members[i] != NULL && strcmp(line_members[i], name) != 0)
			i++;
		if (line_members[i] == NULL)
			return name;
	}
	return NULL;
}

/* One NDJSON line (parsed, and its text) into a record; false with the problem. */
static bool
parse_line(ingest_request *req, const request_trace *trace, json_t *line, const char *text,
		   size_t text_len, ingest_record *r, record_problem *p)
{
	json_t *value = json_object_get(line, "value");
	json_t *b64 = json_object_get(line, "value_base64");
	json_t *ikey = json_object_get(line, "idempotency_key");
	json_t *key = json_object_get(line, "key");
	json_t *headers = json_object_get(line, "headers");
	json_t *ctype = json_object_get(line, "content_type");
	const char *name;
	json_t *hv;

	if (!json_is_object(line) || (value == NULL) == (b64 == NULL))
		return bad_line(p, "value",
						"a line must be an object with \"value\" or \"value_base64\" (one of "
						"them)");
	if ((name = unknown_member(line)) != NULL)
	{
		char shown[160];

		record_quote(shown, sizeof(shown), name, strlen(name), 100);
		bad_line(p, "line", "");
		snprintf(p->message, sizeof(p->message),
				 "unknown member %s: a line takes value or value_base64, idempotency_key, key, "
				 "headers and content_type",
				 shown);
		return false;
	}
	if ((ikey && !json_is_string(ikey)) || (key && !json_is_string(key)) ||
		(ctype && !json_is_string(ctype)) || (headers && !json_is_object(headers)))
		return bad_line(p, "line",
						"idempotency_key, key and content_type must be strings and headers an "
						"object");
	set_topic(r, req->topic);
	if (value)
	{
		/* The value as sent, byte for byte (ingest_json_member.h). */
		const char *sent;
		size_t sent_len;

		if (!json_member_text(text, text_len, "value", &sent, &sent_len))
			return bad_line(p, "value", "the line's \"value\" could not be found in its text");
		r->payload = must_strndup(sent, sent_len);
		r->payload_len = sent_len;
	}
	else
	{
		const char *text = json_string_value(b64);
		size_t len = json_string_length(b64);
		long n;

		if (text == NULL)
			return bad_line(p, "value_base64", "value_base64 must be a string");
		r->payload = malloc(len * 3 / 4 + 3);
		if (r->payload == NULL)
			fatal("event=out_of_memory what=ingest_parse");
		n = base64_decode(text, len, r->payload);
		if (n < 0)
			return bad_line(p, "value_base64",
							"value_base64 is not base64 (A-Z, a-z, 0-9, \"+\" and \"/\"; "
							"\"=\" padding only at the end, to a multiple of 4 characters)");
		r->payload_len = (size_t) n;
	}
	if (ctype)
		ingest_record_set_content_type(r, json_string_value(ctype), json_string_length(ctype));
	else if (value)
		ingest_record_set_content_type(r, "application/json", 16);
	else
		ingest_record_set_content_type(r, "application/octet-stream", 24);
	if (ikey)
		ingest_record_set_key(r, json_string_value(ikey), json_string_length(ikey));
	else
		ingest_record_generate_key(r);
	if (key)
		ingest_record_set_message_key(r, json_string_value(key), json_string_length(key));
	json_object_foreach(headers, name, hv)
	{
		char shown[160];

		if (!json_is_string(hv))
		{
			record_quote(shown, sizeof(shown), name, strlen(name), 100);
			bad_line(p, "headers", "");
			snprintf(p->message, sizeof(p->message), "header %s must be a string", shown);
			return false;
		}
		ingest_record_add_header(r, name, strlen(name), json_string_value(hv),
								 json_string_length(hv));
	}
	take_request_trace(r, trace);
	return ingest_record_check(r, req->topic->record_limit, p);
}

/* A batch's record and the line it came from. */
typedef struct keyed_line
{
	const ingest_record *record;
	int line;
} keyed_line;

static int
compare_keys(const void *a, const void *b)
{
	const keyed_line *x = a, *y = b;
	size_t shorter = x->record->idempotency_key_len < y->record->idempotency_key_len
						 ? x->record->idempotency_key_len
						 : y->record->idempotency_key_len;
	int c = memcmp(x->record->idempotency_key, y->record->idempotency_key, shorter);

	if (c != 0)
		return c;
	if (x->record->idempotency_key_len != y->record->idempotency_key_len)
		return x->record->idempotency_key_len < y->record->idempotency_key_len ? -1 : 1;
	return x->line - y->line;
}

/*
 * False, answered 400, when two lines give one idempotency key. On the direct path both
 * would be stored, and destinations, which dedupe on the key, would drop one of them; on
 * the outbox path the second would be refused after the first was stored. Refused whole,
 * the batch is the same on both paths and nothing of it is stored.
 */
static bool
keys_unique(ingest_request *req, ingest_record **records, const int *lines, int n)
{
	keyed_line *sorted = malloc(sizeof(*sorted) * (size_t) n);
	bool unique = true;

	if (sorted == NULL)
		fatal("event=out_of_memory what=ingest_parse");
	for (int i = 0; i < n; i++)
		sorted[i] = (keyed_line){records[i], lines[i]};
	qsort(sorted, (size_t) n, sizeof(*sorted), compare_keys);
	for (int i = 1; i < n && unique; i++)
	{
		const ingest_record *a = sorted[i - 1].record, *b = sorted[i].record;
		char shown[160];

		if (a->idempotency_key_len != b->idempotency_key_len ||
			memcmp(a->idempotency_key, b->idempotency_key, a->idempotency_key_len) != 0)
			continue;
		record_quote(shown, sizeof(shown), b->idempotency_key, b->idempotency_key_len, 100);
		ingest_request_fail_field(req, 400, "bad_record", "idempotency_key",
								  "line %d: idempotency key %s is line %d's too: a key names one "
								  "record of its topic; give each line its own",
								  sorted[i].line, shown, sorted[i - 1].line);
		unique = false;
	}
	free(sorted);
	return unique;
}

bool
ingest_parse_batch(ingest_request *req)
{
	const char *p = req->body ? req->body : "";
	const char *end = p + req->body_len;
	int line_no = 0;
	ingest_record **records = NULL;
	int *lines = NULL; /* each record's line number */
	int n = 0;
	bool ok;
	request_trace trace;

	ok = read_request_trace(req, &trace);
	while (ok && p < end)
	{
		const char *nl = memchr(p, '\n', (size_t) (end - p));
		const char *line_end = nl ? nl : end;
		json_error_t jerr;
		json_t *line;
		ingest_record *r;
		record_problem problem;

		line_no++;
		if (line_end == p || (line_end - p == 1 && *p == '\r'))
		{
			p = line_end + 1;
			continue; /* blank lines are allowed */
		}
		if (n == INGEST_BATCH_MAX_RECORDS)
		{
			ingest_request_fail(req, 413, "too_large", "a batch holds at most %d records",
								INGEST_BATCH_MAX_RECORDS);
			ok = false;
			break;
		}
		/*
		 * A key twice is refused, not read as its last value: a filter in front may read
		 * the first. Integers are read as reals only to be checked: the value is kept as
		 * sent, so one over 64 bits is taken whole.
		 */
		line =
			json_loadb(p, (size_t) (line_end - p),
					   JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &jerr);
		if (line == NULL)
		{
			ingest_request_fail_field(
				req, 400, "bad_record", "line",
				"line %d: not JSON (UTF-8, no NUL, no object key twice): %s at column %d", line_no,
				jerr.text, jerr.column);
			ok = false;
			break;
		}
		r = ingest_record_new();
		if (!parse_line(req, &trace, line, p, (size_t) (line_end - p), r, &problem))
		{
			char where[32];

			snprintf(where, sizeof(where), "line %d: ", line_no);
			refuse_record(req, where, &problem);
			ingest_record_release(r);
			ok = false;
		}
		else
		{
			if ((n & (n - 1)) == 0)
			{
				records = realloc(records, sizeof(*records) * (n ? n * 2 : 1));
				lines = realloc(lines, sizeof(*lines) * (n ? n * 2 : 1));
				if (records == NULL || lines == NULL)
					fatal("event=out_of_memory what=ingest_parse");
			}
			lines[n] = line_no;
			records[n++] = r;
		}
		json_decref(line);
		p = line_end + 1;
	}
	if (ok && n == 0)
	{
		ingest_request_fail(req, 400, "bad_record", "the batch holds no record");
		ok = false;
	}
	if (ok && n > 1)
		ok = keys_unique(req, records, lines, n);
	for (int i = 0; i < n; i++)
	{
		if (ok)
			ingest_request_add_record(req, records[i]);
		else
			ingest_record_release(records[i]);
	}
	free(records);
	free(lines);
	return ok;
}
