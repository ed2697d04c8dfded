/*
 * kafka_tail.h: what the benchmarks' Kafka readers share (bench/relay_latency/consume.c,
 * bench/anchors/debezium/anchor_consume.c): a consumer that starts at the current end of
 * every partition of a topic, with no group offsets and nothing committed, so it sees only
 * what is produced after it is ready; and the "sent_us" stamp the harnesses put in records.
 */
#ifndef BENCH_KAFKA_TAIL_H
#define BENCH_KAFKA_TAIL_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

/* Set by SIGTERM or SIGINT once kafka_tail_open has run. */
extern volatile sig_atomic_t kafka_tail_stop_asked;

/* CLOCK_REALTIME in microseconds: comparable with Postgres's clock_timestamp(). */
int64_t kafka_tail_wall_us(void);

/* The number after "sent_us" in a record's value (plain JSON, or JSON escaped inside a
 * string: quotes, backslashes, colon and blanks are skipped), or -1 if there is none. */
int64_t kafka_tail_sent_stamp(const char *value, size_t len);

/*
 * A consumer assigned every partition of topic at its end offset. extra_conf is NULL or a
 * NULL-terminated list of name, value pairs. Waits up to wait_s for the topic to exist.
 * On success sets *partitions and *end_sum (the sum of the start offsets); on failure
 * prints "<prog>: <why>" to stderr and exits 1.
 */
rd_kafka_t *kafka_tail_open(const char *prog, const char *bootstrap, const char *topic,
							const char *const *extra_conf, int wait_s, int *partitions,
							int64_t *end_sum);

#endif
