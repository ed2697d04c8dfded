/*
 * offset_tracker.h: which consumed offsets may be committed.
 *
 * A record is "open" until every destination's copy of it is delivered or durably handed
 * off to a retry step or the DLQ. Per partition, the committable offset is the low
 * watermark: one past the highest offset below which nothing is open, so with many
 * records in flight a slow copy holds back only its own partition's commit.
 * A revoked partition is forgotten once the caller let its open records finish (or gave
 * up waiting, tracker_has_open); copies still in flight for it then finish without
 * effect, and the new owner consumes from the last commit (at least once).
 */
#ifndef WAL_OFFSET_TRACKER_H
#define WAL_OFFSET_TRACKER_H

#include <stdbool.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

typedef struct offset_tracker offset_tracker;
typedef struct tracked_record tracked_record;

offset_tracker *tracker_new(void);
void tracker_free(offset_tracker *tracker);

/*
 * A consumed record with `copies` outstanding copies (0: done at once). An offset past
 * the one after the partition's last is a jump the watermark would commit over: counted
 * in wal_consumer_offsets_skipped_total{topic} and logged (event=offsets_skipped).
 */
tracked_record *tracker_open(offset_tracker *tracker, const char *topic, int32_t partition,
							 int64_t offset, int copies);

/* One copy is delivered or durably handed off. */
void tracker_copy_done(offset_tracker *tracker, tracked_record *record);

/*
 * Partitions whose low watermark moved since the last call, with the offset to commit
 * (next to consume); NULL when none moved. The caller destroys the list.
 */
rd_kafka_topic_partition_list_t *tracker_take_committable(offset_tracker *tracker);

/* Low watermarks of every tracked partition, moved or not (for a final commit). */
rd_kafka_topic_partition_list_t *tracker_all_committable(offset_tracker *tracker);

void tracker_forget(offset_tracker *tracker, const rd_kafka_topic_partition_list_t *partitions);

/*
 * Commits done offsets to the consumer's group: those that moved since the last call,
 * without waiting, or with `all` every tracked partition's, waiting for the broker. A
 * failure is logged; the offsets are committed again on a later call.
 */
void tracker_commit(offset_tracker *tracker, rd_kafka_t *consumer, bool all);

/* Partitions revoked: commits what is done, then forgets them (the new owner re-reads). */
void tracker_revoke(offset_tracker *tracker, rd_kafka_t *consumer,
					const rd_kafka_topic_partition_list_t *partitions);

/* Whether any of these partitions still has a copy under way (not done, not withdrawn). */
bool tracker_has_open(const offset_tracker *tracker,
					  const rd_kafka_topic_partition_list_t *partitions);

/*
 * A copy of r was taken back before it was sent: it counts as finished, but r is never
 * committable (the partition's next owner reads it again). NULL is ignored.
 */
void tracker_copy_withdrawn(offset_tracker *tracker, tracked_record *r);

/* Whether r belongs to one of these partitions. */
bool tracker_record_in(const tracked_record *r, const rd_kafka_topic_partition_list_t *partitions);

/* Records consumed but not yet done, across all partitions. */
int tracker_open_records(const offset_tracker *tracker);

#endif
