/*
 * offset_tracker_check.c: a test driver for common/offset_tracker
 * (tests/integration/test_offset_tracker.py). Each scenario prints "name value" lines:
 * the offset a partition may commit (-1: none yet) and the offsets counted as skipped.
 * The log lines go to stderr, where the test reads the offsets_skipped events.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/metrics.h"
#include "common/offset_tracker.h"

#include "metric_value.h"

static double
skipped(const char *topic)
{
	char series[256];

	snprintf(series, sizeof(series), "wal_consumer_offsets_skipped_total{topic=\"%s\"}", topic);
	return metric_value(series);
}

/* The offset tracker t would commit for topic's partition 0 now, -1 when none. */
static long long
committable(offset_tracker *t, const char *topic)
{
	rd_kafka_topic_partition_list_t *all = tracker_all_committable(t);
	long long offset = -1;

	for (int i = 0; all && i < all->cnt; i++)
		if (strcmp(all->elems[i].topic, topic) == 0 && all->elems[i].partition == 0)
			offset = all->elems[i].offset;
	if (all)
		rd_kafka_topic_partition_list_destroy(all);
	return offset;
}

static void
forget(offset_tracker *t, const char *topic)
{
	rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new(1);

	rd_kafka_topic_partition_list_add(list, topic, 0);
	tracker_forget(t, list);
	rd_kafka_topic_partition_list_destroy(list);
}

int
main(void)
{
	offset_tracker *t = tracker_new();
	tracked_record *open;

	/* In a row: nothing skipped; the watermark stops at the open record. */
	tracker_open(t, "contiguous", 0, 10, 0);
	open = tracker_open(t, "contiguous", 0, 11, 1);
	tracker_open(t, "contiguous", 0, 12, 0);
	printf("contiguous_committable %lld\n", committable(t, "contiguous"));
	tracker_copy_done(t, open);
	printf("contiguous_committable_after_done %lld\n", committable(t, "contiguous"));
	printf("contiguous_skipped %.0f\n", skipped("contiguous"));

	/* 20 then 24: 21, 22 and 23 were never read. */
	tracker_open(t, "gap", 0, 20, 0);
	tracker_open(t, "gap", 0, 24, 0);
	tracker_open(t, "gap", 0, 25, 0);
	printf("gap_skipped %.0f\n", skipped("gap"));
	printf("gap_committable %lld\n", committable(t, "gap"));

	/* Read again from an earlier offset (a seek, a rewound fetch): no skip. */
	tracker_open(t, "reread", 0, 30, 0);
	tracker_open(t, "reread", 0, 31, 0);
	tracker_open(t, "reread", 0, 28, 0);
	tracker_open(t, "reread", 0, 29, 0);
	printf("reread_skipped %.0f\n", skipped("reread"));

	/* Revoked and assigned again: the next owner starts where it likes. */
	tracker_open(t, "reassigned", 0, 40, 0);
	forget(t, "reassigned");
	tracker_open(t, "reassigned", 0, 90, 0);
	printf("reassigned_skipped %.0f\n", skipped("reassigned"));

	tracker_free(t);
	return 0;
}
