/*
 * dlq_message.h: what a DLQ message says of itself, read defensively.
 *
 * Anyone who can write to the DLQ topic (or a record's own headers, once) decides what
 * its headers hold, so nothing is taken as is: text is made valid UTF-8 (other bytes and
 * NULs written as \xHH), numbers are read only when they are digits in range, and every
 * header also goes, escaped the same way, into one JSON object for on-call. Whatever a
 * message holds, the result can be inserted.
 */
#ifndef WAL_DLQ_MESSAGE_H
#define WAL_DLQ_MESSAGE_H

#include <stdbool.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

typedef struct dlq_message
{
	char *topic;           /* source-topic, or NULL */
	char *idempotency_key; /* NULL when absent */
	char *destination;
	char *content_type;
	char *last_error;
	bool has_outbox_id; /* outbox-id was 1..INT64_MAX in digits */
	int64_t outbox_id;
	bool has_attempt; /* attempt was 0..INT32_MAX in digits */
	int32_t attempt;
	char *headers_json; /* every header, {"name": "value", ...}; never NULL */
} dlq_message;

/* Reads rkm's headers into m (free with dlq_message_clear). */
void dlq_message_read(dlq_message *m, const rd_kafka_message_t *rkm);
void dlq_message_clear(dlq_message *m);

/* bytes[0..len) as valid UTF-8 text: invalid bytes and NULs as \xHH (malloc'd). */
char *utf8_or_escaped(const char *bytes, size_t len);

/* The digits of text as a number in [0, max]; false for anything else ("", "-1", "1e3"). */
bool parse_bounded_digits(const char *text, int64_t max, int64_t *out);

#endif
