/*
 * ingest_request.h: one HTTP request of the ingest service, from its first byte to its
 * answer.
 *
 * A request holds its records. Once they are handed on (to Kafka or the outbox) it waits,
 * its connection suspended, until each is settled; the last settlement resumes the
 * connection (from whichever thread settled it) and the answer is built from the
 * records' outcomes: 201 when every record is in Kafka, 202 when every record is durable
 * and one at least went to the outbox, otherwise the failure's status.
 */
#ifndef WAL_INGEST_REQUEST_H
#define WAL_INGEST_REQUEST_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <microhttpd.h>

#include "ingest/ingest_catalog.h"
#include "ingest/ingest_record.h"

typedef struct ingest_request
{
	struct MHD_Connection *connection;
	ingest_catalog *catalog; /* a reference for the request's life */
	bool batch;
	const ingest_topic *topic;
	int64_t started_ms;

	/* the body, kept up to body_limit, counted beyond */
	char *body;
	size_t body_len;
	size_t body_cap; /* counted in the bodies' limit until the request is freed */
	size_t body_limit;
	bool body_too_large;

	/* an answer decided before the records (bad input, auth); status 0: none */
	int error_status;
	char error_code[48];
	const char *error_field; /* the request field at fault, NULL when none is */
	const char *allow;       /* a 405's Allow header: the methods the path takes */
	char error_message[1024];

	ingest_record **records;
	int n_records;

	pthread_mutex_t lock;
	int outstanding; /* records not settled yet */
	bool suspended;
	bool handed_on; /* the records went to Kafka or the outbox */
	bool closing;   /* answered before its body was read: "Connection: close" */
} ingest_request;

/*
 * What the bodies of all requests may hold at once. Each request is bounded (a batch
 * 16 MiB), but a thousand slow uploads of one each would hold 16 GiB until the worker
 * was killed for it; past this, a request is answered 503 (Retry-After) instead.
 */
#define INGEST_BODIES_MAX_BYTES ((size_t) 256 * 1024 * 1024)

ingest_request *ingest_request_new(struct MHD_Connection *connection);
void ingest_request_free(ingest_request *req);

/* Sets the early answer (the first one set wins). */
void ingest_request_fail(ingest_request *req, int status, const char *code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* The same, naming the field of the request at fault ("idempotency_key", "headers"...). */
void ingest_request_fail_field(ingest_request *req, int status, const char *code, const char *field,
							   const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/*
 * Makes room for more bytes of body after body_len (and a NUL), at most body_limit + 1 in
 * all; false, nothing changed, when all requests' bodies would pass
 * INGEST_BODIES_MAX_BYTES.
 */
bool ingest_request_grow_body(ingest_request *req, size_t more);

void ingest_request_add_record(ingest_request *req, ingest_record *r);

/*
 * Called after the records were handed on, from the request's handler: true when they
 * are all settled already (answer now), false when the connection was suspended.
 */
bool ingest_request_wait(ingest_request *req);

/* A record of req was settled (any thread). */
void ingest_request_record_done(ingest_request *req);

/* Queues the answer on the connection. */
enum MHD_Result ingest_request_answer(ingest_request *req);

/*
 * Queues a JSON error answer that belongs to no record; field may be NULL. The message may
 * hold any bytes: answers are always valid JSON (see json_text).
 */
enum MHD_Result ingest_send_error(struct MHD_Connection *connection, int status, const char *code,
								  const char *field, const char *message);

/* A JSON string of s whatever its bytes: those that are not UTF-8 are shown as \xXX. */
json_t *json_text(const char *s);

#endif
