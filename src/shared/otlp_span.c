/*
 * otlp_span.c: spans and their OTLP/HTTP JSON encoding (otlp_span.h), with jansson.
 */
#include "otlp_span.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "utf8.h"

void
otlp_copy_text(char *dst, size_t size, const char *src)
{
	size_t out = 0;
	size_t left = src ? strlen(src) : 0;
	const unsigned char *s = (const unsigned char *) src;

	while (left > 0)
	{
		size_t n = utf8_sequence_length(s, left);

		/* A byte that is not UTF-8 (a peer's error text) becomes '?': JSON needs UTF-8. */
		if (n == 0)
		{
			if (out + 1 >= size)
				break;
			dst[out++] = '?';
			s++, left--;
			continue;
		}
		if (out + n >= size)
			break;
		memcpy(dst + out, s, n);
		out += n, s += n, left -= n;
	}
	dst[out] = '\0';
}

const char *
otlp_traces_url(const char *endpoint, char url[OTLP_URL_MAX])
{
	size_t len = strlen(endpoint);
	size_t scheme = strncmp(endpoint, "https://", 8) == 0  ? 8
					: strncmp(endpoint, "http://", 7) == 0 ? 7
														   : 0;

	if (scheme == 0)
		return "the OTLP endpoint must be an http:// or https:// URL";
	while (len > scheme && endpoint[len - 1] == '/')
		len--; /* http://host:4318/ and http://host:4318 are the same endpoint */
	if (len == scheme)
		return "the OTLP endpoint has no host";
	for (size_t i = 0; i < len; i++)
		if ((unsigned char) endpoint[i] <= 0x20 || (unsigned char) endpoint[i] >= 0x7f)
			return "the OTLP endpoint holds a space, a control character or a non-ASCII byte";
	if (len + sizeof("/v1/traces") > OTLP_URL_MAX)
		return "the OTLP endpoint is longer than 1000 characters";
	memcpy(url, endpoint, len);
	memcpy(url + len, "/v1/traces", sizeof("/v1/traces"));
	return NULL;
}

void
otlp_span_start(otlp_span *span, const trace_context *parent, const char *span_id, const char *name,
				otlp_span_kind kind)
{
	memset(span, 0, offsetof(otlp_span, attributes));
	memcpy(span->trace_id, parent->trace_id, sizeof(span->trace_id));
	memcpy(span->parent_span_id, parent->span_id, sizeof(span->parent_span_id));
	otlp_copy_text(span->span_id, sizeof(span->span_id), span_id);
	otlp_copy_text(span->name, sizeof(span->name), name);
	span->kind = kind;
}

static otlp_attribute *
next_attribute(otlp_span *span, const char *key)
{
	otlp_attribute *a;

	if (span->n_attributes >= OTLP_MAX_ATTRIBUTES)
		return NULL;
	a = &span->attributes[span->n_attributes++];
	a->key = key;
	return a;
}

void
otlp_span_add_string(otlp_span *span, const char *key, const char *value)
{
	otlp_attribute *a = next_attribute(span, key);

	if (a == NULL)
		return;
	a->is_int = false;
	otlp_copy_text(a->string_value, sizeof(a->string_value), value);
}

void
otlp_span_add_int(otlp_span *span, const char *key, int64_t value)
{
	otlp_attribute *a = next_attribute(span, key);

	if (a == NULL)
		return;
	a->is_int = true;
	a->int_value = value;
	a->string_value[0] = '\0';
}

void
otlp_span_set_status(otlp_span *span, otlp_status_code code, const char *message)
{
	span->status = code;
	otlp_copy_text(span->status_message, sizeof(span->status_message),
				   code == OTLP_STATUS_ERROR ? message : NULL);
}

/*
 * Building the document: every jansson call may fail for memory, and a failed set would
 * silently leave a field out, so each one goes through here and any failure fails all.
 */
typedef struct
{
	bool ok;
} build_state;

static void
put(build_state *st, json_t *obj, const char *key, json_t *value)
{
	if (obj == NULL)
		json_decref(value); /* set_new takes value over, even when it fails */
	if (value == NULL || obj == NULL || json_object_set_new(obj, key, value) != 0)
		st->ok = false;
}

static void
append(build_state *st, json_t *array, json_t *value)
{
	if (array == NULL)
		json_decref(value);
	if (value == NULL || array == NULL || json_array_append_new(array, value) != 0)
		st->ok = false;
}

/*
 * A new JSON object. Never jansson's json_object() itself: Postgres defines a function of
 * that name (the SQL json_object), and in the server the executable's symbol wins over
 * libjansson's for a call from the extension, so json_object() would run Postgres's
 * function. json_pack makes the object inside libjansson, which binds its own calls.
 */
static json_t *
new_object(void)
{
	return json_pack("{}");
}

/* OTLP JSON: 64-bit integers travel as decimal strings. */
static json_t *
int64_string(int64_t v)
{
	char buf[24];

	snprintf(buf, sizeof(buf), "%" PRId64, v);
	return json_string(buf);
}

static json_t *
uint64_string(uint64_t v)
{
	char buf[24];

	snprintf(buf, sizeof(buf), "%" PRIu64, v);
	return json_string(buf);
}

/* {"key": k, "value": {"stringValue": s}} or {"intValue": "n"}: an AnyValue. */
static json_t *
key_value(build_state *st, const char *key, const otlp_attribute *a, const char *string_value)
{
	json_t *kv = new_object();
	json_t *value = new_object();

	put(st, kv, "key", json_string(key));
	if (a != NULL && a->is_int)
		put(st, value, "intValue", int64_string(a->int_value));
	else
		put(st, value, "stringValue", json_string(a ? a->string_value : string_value));
	put(st, kv, "value", value);
	return kv;
}

static json_t *
encode_span(build_state *st, const otlp_span *span)
{
	json_t *s = new_object();
	json_t *attributes = json_array();
	json_t *status = new_object();

	put(st, s, "traceId", json_string(span->trace_id));
	put(st, s, "spanId", json_string(span->span_id));
	if (span->parent_span_id[0] != '\0')
		put(st, s, "parentSpanId", json_string(span->parent_span_id));
	put(st, s, "name", json_string(span->name));
	put(st, s, "kind", json_integer(span->kind));
	put(st, s, "startTimeUnixNano", uint64_string(span->start_unix_nano));
	put(st, s, "endTimeUnixNano", uint64_string(span->end_unix_nano));
	for (int i = 0; i < span->n_attributes; i++)
		append(st, attributes, key_value(st, span->attributes[i].key, &span->attributes[i], NULL));
	put(st, s, "attributes", attributes);
	put(st, status, "code", json_integer(span->status));
	if (span->status == OTLP_STATUS_ERROR && span->status_message[0] != '\0')
		put(st, status, "message", json_string(span->status_message));
	put(st, s, "status", status);
	return s;
}

static json_t *
encode_resource(build_state *st, const otlp_resource *resource)
{
	json_t *r = new_object();
	json_t *attributes = json_array();

	append(st, attributes, key_value(st, "service.name", NULL, resource->service_name));
	append(st, attributes, key_value(st, "service.version", NULL, resource->service_version));
	if (resource->role != NULL)
		append(st, attributes, key_value(st, "wal.role", NULL, resource->role));
	put(st, r, "attributes", attributes);
	return r;
}

char *
otlp_encode_spans(const otlp_resource *resource, const otlp_span *spans, size_t n)
{
	build_state st = {true};
	json_t *root = new_object();
	json_t *resource_spans = json_array();
	json_t *rs = new_object();
	json_t *scope_spans = json_array();
	json_t *ss = new_object();
	json_t *scope = new_object();
	json_t *span_list = json_array();
	char *body = NULL;

	put(&st, scope, "name", json_string("wal_delivery"));
	put(&st, scope, "version", json_string(resource->service_version));
	put(&st, ss, "scope", scope);
	for (size_t i = 0; i < n; i++)
		append(&st, span_list, encode_span(&st, &spans[i]));
	put(&st, ss, "spans", span_list);
	append(&st, scope_spans, ss);
	put(&st, rs, "resource", encode_resource(&st, resource));
	put(&st, rs, "scopeSpans", scope_spans);
	append(&st, resource_spans, rs);
	put(&st, root, "resourceSpans", resource_spans);
	if (st.ok)
		body = json_dumps(root, JSON_COMPACT);
	json_decref(root);
	return body;
}
