/*
 * retry_message.h: reading a message of a retry-step topic.
 *
 * The hand-off (handoff.c) wrote the record with headers saying where it came from, for
 * which destination, when it entered this step and the jitter drawn for it there. From
 * those the message is due at
 *     entered + (the step's delay + jitter) / time scale
 * or later when the destination asked for it (Retry-After, the not-before header).
 * A message whose headers are missing or garbled cannot be scheduled; it gets a reason
 * and goes to the DLQ.
 */
#ifndef WAL_RETRY_MESSAGE_H
#define WAL_RETRY_MESSAGE_H

#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "common/control_plane.h"
#include "common/handoff.h"

typedef struct retry_message
{
	handoff_message msg; /* the record as the main topic had it */
	char *destination;   /* NULL when the header is missing */
	int step;            /* 1..3, from the topic's name */
	int attempt;         /* attempts made so far */
	int64_t due_ms;      /* wall clock */
	int64_t earliest_ms; /* due at the earliest had its jitter been 0: messages entered
						  * after it are not due before this */
	char *bad;           /* why it cannot be retried (malloc'd), NULL when it can */
	bool clock_jump;     /* entered in the future beyond any delay: due now */
} retry_message;

/* Fills m from a consumed message of step `step` (1..3). */
void retry_message_read(retry_message *m, const rd_kafka_message_t *rkm, int step,
						const control_plane_config *config, double time_scale, int64_t now_wall_ms);

void retry_message_clear(retry_message *m);

/* The step a retry topic holds (1..3), 0 when the name is not prefix + 1..3. */
int retry_topic_step(const char *topic, const char *prefix);

#endif
