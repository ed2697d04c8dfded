/*
 * kafka_inflight.h: deliveries that outlive their pass (kafka_inflight.c).
 *
 * A pass waits for its reports only so long (wal_delivery.relay_delivery_timeout); a
 * record still without a report then is in flight: librdkafka's idempotent producer
 * keeps retrying it, and its first attempt may still be acknowledged. Producing it again
 * then would make a second copy, so its outbox id is remembered here, later passes that
 * read it skip it, and the first pass that reads it after its report takes that report
 * as its own. A crash forgets them all: the rows are still unmarked, so they are sent
 * again (a lost acknowledgement, which at least once allows).
 */
#ifndef KAFKA_INFLIGHT_H
#define KAFKA_INFLIGHT_H

#include "kafka_producer.h"

/* What the relay knows of an outbox id a pass is about to produce. */
typedef enum
{
	INFLIGHT_NONE,     /* nothing: produce it */
	INFLIGHT_WAITING,  /* produced by an earlier pass, no report yet: do not produce it */
	INFLIGHT_REPORTED, /* its report came after its pass: that report is this pass's */
} InflightState;

/*
 * Deliveries for n records of one pass, which live until the pass ends
 * (kafka_inflight_pass_done) or, for those handed off, until their report.
 */
KafkaDelivery *kafka_deliveries_alloc(int n);

/* The pass's wait ran out: its deliveries without a report are handed off. */
void kafka_inflight_hand_off(void);

/* Handed-off deliveries still without a report (librdkafka still has them). */
int kafka_inflight_waiting(void);

/* Outbox ids remembered: in flight, or reported after their pass and not read since. */
int kafka_inflight_count(void);

/* Called by the report callback for a handed-off delivery. */
void kafka_inflight_reported(KafkaDelivery *delivery);

/*
 * Looks up outbox_id: INFLIGHT_REPORTED copies the late report into *delivery and
 * forgets the id.
 */
InflightState kafka_inflight_take(int64 outbox_id, KafkaDelivery *delivery);

/* The pass is over: frees its deliveries, except those handed off. */
void kafka_inflight_pass_done(void);

/*
 * The producers are gone: deliveries that got no report never will; each becomes a
 * report that the record may have been stored, so it is sent again.
 */
void kafka_inflight_forget(void);

#endif
