/*
 * consume.c: the reader for bench/relay_latency/run. A librdkafka consumer assigned every
 * partition of TOPIC at its current end (no group offsets, nothing committed); for each
 * record whose value holds "sent_us": <epoch microseconds> it writes one line to stdout:
 *
 *   <sent_us> <produced_us> <read_us> <outbox id>
 *
 * sent_us is the enqueuing statement's clock_timestamp(), produced_us the record's Kafka
 * timestamp (CreateTime: when the relay handed it to librdkafka, ms resolution), read_us
 * when this process read it, and the outbox id (header outbox-id, -1 if none) lets the
 * harness find the record's commit time. Enqueue -> produce is the outbox's part of the
 * latency (commit, wake-up, pass), produce -> read Kafka's and the reader's.
 *
 *   consume BOOTSTRAP TOPIC
 *
 * The first line, on stderr, is "ready" once the partitions are assigned; it stops on
 * SIGTERM or SIGINT.
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
		fprintf(stderr, "consume: %s=%s: %s\n", name, value, err);
		exit(1);
	}
}

/* The number after "sent_us" (skipping quotes, colon and blanks), or -1. */
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

int
main(int argc, char **argv)
{
	rd_kafka_conf_t *conf;
	rd_kafka_t *rk;
	rd_kafka_topic_t *rkt;
	const rd_kafka_metadata_t *md = NULL;
	rd_kafka_topic_partition_list_t *assignment;
	char err[512], group[64];
	int tries = 0;

	if (argc != 3)
	{
		fprintf(stderr, "usage: consume BOOTSTRAP TOPIC\n");
		return 1;
	}
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	setvbuf(stdout, NULL, _IOLBF, 0); /* the harness counts the lines while it runs */
	conf = rd_kafka_conf_new();
	set(conf, "bootstrap.servers", argv[1]);
	snprintf(group, sizeof(group), "relay-latency-%d", (int) getpid());
	set(conf, "group.id", group);
	set(conf, "enable.auto.commit", "false");
	set(conf, "enable.auto.offset.store", "false");
	/* A fetch returns as soon as there is a byte; the wait only bounds an empty fetch. */
	set(conf, "fetch.wait.max.ms", "100");
	rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
	if (rk == NULL)
	{
		fprintf(stderr, "consume: %s\n", err);
		return 1;
	}
	rd_kafka_poll_set_consumer(rk);
	rkt = rd_kafka_topic_new(rk, argv[2], NULL);
	for (;;)
	{
		rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 0, rkt, &md, 5000);

		if (e == RD_KAFKA_RESP_ERR_NO_ERROR && md->topic_cnt == 1 && md->topics[0].err == 0 &&
			md->topics[0].partition_cnt > 0)
			break;
		if (e == RD_KAFKA_RESP_ERR_NO_ERROR)
			rd_kafka_metadata_destroy(md);
		md = NULL;
		if (++tries > 150 || stop_asked)
		{
			fprintf(stderr, "consume: topic %s not found: %s\n", argv[2], rd_kafka_err2str(e));
			return 1;
		}
		usleep(200000);
	}
	assignment = rd_kafka_topic_partition_list_new(md->topics[0].partition_cnt);
	for (int i = 0; i < md->topics[0].partition_cnt; i++)
	{
		int32_t p = md->topics[0].partitions[i].id;
		int64_t low, high;

		if (rd_kafka_query_watermark_offsets(rk, argv[2], p, &low, &high, 10000) !=
			RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			fprintf(stderr, "consume: no end offset for partition %d\n", p);
			return 1;
		}
		rd_kafka_topic_partition_list_add(assignment, argv[2], p)->offset = high;
	}
	rd_kafka_metadata_destroy(md);
	rd_kafka_topic_destroy(rkt);
	if (rd_kafka_assign(rk, assignment) != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		fprintf(stderr, "consume: assign failed\n");
		return 1;
	}
	rd_kafka_topic_partition_list_destroy(assignment);
	fprintf(stderr, "ready\n");

	while (!stop_asked)
	{
		rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
		int64_t now = wall_us(), sent, ts;
		rd_kafka_timestamp_type_t tstype;

		if (m == NULL)
			continue;
		if (!m->err && m->payload && (sent = sent_stamp(m->payload, m->len)) > 0)
		{
			rd_kafka_headers_t *hdrs = NULL;
			const void *id = NULL;
			size_t id_len = 0;
			char idbuf[32] = "-1";

			ts = rd_kafka_message_timestamp(m, &tstype);
			if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR &&
				rd_kafka_header_get_last(hdrs, "outbox-id", &id, &id_len) ==
					RD_KAFKA_RESP_ERR_NO_ERROR &&
				id_len < sizeof(idbuf))
			{
				memcpy(idbuf, id, id_len);
				idbuf[id_len] = '\0';
			}
			printf("%" PRId64 " %" PRId64 " %" PRId64 " %s\n", sent, ts * 1000, now, idbuf);
		}
		else if (m->err && m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
			fprintf(stderr, "consume: %s\n", rd_kafka_message_errstr(m));
		rd_kafka_message_destroy(m);
	}
	fflush(stdout);
	rd_kafka_consumer_close(rk);
	rd_kafka_destroy(rk);
	return 0;
}
