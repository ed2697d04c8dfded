/*
 * record_contract.h: the rules every record meets, whichever door it came in by.
 *
 * A record is a payload, an idempotency key, an optional message key, a content type and
 * up to 64 headers. The SQL door (wal_enqueue*, ingest_enqueue_batch), the relay, the
 * workers' hand-offs and the ingest service all check a record here, so the same bytes get
 * the same answer on every path: the same SQLSTATE in SQL, the same HTTP status over
 * HTTP, the same message in both.
 *
 * A traceparent or tracestate header must be one W3C Trace Context reads (trace_context.h).
 *
 * Everything works on (pointer, length) byte strings: a NUL is a byte like any other and
 * is judged by the rules, never taken as the end of a value. This file depends on neither
 * Postgres nor librdkafka; it is built into wal_delivery.so and into wal-worker.
 */
#ifndef WAL_RECORD_CONTRACT_H
#define WAL_RECORD_CONTRACT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RECORD_MAX_IDEMPOTENCY_KEY 200
#define RECORD_MAX_MESSAGE_KEY     1024
#define RECORD_MAX_HEADERS         64
#define RECORD_MAX_HEADER_NAME     256
#define RECORD_MAX_CONTENT_TYPE    255
/* Bytes of Kafka's message limit kept free for the workers' hand-off headers. */
#define RECORD_HANDOFF_RESERVE 16384

/* A byte string; data == NULL means absent (SQL NULL, no such HTTP header). */
typedef struct record_bytes
{
	const char *data;
	size_t len;
} record_bytes;

typedef struct record_header
{
	record_bytes name;
	record_bytes value;
} record_header;

/* A record as a door holds it, before it is stored or produced. */
typedef struct record_fields
{
	record_bytes topic;           /* only for messages */
	record_bytes payload;         /* absent: refused */
	record_bytes idempotency_key; /* the key it will have (a caller's or a generated one) */
	record_bytes message_key;     /* absent: none */
	record_bytes content_type;    /* absent: the door's own default, which is not checked */
	const record_header *headers;
	int n_headers;
} record_fields;

/* Why a record was refused. The message and hint are valid UTF-8 whatever the record held. */
typedef struct record_problem
{
	const char *sqlstate; /* "22023" and so on */
	int http_status;      /* 400 or 413 */
	const char *field;    /* the field at fault, as the ingest API names it */
	char message[640];
	char hint[640];
} record_problem;

/* True when r meets every rule; otherwise false with p filled (p may not be NULL). */
bool record_check(const record_fields *r, int64_t record_limit, record_problem *p);

/* The largest record size a topic with max_payload_bytes takes (see record_size). */
int64_t record_limit(int32_t max_payload_bytes);

/*
 * What a record puts into its Kafka message besides the relay's own headers: payload,
 * idempotency key, message key and every header's name and value, in bytes.
 */
int64_t record_size(const record_fields *r);

/*
 * Whether name (len bytes) is wanted, a lowercase header name, in any case: header names
 * ignore case, as in HTTP (a record's "TraceParent" is its traceparent).
 */
bool record_header_named(const char *name, size_t len, const char *wanted);

/* The header names the relay and the workers write themselves; a record may not bring them. */
bool record_header_is_reserved(const char *name, size_t len);
extern const char *const record_reserved_headers[];
extern const int record_n_reserved_headers;

/*
 * Why name (len bytes) is not a topic name Kafka takes, or NULL: 1 to 249 letters, digits,
 * ".", "_" or "-", not "." or "..", not starting with "__" (Kafka's own topics).
 */
const char *record_topic_name_problem(const char *name, size_t len);

/* True when s is 1 to 256 bytes of an HTTP token (RFC 9110 tchar). */
bool record_is_http_token(const char *s, size_t len);

/* The offset of the first byte that is not valid UTF-8 (a NUL counts as invalid), or -1. */
long record_invalid_utf8_at(const char *s, size_t len);

/* The offset of the first byte below 0x20 or 0x7f (NUL included), or -1. */
long record_control_at(const char *s, size_t len);

/*
 * Writes s as a double-quoted string that is safe in any message: valid UTF-8, with
 * control characters escaped as JSON does and bytes that are not UTF-8 as \xXX, cut after
 * max_chars characters (never inside one) with "..." appended. out is always
 * terminated; the result is cut further to fit out_size.
 */
void record_quote(char *out, size_t out_size, const char *s, size_t len, size_t max_chars);

#endif
