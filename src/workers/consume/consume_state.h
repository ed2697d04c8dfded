/*
 * consume_state.h: what `wal-worker consume` keeps in memory, shared by its files:
 * consume.c (the role: subscriptions, Kafka, the loop) and consume_copies.c (a consumed
 * record's copies, one per destination, from the attempt to done).
 */
#ifndef WAL_CONSUME_STATE_H
#define WAL_CONSUME_STATE_H

#include <stdbool.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "common/admin_server.h"
#include "common/config_watch.h"
#include "common/delivery_stats.h"
#include "common/handoff.h"
#include "common/http_delivery.h"
#include "common/metrics.h"
#include "common/offset_tracker.h"
#include "common/pause_state.h"
#include "consume/dedupe.h"

typedef struct consumer_state
{
	const worker_options *opts;
	config_watch *watch;
	rd_kafka_t *consumer;
	rd_kafka_queue_t *records_queue; /* the consumer's queue; its records wake the loop */
	http_engine *http;
	handoff_producer *handoff;
	dedupe_set *dedupe;
	offset_tracker *tracker;
	size_t open_payload_bytes; /* the open records' payloads, which they keep until done */
	admin_server *admin;
	pause_state *pauses;   /* destinations paused by the retry consumers */
	delivery_stats *stats; /* per-topic counts for the console */
	char **subscribed;     /* topics currently subscribed */
	int n_subscribed;
	bool paused;
	bool assigned;
	int64_t next_commit_ms;
	int64_t next_forced_poll_ms; /* polls Kafka at least this often while saturated */
	int64_t shutdown_deadline;   /* 0 until a stop is requested */
	metric *delivered;
	metric *failures;
	metric *in_flight;
	metric *open_records;
	metric *config_version;
	metric *lag;
	metric *breaker_handoffs;
} consumer_state;

/* Whether this consumer delivers to d: its dedicated destination, or every shared one. */
bool consumer_serves(const consumer_state *st, const destination_config *d);

/*
 * Opens a consumed record in the offset tracker and starts one copy of it for every
 * served destination that subscribes to its topic and has not had it yet (dedupe).
 */
void handle_record(consumer_state *st, rd_kafka_message_t *rkm);

/*
 * Takes back the copies of these partitions' records still waiting in the HTTP engine
 * (never sent): their records stay uncommitted, for the partitions' next owner. Returns
 * how many.
 */
int withdraw_copies_of(consumer_state *st, const rd_kafka_topic_partition_list_t *parts);

/* The HTTP engine's start gate: nothing starts toward a paused destination. */
bool consumer_may_start(void *arg, const char *destination);

/* The hand-off producer's callback: a copy's retry or DLQ write was acknowledged. */
void on_copy_handed_off(void *opaque, void *arg);

#endif
