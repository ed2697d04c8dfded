/*
 * ingest_record.h: one record received over HTTP, on its way to Kafka or the outbox.
 *
 * A record is settled exactly once: by Kafka's delivery report (201), by the outbox
 * commit (202) or by a failure (an HTTP status and an error). `route` decides who may
 * settle it: while it is ROUTE_KAFKA the delivery report or the deadline may take it
 * (compare-and-swap), once it is ROUTE_OUTBOX only the outbox writer does. A delivery
 * report that finds the record already handed to the outbox is a late ack: the record
 * is then in Kafka twice (counted, at least once).
 *
 * A record is never answered "not stored" while a copy of it may still land in Kafka:
 * when the outbox cannot take a record that was produced, its answer follows Kafka's
 * report (ingest_kafka_outbox_failed): 201 when it was stored, 503 when librdkafka says
 * it was never written, 504 outcome_unknown while that is not known.
 *
 * References: the request holds one; librdkafka holds one while the message is queued
 * and the deadline list one while the record is on it. The last release frees it.
 */
#ifndef WAL_INGEST_RECORD_H
#define WAL_INGEST_RECORD_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shared/record_contract.h"

#define INGEST_CREATED_AT_BYTES 64

struct ingest_request;

enum
{
	ROUTE_KAFKA,  /* produced; the delivery report or the deadline settles it */
	ROUTE_OUTBOX, /* handed to the outbox writer, which settles it */
	ROUTE_SETTLED
};

/* What Kafka said of the copy it was given (ingest_kafka.c), once it said it. */
enum
{
	KAFKA_REPORT_NONE,        /* no report yet, or no copy was produced */
	KAFKA_REPORT_STORED,      /* acknowledged with the topic's acks */
	KAFKA_REPORT_NOT_STORED,  /* never written: librdkafka says not persisted */
	KAFKA_REPORT_MAYBE_STORED /* failed after it was sent: it may still be in Kafka */
};

typedef enum
{
	OUTCOME_NONE,
	OUTCOME_KAFKA,  /* acknowledged by Kafka with the topic's acks */
	OUTCOME_OUTBOX, /* committed to the outbox */
	OUTCOME_FAILED
} record_outcome;

typedef struct ingest_record
{
	/* what it is */
	char *topic;
	int acks;
	bool needs_processing;
	/*
	 * Each value is kept with its length as it came, and also NUL-terminated: once
	 * ingest_record_check passed, the contract guarantees none holds a NUL, so the code
	 * after it may read them as C strings.
	 */
	char *payload;
	size_t payload_len;
	char *content_type;
	size_t content_type_len;
	char *idempotency_key;
	size_t idempotency_key_len;
	bool key_generated;
	char *message_key; /* NULL: none */
	size_t message_key_len;
	int n_headers;
	char *header_names[RECORD_MAX_HEADERS];
	char *header_values[RECORD_MAX_HEADERS];
	size_t header_name_lens[RECORD_MAX_HEADERS];
	size_t header_value_lens[RECORD_MAX_HEADERS];
	int n_headers_given; /* how many the request had, which may be over the limit */
	char created_at[INGEST_CREATED_AT_BYTES];

	/* how it ended */
	atomic_int route;
	bool kafka_copy;         /* given to librdkafka: a copy may land until its report */
	atomic_int kafka_report; /* KAFKA_REPORT_*, written before the report settles anything */
	record_outcome outcome;
	int32_t partition;
	int64_t offset;
	int64_t outbox_id;
	int http_status;     /* of a failure */
	char error_code[48]; /* of a failure: a short name such as kafka_and_outbox_down */
	char *error_message;
	const char *fallback_reason; /* why it went to the outbox, NULL when it did not */

	struct ingest_request *request;
	int index; /* its place in the request */
	atomic_int refs;
	int64_t deadline_ms;                 /* when the outbox takes over (ROUTE_KAFKA) */
	struct ingest_record *next_inflight; /* the deadline list */
	struct ingest_record *next_queued;   /* the outbox queue */
} ingest_record;

ingest_record *ingest_record_new(void);
void ingest_record_ref(ingest_record *r);
void ingest_record_release(ingest_record *r);

/* A UUID v4 as the idempotency key when the client gave none. */
void ingest_record_generate_key(ingest_record *r);

/* Sets the idempotency key, the message key or the content type from bytes as they came. */
void ingest_record_set_key(ingest_record *r, const char *key, size_t len);
void ingest_record_set_message_key(ingest_record *r, const char *key, size_t len);
void ingest_record_set_content_type(ingest_record *r, const char *type, size_t len);

/*
 * Adds a record header as it came; names are kept in lower case (HTTP header names carry
 * no case). Headers over the contract's count are only counted, for the check to refuse.
 */
void ingest_record_add_header(ingest_record *r, const char *name, size_t name_len,
							  const char *value, size_t value_len);

/* The record contract (src/shared/record_contract.h); false with the problem filled. */
bool ingest_record_check(const ingest_record *r, int64_t record_limit, record_problem *problem);

/* Settlement: each is called once, by whoever won the record (see above). */
void ingest_record_settle_kafka(ingest_record *r, int32_t partition, int64_t offset);
void ingest_record_settle_outbox(ingest_record *r, int64_t outbox_id);
void ingest_record_settle_failed(ingest_record *r, int http_status, const char *code,
								 const char *message);

#endif
