/* kafka_tail.c: see kafka_tail.h. */
#define _GNU_SOURCE /* memmem */
#include "kafka_tail.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

volatile sig_atomic_t kafka_tail_stop_asked = 0;

static void
on_signal(int sig)
{
	(void) sig;
	kafka_tail_stop_asked = 1;
}

int64_t
kafka_tail_wall_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t) ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t
kafka_tail_sent_stamp(const char *value, size_t len)
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

static void
fail(const char *prog, const char *what, const char *detail)
{
	fprintf(stderr, "%s: %s%s%s\n", prog, what, detail ? ": " : "", detail ? detail : "");
	exit(1);
}

static void
set(const char *prog, rd_kafka_conf_t *conf, const char *name, const char *value)
{
	char err[512];

	if (rd_kafka_conf_set(conf, name, value, err, sizeof(err)) != RD_KAFKA_CONF_OK)
		fail(prog, name, err);
}

/* The topic's metadata, once it exists with partitions (the harness creates it first). */
static const rd_kafka_metadata_t *
topic_metadata(const char *prog, rd_kafka_t *rk, const char *topic, int wait_s)
{
	rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
	int64_t deadline = kafka_tail_wall_us() + (int64_t) wait_s * 1000000;

	for (;;)
	{
		const rd_kafka_metadata_t *md = NULL;
		rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 0, rkt, &md, 5000);

		if (e == RD_KAFKA_RESP_ERR_NO_ERROR && md->topic_cnt == 1 && md->topics[0].err == 0 &&
			md->topics[0].partition_cnt > 0)
		{
			rd_kafka_topic_destroy(rkt);
			return md;
		}
		if (e == RD_KAFKA_RESP_ERR_NO_ERROR)
			rd_kafka_metadata_destroy(md);
		if (kafka_tail_wall_us() > deadline || kafka_tail_stop_asked)
			fail(prog, "topic not found", topic);
		usleep(200000);
	}
}

rd_kafka_t *
kafka_tail_open(const char *prog, const char *bootstrap, const char *topic,
				const char *const *extra_conf, int wait_s, int *partitions, int64_t *end_sum)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	const rd_kafka_metadata_t *md;
	rd_kafka_topic_partition_list_t *assignment;
	rd_kafka_t *rk;
	char err[512], group[64];

	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	set(prog, conf, "bootstrap.servers", bootstrap);
	snprintf(group, sizeof(group), "%s-%d", prog, (int) getpid());
	set(prog, conf, "group.id", group); /* required by the API; nothing is committed */
	set(prog, conf, "enable.auto.commit", "false");
	set(prog, conf, "enable.auto.offset.store", "false");
	for (int i = 0; extra_conf != NULL && extra_conf[i] != NULL; i += 2)
		set(prog, conf, extra_conf[i], extra_conf[i + 1]);
	rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
	if (rk == NULL)
		fail(prog, "consumer", err);
	rd_kafka_poll_set_consumer(rk);

	md = topic_metadata(prog, rk, topic, wait_s);
	*partitions = md->topics[0].partition_cnt;
	*end_sum = 0;
	assignment = rd_kafka_topic_partition_list_new(*partitions);
	for (int i = 0; i < *partitions; i++)
	{
		int32_t p = md->topics[0].partitions[i].id;
		int64_t low, high;
		rd_kafka_resp_err_t e = rd_kafka_query_watermark_offsets(rk, topic, p, &low, &high, 10000);

		if (e != RD_KAFKA_RESP_ERR_NO_ERROR)
			fail(prog, "no end offset for a partition", rd_kafka_err2str(e));
		rd_kafka_topic_partition_list_add(assignment, topic, p)->offset = high;
		*end_sum += high;
	}
	rd_kafka_metadata_destroy(md);
	if (rd_kafka_assign(rk, assignment) != RD_KAFKA_RESP_ERR_NO_ERROR)
		fail(prog, "assign failed", NULL);
	rd_kafka_topic_partition_list_destroy(assignment);
	return rk;
}
