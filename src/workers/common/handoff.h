/*
 * handoff.h: durably handing a copy of a record to a retry step or the DLQ.
 *
 * A hand-off is done only when Kafka acknowledged the write with acks=all (idempotent
 * producer); a failed write is tried again, never dropped. The message keeps the payload
 * unchanged and carries, as headers: the source topic, partition and offset, the
 * idempotency key, the destination, the attempt, when it entered the step, the jitter
 * drawn for that step, the earliest time to try again (from Retry-After), and the last
 * error, next to the record's own headers (content type, outbox id, created-at, and its
 * trace context: traceparent and tracestate).
 * Retry steps are partitioned by destination: each destination owns its retry_partition.
 */
#ifndef WAL_HANDOFF_H
#define WAL_HANDOFF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "control_plane.h"
#include "log.h"
#include "options.h"
#include "shared/trace_context.h"

typedef enum
{
	HANDOFF_RETRY_STEP_1 = 1,
	HANDOFF_RETRY_STEP_2 = 2,
	HANDOFF_RETRY_STEP_3 = 3,
	HANDOFF_DLQ = 4
} handoff_target;

/* A record as consumed: what a delivery and a hand-off need of it. */
typedef struct handoff_message
{
	char *source_topic;
	int32_t source_partition;
	int64_t source_offset;
	char *idempotency_key;
	char *content_type;
	char *outbox_id;
	char *created_at;
	char *traceparent; /* the record's trace context as its headers hold it; NULL: none */
	char *tracestate;
	bool has_trace; /* traceparent is valid: trace holds it (handoff_message_read_trace) */
	trace_context trace;
	char *payload; /* payload_len bytes (NUL-terminated when from Kafka) */
	size_t payload_len;
	void *owner; /* the caller's, untouched here */
	char *block; /* what handoff_message_clear frees: the one allocation from
				  * handoff_message_from_kafka; NULL when the caller filled the fields */
} handoff_message;

/* The first value of a message header as a malloc'd string, NULL when it has none. */
char *kafka_header_value(const rd_kafka_message_t *rkm, const char *name);

/*
 * Fills m from a consumed message, copying what it keeps into one allocation. With
 * origin_from_headers (a retry-step message), the source-topic header, when present,
 * names the record's topic instead of the topic it was read from.
 */
void handoff_message_from_kafka(handoff_message *m, const rd_kafka_message_t *rkm,
								bool origin_from_headers);
/* Reads m->traceparent into m->trace and m->has_trace (from_kafka does it itself). */
void handoff_message_read_trace(handoff_message *m);

/* The record's trace id for log lines, NULL when it has none. */
static inline const char *
handoff_trace_id(const handoff_message *m)
{
	return m->has_trace ? m->trace.trace_id : NULL;
}

/* A log line about the record m: its topic, key and trace id (log_record) follow the fields. */
#define log_message(level, m, ...)                                                                 \
	log_record(level, (m)->source_topic, (m)->idempotency_key, handoff_trace_id(m), __VA_ARGS__)

/* Frees what handoff_message_from_kafka allocated. */
void handoff_message_clear(handoff_message *m);
const char *handoff_target_name(handoff_target target);

typedef struct handoff_producer handoff_producer;
typedef void (*handoff_done_fn)(void *opaque, void *arg);

handoff_producer *handoff_producer_new(const worker_options *opts,
									   const control_plane_config *config, handoff_done_fn done,
									   void *arg, char *errbuf, size_t errbuf_size);

/* Queues the write; done(opaque, arg) runs from handoff_poll once it is acknowledged. */
void handoff_send(handoff_producer *p, const control_plane_config *config,
				  const destination_config *destination, const char *destination_name,
				  const handoff_message *m, handoff_target target, int attempt, const char *error,
				  long not_before_s, void *opaque);

void handoff_poll(handoff_producer *p);
int handoff_pending(const handoff_producer *p);
void handoff_producer_free(handoff_producer *p);

#endif
