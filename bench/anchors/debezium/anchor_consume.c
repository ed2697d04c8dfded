/*
 * anchor_consume.c: the reader for bench/anchors/debezium/run. A librdkafka consumer that
 * starts at the current end of every partition of TOPIC (no group offsets, nothing
 * committed), so it sees only what is produced after it said "ready", and counts the
 * messages as they become readable.
 *
 *   anchor_consume BOOTSTRAP TOPIC EXPECT TIMEOUT_S
 *
 * stdout, first line, once the partitions are assigned at their end offsets:
 *   ready partitions=<n> start=<sum of the end offsets>
 * Only the harness's records count: those whose value holds "sent_us": <epoch microseconds>
 * (plain JSON or JSON escaped inside a string); anything else (warm-up records, a replayed
 * one) is counted apart as "other". When EXPECT records were read (EXPECT 0: when SIGTERM or
 * SIGINT arrives), or after TIMEOUT_S seconds, one line:
 *   count=<n> first_us=<epoch us> last_us=<epoch us> other=<n> p50_ms=<ms> p99_ms=<ms> max_ms=<ms>
 * first_us/last_us: the wall clock (CLOCK_REALTIME) when the first and the last record were
 * read; latency = read time minus the record's stamp (p50/p99 by nearest rank).
 * Exit status 2 on timeout with fewer than EXPECT records, 1 on other errors.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "../../common/kafka_tail.h"

static int
cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *) a, y = *(const int64_t *) b;

	return (x > y) - (x < y);
}

static double
percentile_ms(const int64_t *sorted, long n, double q)
{
	long i;

	if (n == 0)
		return 0.0;
	i = (long) (q * (double) n + 0.999999) - 1; /* nearest rank */
	if (i < 0)
		i = 0;
	if (i >= n)
		i = n - 1;
	return sorted[i] / 1000.0;
}

int
main(int argc, char **argv)
{
	rd_kafka_t *rk;
	const char *bootstrap, *topic;
	long expect, count = 0, other = 0, lat_cap = 0;
	int64_t *lat = NULL, first_us = 0, last_us = 0, start_sum = 0, deadline_us;
	double timeout_s;
	int partitions = 0, rc = 0;

	if (argc != 5)
	{
		fprintf(stderr, "usage: anchor_consume BOOTSTRAP TOPIC EXPECT TIMEOUT_S\n");
		return 1;
	}
	bootstrap = argv[1];
	topic = argv[2];
	expect = atol(argv[3]);
	timeout_s = atof(argv[4]);
	deadline_us = kafka_tail_wall_us() + (int64_t) (timeout_s * 1e6);
	rk = kafka_tail_open("anchor_consume", bootstrap, topic, NULL, (int) timeout_s, &partitions,
						 &start_sum);
	printf("ready partitions=%d start=%" PRId64 "\n", partitions, start_sum);
	fflush(stdout);

	while (!kafka_tail_stop_asked && (expect == 0 || count < expect))
	{
		rd_kafka_message_t *m;
		int64_t now;

		if (kafka_tail_wall_us() > deadline_us)
		{
			fprintf(stderr, "anchor_consume: timed out after %.0f s with %ld of %ld messages\n",
					timeout_s, count, expect);
			rc = expect > 0 ? 2 : 0;
			break;
		}
		m = rd_kafka_consumer_poll(rk, 100);
		if (m == NULL)
			continue;
		if (m->err)
		{
			if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
				fprintf(stderr, "anchor_consume: %s\n", rd_kafka_message_errstr(m));
			rd_kafka_message_destroy(m);
			continue;
		}
		now = kafka_tail_wall_us();
		{
			int64_t sent = m->payload ? kafka_tail_sent_stamp(m->payload, m->len) : -1;

			if (sent <= 0)
				other++;
			else
			{
				if (count == lat_cap)
				{
					lat_cap = lat_cap ? lat_cap * 2 : 65536;
					lat = realloc(lat, lat_cap * sizeof(*lat));
					if (lat == NULL)
					{
						fprintf(stderr, "anchor_consume: out of memory\n");
						return 1;
					}
				}
				lat[count] = now - sent;
				if (count == 0)
					first_us = now;
				last_us = now;
				count++;
			}
		}
		rd_kafka_message_destroy(m);
	}

	if (count > 0)
		qsort(lat, count, sizeof(*lat), cmp_i64);
	printf("count=%ld first_us=%" PRId64 " last_us=%" PRId64
		   " other=%ld p50_ms=%.2f p99_ms=%.2f max_ms=%.2f\n",
		   count, first_us, last_us, other, percentile_ms(lat, count, 0.50),
		   percentile_ms(lat, count, 0.99), count ? lat[count - 1] / 1000.0 : 0.0);
	fflush(stdout);
	free(lat);
	rd_kafka_consumer_close(rk);
	rd_kafka_destroy(rk);
	return rc;
}
