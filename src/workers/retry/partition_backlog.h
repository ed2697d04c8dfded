/*
 * partition_backlog.h: how many messages wait in some partitions, measured in the
 * background.
 *
 * Backlog = the partition's end (high watermark) minus the group's committed offset:
 * every message not yet done, fetched or not. Both need a round trip to the broker, so a
 * thread of its own asks every interval and the worker's loop only reads the last answer;
 * a paused partition is measured too (librdkafka's cached watermarks go stale while a
 * partition is paused).
 */
#ifndef WAL_PARTITION_BACKLOG_H
#define WAL_PARTITION_BACKLOG_H

#include <stdbool.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

typedef struct partition_backlog partition_backlog;

partition_backlog *partition_backlog_start(rd_kafka_t *consumer, long interval_ms);

/* Measure this partition from now on (on) or no longer (off). */
void partition_backlog_watch(partition_backlog *pb, const char *topic, int32_t partition, bool on);

/* The last measurement, -1 when there is none yet. */
int64_t partition_backlog_get(partition_backlog *pb, const char *topic, int32_t partition);

/* Stops the thread (waits for its current round). */
void partition_backlog_stop(partition_backlog *pb);

#endif
