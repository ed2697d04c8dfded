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
#define _GNU_SOURCE /* memmem */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

static volatile sig_atomic_t stop_asked = 0;

static void
on_signal(int sig)
{
	(void) sig;
	stop_asked = 1;
}

static int64_t
wall_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t) ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void
set(rd_kafka_conf_t *conf, const char *name, const char *value)
{
	char err[512];

	if (rd_kafka_conf_set(conf, name, value, err, sizeof(err)) != RD_KAFKA_CONF_OK)
	{
		fprintf(stderr, "anchor_consume: %s=%s: %s\n", name, value, err);
		exit(1);
	}
}

/* The stamp after "sent_us" (skipping the quote, backslash, colon and blanks between), or -1. */
static int64_t
sent_stamp(const char *value, size_t len)
{
	static const char key[] = "sent_us";
	const char *p = memmem(value, len, key, sizeof(key) - 1);
	const char *end = value + len;
	int64_t v = 0;
	int digits = 0;

	if (p == NULL)
		return -1;
	p += sizeof(key) - 1;
	while (p < end && (*p == '"' || *p == '\\' || *p == ':' || *p == ' '))
		p++;
	while (p < end && *p >= '0' && *p <= '9' && digits < 19)
	{
		v = v * 10 + (*p - '0');
		p++;
		digits++;
	}
	return digits > 0 ? v : -1;
}

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
	rd_kafka_conf_t *conf;
	rd_kafka_t *rk;
	rd_kafka_topic_t *rkt;
	const rd_kafka_metadata_t *md = NULL;
	rd_kafka_topic_partition_list_t *assignment;
	char err[512], group[64];
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
	deadline_us = wall_us() + (int64_t) (timeout_s * 1e6);
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);

	conf = rd_kafka_conf_new();
	set(conf, "bootstrap.servers", bootstrap);
	snprintf(group, sizeof(group), "anchor-consume-%d", (int) getpid());
	set(conf, "group.id", group); /* required by the API; nothing is committed */
	set(conf, "enable.auto.commit", "false");
	set(conf, "enable.auto.offset.store", "false");
	rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
	if (rk == NULL)
	{
		fprintf(stderr, "anchor_consume: %s\n", err);
		return 1;
	}
	rd_kafka_poll_set_consumer(rk);

	/* The topic must exist already (the harness creates it before it starts a reader). */
	rkt = rd_kafka_topic_new(rk, topic, NULL);
	for (;;)
	{
		rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 0, rkt, &md, 5000);

		if (e == RD_KAFKA_RESP_ERR_NO_ERROR && md->topic_cnt == 1 && md->topics[0].err == 0 &&
			md->topics[0].partition_cnt > 0)
			break;
		if (e == RD_KAFKA_RESP_ERR_NO_ERROR)
			rd_kafka_metadata_destroy(md);
		md = NULL;
		if (wall_us() > deadline_us || stop_asked)
		{
			fprintf(stderr, "anchor_consume: topic %s not found: %s\n", topic, rd_kafka_err2str(e));
			return 1;
		}
		usleep(200000);
	}
	partitions = md->topics[0].partition_cnt;
	assignment = rd_kafka_topic_partition_list_new(partitions);
	for (int i = 0; i < partitions; i++)
	{
		int32_t p = md->topics[0].partitions[i].id;
		int64_t low, high;
		rd_kafka_resp_err_t e = rd_kafka_query_watermark_offsets(rk, topic, p, &low, &high, 10000);

		if (e != RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			fprintf(stderr, "anchor_consume: end offset of %s [%d]: %s\n", topic, p, rd_kafka_err2str(e));
			return 1;
		}
		rd_kafka_topic_partition_list_add(assignment, topic, p)->offset = high;
		start_sum += high;
	}
	rd_kafka_metadata_destroy(md);
	rd_kafka_topic_destroy(rkt);
	if (rd_kafka_assign(rk, assignment) != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		fprintf(stderr, "anchor_consume: assign failed\n");
		return 1;
	}
	rd_kafka_topic_partition_list_destroy(assignment);
	printf("ready partitions=%d start=%" PRId64 "\n", partitions, start_sum);
	fflush(stdout);

	while (!stop_asked && (expect == 0 || count < expect))
	{
		rd_kafka_message_t *m;
		int64_t now;

		if (wall_us() > deadline_us)
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
		now = wall_us();
		{
			int64_t sent = m->payload ? sent_stamp(m->payload, m->len) : -1;

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
	printf("count=%ld first_us=%" PRId64 " last_us=%" PRId64 " other=%ld p50_ms=%.2f p99_ms=%.2f max_ms=%.2f\n",
		   count, first_us, last_us, other, percentile_ms(lat, count, 0.50),
		   percentile_ms(lat, count, 0.99), count ? lat[count - 1] / 1000.0 : 0.0);
	fflush(stdout);
	free(lat);
	rd_kafka_consumer_close(rk);
	rd_kafka_destroy(rk);
	return rc;
}
