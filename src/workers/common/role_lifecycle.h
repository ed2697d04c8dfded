/*
 * role_lifecycle.h: the life cycle of the roles that consume Kafka (consume, retry, dlq),
 * written once: each role's run_* calls these steps in its own order.
 *
 *   start     role_connect_kafka: the consumer and the hand-off producer, then the
 *             role subscribes (role_subscribe) to the topics it reads
 *   run       role_is_record sorts what a poll returned; on a stop request consume and
 *             retry drain (role_drain_begins, role_drained): fetching pauses
 *             (role_pause_fetching) and what is in flight gets ROLE_DRAIN_MS to finish
 *   shut down role_close_consumer leaves the group and frees the consumer
 *
 * Before these, every role starts the same way too: stop_on_signals, its metrics, the
 * configuration (config_watch_start) and the admin server (role_setup.h).
 */
#ifndef WAL_ROLE_LIFECYCLE_H
#define WAL_ROLE_LIFECYCLE_H

#include <stdbool.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "config_watch.h"
#include "handoff.h"
#include "kafka_conf.h"
#include "options.h"

/* A stop request waits this long for what is in flight (consume, retry). */
#define ROLE_DRAIN_MS 15000

typedef void (*kafka_rebalance_fn)(rd_kafka_t *rk, rd_kafka_resp_err_t err,
								   rd_kafka_topic_partition_list_t *parts, void *opaque);

/* What differs between the roles' Kafka clients. */
typedef struct role_kafka
{
	/* group.id, client.id, offset handling; after the prefetch bound */
	const kafka_default *consumer_defaults;
	int n_consumer_defaults;
	kafka_rebalance_fn on_rebalance;
	handoff_done_fn on_handed_off; /* the producer's: Kafka acknowledged a write */
	void *state;                   /* the role's state, passed to both callbacks */
} role_kafka;

/*
 * Creates the role's consumer (its records read through rd_kafka_consumer_poll, not
 * subscribed yet) and its hand-off producer, both to the configuration's brokers. False,
 * logged as event=kafka_setup_failed, when librdkafka refuses either: the role exits 1.
 */
bool role_connect_kafka(const worker_options *opts, const config_watch *watch,
						const role_kafka *kafka, rd_kafka_t **consumer,
						handoff_producer **producer);

/* Subscribes the consumer to exactly these topics (n > 0). */
rd_kafka_resp_err_t role_subscribe(rd_kafka_t *consumer, char *const *topics, int n);

/*
 * True when a polled message is a record; an error event is logged (event=consume_error),
 * the end of a partition is not.
 */
bool role_is_record(const rd_kafka_message_t *rkm);

/* Pauses every assigned partition: nothing more is fetched. */
void role_pause_fetching(rd_kafka_t *consumer);

/*
 * True on the first stop request only, setting *deadline (0 until then) ROLE_DRAIN_MS
 * ahead: the caller then logs event=stopping and stops fetching.
 */
bool role_drain_begins(int64_t *deadline);

/* True once the drain began and nothing is left in hand, or its deadline passed. */
bool role_drained(int64_t deadline, int in_hand);

/* Leaves the consumer group (the revoke callback runs) and frees the consumer. */
void role_close_consumer(rd_kafka_t *consumer);

#endif
