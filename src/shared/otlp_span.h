/*
 * otlp_span.h: a finished span as wal_delivery exports it, and its OTLP/HTTP JSON encoding
 * (an ExportTraceServiceRequest), written once for the relay (the extension) and the
 * delivery attempts (wal-worker).
 *
 * A span is self-contained (fixed buffers, no pointers but its attribute keys, which are
 * string literals), so a caller's span can be copied into a queue and encoded later on
 * another thread. Values longer than their buffer are cut at a UTF-8 character boundary.
 *
 * The encoding follows the OTLP JSON rules: field names in lowerCamelCase, trace and span
 * ids as lowercase hex (not base64), enums as integers, 64-bit integers (times, int
 * attributes) as decimal strings.
 */
#ifndef WAL_OTLP_SPAN_H
#define WAL_OTLP_SPAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trace_context.h"

#define OTLP_MAX_ATTRIBUTES 8
#define OTLP_VALUE_MAX      256 /* a string attribute's bytes, NUL included */
#define OTLP_NAME_MAX       64
#define OTLP_MESSAGE_MAX    256

/* SpanKind and Status.StatusCode of opentelemetry/proto/trace/v1/trace.proto. */
typedef enum
{
	OTLP_KIND_INTERNAL = 1,
	OTLP_KIND_SERVER = 2,
	OTLP_KIND_CLIENT = 3,
	OTLP_KIND_PRODUCER = 4,
	OTLP_KIND_CONSUMER = 5
} otlp_span_kind;

typedef enum
{
	OTLP_STATUS_UNSET = 0,
	OTLP_STATUS_OK = 1,
	OTLP_STATUS_ERROR = 2
} otlp_status_code;

typedef struct otlp_attribute
{
	const char *key; /* a string literal: spans are copied without it */
	bool is_int;
	int64_t int_value;
	char string_value[OTLP_VALUE_MAX];
} otlp_attribute;

typedef struct otlp_span
{
	char trace_id[TRACE_ID_HEX + 1]; /* lowercase hex */
	char span_id[SPAN_ID_HEX + 1];
	char parent_span_id[SPAN_ID_HEX + 1]; /* "" for a root span */
	char name[OTLP_NAME_MAX];
	otlp_span_kind kind;
	uint64_t start_unix_nano;
	uint64_t end_unix_nano;
	otlp_status_code status;
	char status_message[OTLP_MESSAGE_MAX]; /* only sent with OTLP_STATUS_ERROR */
	int n_attributes;
	otlp_attribute attributes[OTLP_MAX_ATTRIBUTES];
} otlp_span;

/* What produced the spans: the resource's service.name and service.version. */
typedef struct otlp_resource
{
	const char *service_name;    /* "wal_delivery" (the relay) or "wal-worker" */
	const char *service_version; /* wal_delivery's version */
	const char *role;            /* wal.role: the relay or the worker role; NULL: none */
} otlp_resource;

/*
 * Starts span as a child of parent (same trace, parent's span id as the parent) with its
 * own span id span_id (16 lowercase hex), the given name and kind, and no attributes.
 */
void otlp_span_start(otlp_span *span, const trace_context *parent, const char *span_id,
					 const char *name, otlp_span_kind kind);

/* Adds an attribute; beyond OTLP_MAX_ATTRIBUTES it is left out (a programming error). */
void otlp_span_add_string(otlp_span *span, const char *key, const char *value);
void otlp_span_add_int(otlp_span *span, const char *key, int64_t value);

/* Sets the status; message (may be NULL) is kept for OTLP_STATUS_ERROR. */
void otlp_span_set_status(otlp_span *span, otlp_status_code code, const char *message);

/*
 * The JSON body of POST /v1/traces for n spans (n >= 1): one resourceSpans with the
 * resource's attributes and one scopeSpans (scope "wal_delivery"). malloc'd, the caller
 * frees it; NULL only when memory ran out.
 */
char *otlp_encode_spans(const otlp_resource *resource, const otlp_span *spans, size_t n);

/* The longest OTLP endpoint URL, /v1/traces included, with its NUL. */
#define OTLP_URL_MAX 1024

/*
 * The URL spans are POSTed to: endpoint (an http:// or https:// base URL, as an OTLP
 * exporter's endpoint setting names it) with /v1/traces appended. NULL on success, or
 * what is wrong with endpoint, for the setting's error message.
 */
const char *otlp_traces_url(const char *endpoint, char url[OTLP_URL_MAX]);

/* Copies at most size - 1 bytes of src into dst, never cutting a UTF-8 sequence. */
void otlp_copy_text(char *dst, size_t size, const char *src);

#endif
