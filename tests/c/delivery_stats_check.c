/*
 * delivery_stats_check.c: a test driver for common/delivery_stats
 * (tests/integration/test_delivery_stats.py), built with a 1 s flush. Two scenarios,
 * chosen by the first argument, each printing "name value" lines:
 *
 *   bounded   against a port nothing listens on: 5000 distinct keys, more than the
 *             4096 kept; counting stays fast while flushes fail; prints the flushes
 *             that failed, the counts dropped and how long the counting took
 *   flush TOPIC DESTINATION
 *             against the database of the PG* environment: counts of each kind for
 *             TOPIC and DESTINATION and one for an unknown topic, flushed, then stops;
 *             the test reads delivery_stats
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/delivery_stats.h"
#include "common/log.h"
#include "common/metrics.h"

#include "metric_value.h"

static double
ms_since(const struct timespec *t0)
{
	struct timespec t1;

	clock_gettime(CLOCK_MONOTONIC, &t1);
	return (double) (t1.tv_sec - t0->tv_sec) * 1000 + (double) (t1.tv_nsec - t0->tv_nsec) / 1e6;
}

static int
bounded(void)
{
	delivery_stats *ds = delivery_stats_start("host=127.0.0.1 port=1 connect_timeout=1", "consume");
	struct timespec t0;
	char topic[32];
	double slowest = 0;

	if (ds == NULL)
		return 1;
	for (int round = 0; round < 3; round++)
	{
		/* Three rounds of 5000 keys, a failed flush between them. */
		clock_gettime(CLOCK_MONOTONIC, &t0);
		for (int i = 0; i < 5000; i++)
		{
			snprintf(topic, sizeof(topic), "t%d", i);
			delivery_stats_count(ds, topic, "d", STAT_DELIVERED);
		}
		if (ms_since(&t0) > slowest)
			slowest = ms_since(&t0);
		sleep(2);
	}
	printf("failed_flushes %.0f\n", metric_value("wal_delivery_stats_flushes_total{result=\"failed\"}"));
	printf("dropped %.0f\n", metric_value("wal_delivery_stats_dropped_total"));
	printf("count_5000_ms %.1f\n", slowest);
	delivery_stats_stop(ds);
	printf("stopped 1\n");
	return 0;
}

static int
flush(const char *topic, const char *destination)
{
	delivery_stats *ds = delivery_stats_start("", "retry");

	if (ds == NULL)
		return 1;
	for (int i = 0; i < 3; i++)
		delivery_stats_count(ds, topic, destination, STAT_DELIVERED);
	for (int i = 0; i < 2; i++)
		delivery_stats_count(ds, topic, destination, STAT_FAILED);
	delivery_stats_count(ds, topic, destination, STAT_DEAD_LETTERED);
	delivery_stats_count(ds, "no.such.topic", destination, STAT_DELIVERED);
	delivery_stats_count(ds, NULL, destination, STAT_DELIVERED); /* counts nothing */
	sleep(2);
	printf("ok_flushes %.0f\n", metric_value("wal_delivery_stats_flushes_total{result=\"ok\"}"));
	/* Counted after the last flush: the stop flushes them. */
	delivery_stats_count(ds, topic, destination, STAT_DELIVERED);
	delivery_stats_stop(ds);
	printf("dropped %.0f\n", metric_value("wal_delivery_stats_dropped_total"));
	return 0;
}

int
main(int argc, char **argv)
{
	log_set_role("check");
	if (argc == 2 && strcmp(argv[1], "bounded") == 0)
		return bounded();
	if (argc == 4 && strcmp(argv[1], "flush") == 0)
		return flush(argv[2], argv[3]);
	fprintf(stderr, "usage: delivery_stats_check bounded | flush TOPIC DESTINATION\n");
	return 2;
}
