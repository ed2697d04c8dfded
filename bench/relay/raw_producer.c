/*
 * raw_producer.c: the baseline for bench/relay/run. A plain librdkafka producer with the
 * relay's producer settings (acks=all, enable.idempotence=true, linger left at the
 * librdkafka default unless the extra properties set it) sends N messages of the same
 * size as the relay's records, with the same five headers the relay adds, and waits for
 * every delivery report.
 *
 *   raw_producer BOOTSTRAP TOPIC N PAYLOAD_BYTES [PROPERTIES [BATCH]]
 *
 * PROPERTIES is "name=value;name=value", applied like wal_delivery.kafka_properties.
 * BATCH > 0 waits for every delivery report after each BATCH messages before producing
 * more, as the relay does per pass (without any database work); 0 or absent: no waits.
 * TOPIC is created first if missing (3 partitions, replication factor 1,
 * min.insync.replicas 1, like the relay's bench topic). One warm-up message is delivered
 * first (connection, producer id, partition leaders: the relay is warm too), then the clock
 * runs from the first of the N produces to the last delivery report.
 * stdout gets one line:  elapsed_s=<seconds> msgs_per_s=<rate> delivered=<n> failed=<n>
 * Exit status 1 if any message failed or something else went wrong.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <librdkafka/rdkafka.h>

static long delivered = 0;
static long failed = 0;
static rd_kafka_resp_err_t first_error = RD_KAFKA_RESP_ERR_NO_ERROR;

static void
on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque)
{
	(void) rk;
	(void) opaque;
	if (msg->err == RD_KAFKA_RESP_ERR_NO_ERROR &&
		rd_kafka_message_status(msg) == RD_KAFKA_MSG_STATUS_PERSISTED)
		delivered++;
	else
	{
		failed++;
		if (first_error == RD_KAFKA_RESP_ERR_NO_ERROR)
			first_error = msg->err;
	}
}

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void
set(rd_kafka_conf_t *conf, const char *name, const char *value)
{
	char err[512];

	if (rd_kafka_conf_set(conf, name, value, err, sizeof(err)) != RD_KAFKA_CONF_OK)
	{
		fprintf(stderr, "raw_producer: %s=%s: %s\n", name, value, err);
		exit(1);
	}
}

static void
set_properties(rd_kafka_conf_t *conf, const char *properties)
{
	char *copy = strdup(properties);
	char *save = NULL;

	for (char *item = strtok_r(copy, ";", &save); item; item = strtok_r(NULL, ";", &save))
	{
		char *eq;

		while (*item == ' ')
			item++;
		if (*item == '\0')
			continue;
		eq = strchr(item, '=');
		if (eq == NULL || eq == item)
		{
			fprintf(stderr, "raw_producer: property \"%s\" is not name=value\n", item);
			exit(1);
		}
		*eq = '\0';
		set(conf, item, eq + 1);
	}
	free(copy);
}

/* Creates the topic unless it exists, then waits until every partition has a leader. */
static void
ensure_topic(rd_kafka_t *rk, const char *topic)
{
	char err[512];
	rd_kafka_NewTopic_t *nt = rd_kafka_NewTopic_new(topic, 3, 1, err, sizeof(err));
	rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
	rd_kafka_event_t *ev;
	double deadline = now_s() + 60;

	if (nt == NULL)
	{
		fprintf(stderr, "raw_producer: topic %s: %s\n", topic, err);
		exit(1);
	}
	rd_kafka_NewTopic_set_config(nt, "min.insync.replicas", "1");
	rd_kafka_CreateTopics(rk, &nt, 1, NULL, q);
	ev = rd_kafka_queue_poll(q, 30000);
	if (ev == NULL)
	{
		fprintf(stderr, "raw_producer: no answer to CreateTopics\n");
		exit(1);
	}
	if (rd_kafka_event_error(ev))
	{
		fprintf(stderr, "raw_producer: CreateTopics: %s\n", rd_kafka_event_error_string(ev));
		exit(1);
	}
	else
	{
		size_t n;
		const rd_kafka_topic_result_t **res =
			rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &n);

		for (size_t i = 0; i < n; i++)
		{
			rd_kafka_resp_err_t e = rd_kafka_topic_result_error(res[i]);

			if (e != RD_KAFKA_RESP_ERR_NO_ERROR && e != RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS)
			{
				fprintf(stderr, "raw_producer: cannot create %s: %s\n", topic,
						rd_kafka_topic_result_error_string(res[i]));
				exit(1);
			}
		}
	}
	rd_kafka_event_destroy(ev);
	rd_kafka_queue_destroy(q);
	rd_kafka_NewTopic_destroy(nt);

	for (;;)
	{
		rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
		const struct rd_kafka_metadata *md = NULL;
		int ready = 0;

		if (rd_kafka_metadata(rk, 0, rkt, &md, 5000) == RD_KAFKA_RESP_ERR_NO_ERROR &&
			md->topic_cnt == 1 && md->topics[0].err == RD_KAFKA_RESP_ERR_NO_ERROR &&
			md->topics[0].partition_cnt == 3)
		{
			ready = 1;
			for (int p = 0; p < 3; p++)
				if (md->topics[0].partitions[p].leader < 0)
					ready = 0;
		}
		if (md)
			rd_kafka_metadata_destroy(md);
		rd_kafka_topic_destroy(rkt);
		if (ready)
			return;
		if (now_s() > deadline)
		{
			fprintf(stderr, "raw_producer: topic %s has no leaders after 60 s\n", topic);
			exit(1);
		}
		rd_kafka_poll(rk, 200);
	}
}

int
main(int argc, char **argv)
{
	char err[512];
	rd_kafka_conf_t *conf;
	rd_kafka_t *rk;
	const char *topic;
	long n;
	long batch = 0;
	int payload_bytes;
	char *payload;
	char key[64], id[32], created_at[40];
	double t0, t1;

	if (argc < 5 || argc > 7)
	{
		fprintf(stderr,
				"usage: raw_producer BOOTSTRAP TOPIC N PAYLOAD_BYTES [PROPERTIES [BATCH]]\n");
		return 2;
	}
	if (argc == 7)
		batch = atol(argv[6]);
	topic = argv[2];
	n = atol(argv[3]);
	payload_bytes = atoi(argv[4]);
	if (n < 1 || payload_bytes < 32)
	{
		fprintf(stderr, "raw_producer: N must be >= 1 and PAYLOAD_BYTES >= 32\n");
		return 2;
	}

	/* The relay's producer settings (src/ext/kafka_producer.c create_producer). */
	conf = rd_kafka_conf_new();
	set(conf, "bootstrap.servers", argv[1]);
	set(conf, "client.id", "wal_delivery_bench_raw");
	set(conf, "message.timeout.ms", "30000");
	set(conf, "enable.idempotence", "true");
	set(conf, "acks", "all");
	if (argc >= 6)
		set_properties(conf, argv[5]);
	rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
	if (rk == NULL)
	{
		fprintf(stderr, "raw_producer: %s\n", err);
		return 1;
	}
	ensure_topic(rk, topic);

	/* A JSON object of exactly payload_bytes bytes: {"id":0,"pad":"<hex>"} */
	payload = malloc(payload_bytes + 1);
	{
		int head = snprintf(payload, payload_bytes, "{\"id\":0,\"pad\":\"");

		srand(42);
		for (int i = head; i < payload_bytes - 2; i++)
			payload[i] = "0123456789abcdef"[rand() % 16];
		payload[payload_bytes - 2] = '"';
		payload[payload_bytes - 1] = '}';
		payload[payload_bytes] = '\0';
	}

	/* Warm-up: one message through, so the idempotent producer has its id and connections. */
	if (rd_kafka_producev(
			rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_VALUE(payload, (size_t) payload_bytes),
			RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END) != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		fprintf(stderr, "raw_producer: warm-up produce failed\n");
		return 1;
	}
	while (delivered + failed < 1)
		rd_kafka_poll(rk, 10);
	if (failed > 0)
	{
		fprintf(stderr, "raw_producer: warm-up message failed: %s\n",
				rd_kafka_err2str(first_error));
		return 1;
	}
	delivered = 0;

	t0 = now_s();
	for (long i = 0; i < n; i++)
	{
		rd_kafka_headers_t *hdrs = rd_kafka_headers_new(8);
		time_t secs = time(NULL);
		struct tm tm;
		rd_kafka_resp_err_t e;

		/* The same five headers as the relay, with values of the same length. */
		snprintf(key, sizeof(key), "00000000-0000-4000-8000-%012ld", i);
		snprintf(id, sizeof(id), "%ld", i + 1);
		gmtime_r(&secs, &tm);
		strftime(created_at, sizeof(created_at), "%Y-%m-%dT%H:%M:%S.000000Z", &tm);
		rd_kafka_header_add(hdrs, "idempotency-key", -1, key, -1);
		rd_kafka_header_add(hdrs, "outbox-id", -1, id, -1);
		rd_kafka_header_add(hdrs, "source-topic", -1, "bench.relay", -1);
		rd_kafka_header_add(hdrs, "content-type", -1, "application/json", -1);
		rd_kafka_header_add(hdrs, "created-at", -1, created_at, -1);
		for (;;)
		{
			e = rd_kafka_producev(
				rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_VALUE(payload, (size_t) payload_bytes),
				RD_KAFKA_V_HEADERS(hdrs), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
			if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL)
				break;
			rd_kafka_poll(rk, 100);
		}
		if (e != RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			fprintf(stderr, "raw_producer: produce: %s\n", rd_kafka_err2str(e));
			rd_kafka_headers_destroy(hdrs);
			return 1;
		}
		rd_kafka_poll(rk, 0);
		if (batch > 0 && (i + 1) % batch == 0)
			while (delivered + failed < i + 1)
				rd_kafka_poll(rk, 50);
	}
	while (delivered + failed < n)
		rd_kafka_poll(rk, 50);
	t1 = now_s();

	printf("elapsed_s=%.3f msgs_per_s=%.0f delivered=%ld failed=%ld\n", t1 - t0, n / (t1 - t0),
		   delivered, failed);
	if (failed > 0)
		fprintf(stderr, "raw_producer: %ld failed, first: %s\n", failed,
				rd_kafka_err2str(first_error));
	rd_kafka_flush(rk, 10000);
	rd_kafka_destroy(rk);
	free(payload);
	return failed > 0 ? 1 : 0;
}
