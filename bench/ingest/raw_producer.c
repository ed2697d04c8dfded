/*
 * raw_producer.c: the Kafka baseline of bench/ingest/run. A plain librdkafka producer with
 * the ingest service's settings for an acks -1 topic (acks=all, enable.idempotence=true,
 * linger.ms=2) keeps WINDOW messages in flight, as WINDOW HTTP connections each waiting
 * for their answer would: every delivery report produces the next message. It measures the
 * rate and each message's ack latency (produce call to delivery report).
 *
 *   raw_producer BOOTSTRAP TOPIC SECONDS PAYLOAD_BYTES WINDOW
 *
 * The payload is JSON of PAYLOAD_BYTES bytes with the five headers the ingest service adds.
 * One warm-up second is not counted. stdout gets one line:
 *   msgs_per_s=<rate> p50_ms=<ms> p99_ms=<ms> delivered=<n> failed=<n> cpu_ms=<ms>
 * (cpu_ms: the process's user + system time, warm-up included, as delivered is).
 * Exit status 1 if a message failed or something else went wrong.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <librdkafka/rdkafka.h>

#define MAX_SAMPLES 4000000

static rd_kafka_t *rk;
static const char *topic;
static char *payload;
static size_t payload_len;
static long delivered, failed, measured;
static double *latencies;
static double measure_from, measure_until;

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void
produce_one(void)
{
	double *sent = malloc(sizeof(double));
	rd_kafka_headers_t *h = rd_kafka_headers_new(4);
	char ikey[40];

	*sent = now_s();
	snprintf(ikey, sizeof(ikey), "raw-%ld", delivered + failed);
	rd_kafka_header_add(h, "idempotency-key", -1, ikey, -1);
	rd_kafka_header_add(h, "source-topic", -1, topic, -1);
	rd_kafka_header_add(h, "content-type", -1, "application/json", -1);
	rd_kafka_header_add(h, "created-at", -1, "2026-01-01T00:00:00.000000Z", -1);
	if (rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_VALUE(payload, payload_len),
						  RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
						  RD_KAFKA_V_OPAQUE(sent), RD_KAFKA_V_END) != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		fprintf(stderr, "raw_producer: produce failed\n");
		exit(1);
	}
}

static void
on_delivery(rd_kafka_t *k, const rd_kafka_message_t *m, void *opaque)
{
	double *sent = m->_private;
	double now = now_s();

	(void) k;
	(void) opaque;
	if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		delivered++;
		if (*sent >= measure_from && now <= measure_until && measured < MAX_SAMPLES)
			latencies[measured++] = (now - *sent) * 1000;
	}
	else
	{
		failed++;
		fprintf(stderr, "raw_producer: %s\n", rd_kafka_err2str(m->err));
	}
	free(sent);
	if (now < measure_until)
		produce_one(); /* keep the window full */
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

static int
by_value(const void *a, const void *b)
{
	double x = *(const double *) a, y = *(const double *) b;

	return (x > y) - (x < y);
}

int
main(int argc, char **argv)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	char err[512];
	double seconds;
	int window;
	struct rusage usage;

	if (argc != 6)
	{
		fprintf(stderr, "usage: raw_producer BOOTSTRAP TOPIC SECONDS PAYLOAD_BYTES WINDOW\n");
		return 2;
	}
	topic = argv[2];
	seconds = atof(argv[3]);
	payload_len = (size_t) atol(argv[4]);
	window = atoi(argv[5]);
	payload = malloc(payload_len + 1);
	memset(payload, 'x', payload_len);
	memcpy(payload, "{\"pad\":\"", 8);
	memcpy(payload + payload_len - 2, "\"}", 2);
	latencies = malloc(sizeof(double) * MAX_SAMPLES);

	set(conf, "bootstrap.servers", argv[1]);
	set(conf, "acks", "all");
	set(conf, "enable.idempotence", "true");
	set(conf, "linger.ms", "2");
	rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
	if (rk == NULL)
	{
		fprintf(stderr, "raw_producer: %s\n", err);
		return 1;
	}

	measure_from = now_s() + 1.0; /* warm-up: connection, producer id, leaders */
	measure_until = measure_from + seconds;
	for (int i = 0; i < window; i++)
		produce_one();
	while (now_s() < measure_until)
		rd_kafka_poll(rk, 100);
	rd_kafka_flush(rk, 10000);
	rd_kafka_destroy(rk);

	if (measured == 0)
	{
		fprintf(stderr, "raw_producer: nothing delivered\n");
		return 1;
	}
	getrusage(RUSAGE_SELF, &usage);
	qsort(latencies, (size_t) measured, sizeof(double), by_value);
	printf("msgs_per_s=%.0f p50_ms=%.2f p99_ms=%.2f delivered=%ld failed=%ld cpu_ms=%.0f\n",
		   measured / seconds, latencies[measured / 2], latencies[(long) (measured * 0.99)],
		   delivered, failed,
		   (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000.0 +
			   (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1000.0);
	return failed ? 1 : 0;
}
