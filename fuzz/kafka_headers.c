/*
 * kafka_headers.c (fuzz target): how the workers read a Kafka message's headers:
 * handoff_message_from_kafka and kafka_header_value (consume, src/workers/common/handoff.c),
 * retry_message_read (retry, src/workers/retry/retry_message.c) and dlq_message_read
 * (dlq, src/workers/dlq/dlq_message.c).
 *
 * They all reach the headers through rd_kafka_message_headers(), which only works on a
 * message librdkafka made (it reads the rd_kafka_msg_t around the public struct), so a
 * hand-filled rd_kafka_message_t will not do. The message is made by librdkafka itself:
 * a producer with no broker queues it with the fuzzed headers and payload, rd_kafka_purge
 * fails it at once, and the delivery report hands back the real message, headers
 * attached. Its partition and offset, which a purged message lacks, are set there from
 * the input, as a consumed message would carry them. Nothing reaches the network.
 *
 * Input: meta||payload||name||value||name||value...
 *   meta     numbers: the retry step (1..3), partition, offset, which topic the message
 *            came from (0..2), the time scale (0: 1x); then letters: N for no payload.
 *   value    "<null>" for a header with no value (a null in Kafka).
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <limits.h>

#include <jansson.h>
#include <librdkafka/rdkafka.h>

#include "common/control_plane.h"
#include "common/handoff.h"
#include "dlq/dlq_message.h"
#include "fuzz_util.h"
#include "retry/retry_message.h"
#include "shared/record_contract.h"

#define MAX_HEADERS 64
#define NOW_MS      1767225600000LL /* 2026-01-01 */

static const char *const topics[] = {
	"orders", "wal.retry.2",
	"t.aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" /* 249 bytes */
};

/* Two destinations as the control plane describes them. */
static const char config_json[] =
	"{\"version\": 7, \"settings\": {\"retry_topic_prefix\": \"wal.retry.\", \"dlq_topic\": "
	"\"wal.dlq\"}, \"destinations\": ["
	"{\"name\": \"hooks\", \"endpoint\": \"http://127.0.0.1:9/\", \"timeout_ms\": 5000, "
	"\"max_in_flight\": 8, \"retry_delays_ms\": [1000, 60000, 600000], \"retry_jitter\": 0.2},"
	"{\"name\": \"slow\", \"endpoint\": \"http://127.0.0.1:9/\", \"timeout_ms\": 5000, "
	"\"max_in_flight\": 1, \"retry_delays_ms\": [3600000, 86400000, 604800000], "
	"\"retry_jitter\": 1.0}]}";

typedef struct header
{
	const char *name; /* as librdkafka keeps it: NUL-terminated after its bytes */
	size_t name_len;
	const char *value; /* NULL: no value */
	size_t value_len;
} header;

typedef struct job
{
	int step;
	int32_t partition;
	int64_t offset;
	const char *topic;
	double time_scale;
	const char *payload; /* NULL: none */
	size_t payload_len;
	header headers[MAX_HEADERS];
	int n_headers;
	bool done;
} job;

static rd_kafka_t *producer;
static control_plane_config *config;

/* The first header named name, as librdkafka finds it: the whole name, a NUL in it
 * included, equal to the C string name. */
static const header *
first_header(const job *j, const char *name)
{
	size_t len = strlen(name);

	for (int i = 0; i < j->n_headers; i++)
		if (j->headers[i].name_len == len && memcmp(j->headers[i].name, name, len) == 0)
			return &j->headers[i];
	return NULL;
}

/* The value the workers take from a header: present, and no NUL inside. */
static const header *
usable_header(const job *j, const char *name)
{
	const header *h = first_header(j, name);

	return h && h->value && memchr(h->value, '\0', h->value_len) == NULL ? h : NULL;
}

static bool
equals_header(const char *s, const header *h)
{
	return s != NULL && strlen(s) == h->value_len && memcmp(s, h->value, h->value_len) == 0;
}

/* The digits of a header as a number in [0, max], the way the DLQ must read them. */
static bool
digits_value(const job *j, const char *name, int64_t max, int64_t *out)
{
	const header *h = first_header(j, name);
	int64_t v = 0;

	if (h == NULL || h->value == NULL || h->value_len == 0)
		return false;
	for (size_t i = 0; i < h->value_len; i++)
	{
		int d = h->value[i] - '0';

		if (d < 0 || d > 9 || v > (max - d) / 10)
			return false;
		v = v * 10 + d;
	}
	*out = v;
	return true;
}

static void
check_handoff(const job *j, const rd_kafka_message_t *rkm, bool origin_from_headers)
{
	handoff_message m;
	const header *h;

	handoff_message_from_kafka(&m, rkm, origin_from_headers);
	h = usable_header(j, "source-topic");
	if (origin_from_headers && h)
		FUZZ_CHECK(equals_header(m.source_topic, h));
	else
		FUZZ_CHECK(strcmp(m.source_topic, j->topic) == 0);
	h = usable_header(j, "idempotency-key");
	if (h)
		FUZZ_CHECK(equals_header(m.idempotency_key, h));
	else
	{
		/* The record's place in Kafka (handoff.c keeps at most 511 bytes of it). */
		char fallback[8192];
		size_t len = strlen(m.idempotency_key);

		snprintf(fallback, sizeof(fallback), "%s-%" PRId32 "-%" PRId64, m.source_topic,
				 j->partition, j->offset);
		FUZZ_CHECK(len > 0 && len <= 511 && strncmp(m.idempotency_key, fallback, len) == 0);
		FUZZ_CHECK(len == 511 || len == strlen(fallback));
	}
	h = usable_header(j, "content-type");
	FUZZ_CHECK(h ? equals_header(m.content_type, h) : m.content_type == NULL);
	h = usable_header(j, "outbox-id");
	FUZZ_CHECK(h ? equals_header(m.outbox_id, h) : m.outbox_id == NULL);
	h = usable_header(j, "created-at");
	FUZZ_CHECK(h ? equals_header(m.created_at, h) : m.created_at == NULL);
	FUZZ_CHECK(m.payload_len == j->payload_len && m.payload[m.payload_len] == '\0');
	FUZZ_CHECK(j->payload_len == 0 || memcmp(m.payload, j->payload, j->payload_len) == 0);
	FUZZ_CHECK(m.source_partition == j->partition && m.source_offset == j->offset);
	handoff_message_clear(&m);
}

static void
check_retry(const job *j, const rd_kafka_message_t *rkm)
{
	retry_message m;
	const header *destination = usable_header(j, "destination");

	retry_message_read(&m, rkm, j->step, config, j->time_scale, NOW_MS);
	FUZZ_CHECK(m.step == j->step);
	FUZZ_CHECK(m.attempt >= 0 && m.attempt < 1000000);
	FUZZ_CHECK(destination ? equals_header(m.destination, destination) : m.destination == NULL);
	FUZZ_CHECK(m.due_ms >= m.earliest_ms);
	if (m.bad != NULL)
		FUZZ_CHECK(m.bad[0] != '\0');
	else
		FUZZ_CHECK(m.destination && config_find_destination(config, m.destination) != NULL);
	if (m.clock_jump)
		FUZZ_CHECK(m.due_ms == NOW_MS && m.earliest_ms == NOW_MS);
	retry_message_clear(&m);
}

static void
check_text(const char *s, const job *j, const char *name)
{
	FUZZ_CHECK((s != NULL) == (first_header(j, name) != NULL));
	if (s)
		FUZZ_CHECK(fuzz_utf8_invalid_at(s, strlen(s)) < 0);
}

static void
check_dlq(const job *j, const rd_kafka_message_t *rkm)
{
	dlq_message m;
	json_t *all;
	int64_t v;

	dlq_message_read(&m, rkm);
	check_text(m.topic, j, "source-topic");
	check_text(m.idempotency_key, j, "idempotency-key");
	check_text(m.destination, j, "destination");
	check_text(m.content_type, j, "content-type");
	check_text(m.last_error, j, "last-error");
	FUZZ_CHECK(m.has_outbox_id == digits_value(j, "outbox-id", INT64_MAX, &v));
	if (m.has_outbox_id)
		FUZZ_CHECK(m.outbox_id == v);
	FUZZ_CHECK(m.has_attempt == digits_value(j, "attempt", INT32_MAX, &v));
	if (m.has_attempt)
		FUZZ_CHECK(m.attempt == v);
	/* It goes into a jsonb column as is. */
	FUZZ_CHECK(m.headers_json != NULL);
	all = json_loads(m.headers_json, 0, NULL);
	FUZZ_CHECK(json_is_object(all));
	FUZZ_CHECK(json_object_size(all) <= (size_t) j->n_headers);
	json_decref(all);
	dlq_message_clear(&m);
}

static void
on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *rkm, void *opaque)
{
	job *j = rkm->_private;
	/* A purged message has no place in a partition yet; a consumed one has. */
	rd_kafka_message_t *consumed = (rd_kafka_message_t *) rkm;

	consumed->partition = j->partition;
	consumed->offset = j->offset;
	FUZZ_CHECK(strcmp(rd_kafka_topic_name(rkm->rkt), j->topic) == 0);

	for (int i = 0; i < j->n_headers; i++)
	{
		char *value = kafka_header_value(rkm, j->headers[i].name);
		const header *h = usable_header(j, j->headers[i].name);

		FUZZ_CHECK(h ? equals_header(value, h) : value == NULL);
		free(value);
	}
	check_handoff(j, rkm, true);
	check_handoff(j, rkm, false);
	check_retry(j, rkm);
	check_dlq(j, rkm);
	j->done = true;
}

static void
quiet(const rd_kafka_t *rk, int level, const char *facility, const char *message)
{
}

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	char errbuf[512];

	/* No bootstrap.servers: nothing is ever sent; messages wait until purged. */
	if (rd_kafka_conf_set(conf, "message.timeout.ms", "0", errbuf, sizeof(errbuf)) !=
		RD_KAFKA_CONF_OK)
		abort();
	rd_kafka_conf_set_log_cb(conf, quiet);
	rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
	producer = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errbuf, sizeof(errbuf));
	config = config_from_json(config_json, errbuf, sizeof(errbuf));
	if (producer == NULL || config == NULL)
	{
		fprintf(stderr, "kafka_headers: cannot start: %s\n", errbuf);
		abort();
	}
	return 0;
}

/* meta: numbers separated by anything, then letters. */
static void
read_meta(job *j, fuzz_field meta)
{
	char *text = fuzz_cstring(meta), *p = text, *end;
	long long numbers[5] = {1, 0, 0, 0, 0};

	for (int i = 0; i < 5 && *p; i++)
	{
		while (*p && !(*p >= '0' && *p <= '9') && *p != '-')
			p++;
		numbers[i] = strtoll(p, &end, 10);
		if (end == p)
			break;
		p = end;
	}
	j->step = (int) ((numbers[0] % 3 + 3) % 3) + 1;
	j->partition = (int32_t) numbers[1];
	j->offset = numbers[2];
	j->topic = topics[(numbers[3] % 3 + 3) % 3];
	j->time_scale = numbers[4] > 0 && numbers[4] <= 100000 ? (double) numbers[4] : 1.0;
	if (strchr(text, 'N'))
		j->payload = NULL, j->payload_len = 0;
	free(text);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_field f[2 + 2 * MAX_HEADERS];
	int n = fuzz_split(data, size, f, 2 + 2 * MAX_HEADERS);
	rd_kafka_headers_t *hdrs = rd_kafka_headers_new(8);
	job j = {0};
	rd_kafka_resp_err_t err;

	j.payload = n > 1 ? f[1].data : "";
	j.payload_len = n > 1 ? f[1].len : 0;
	read_meta(&j, f[0]);
	for (int i = 2; i + 1 < n && j.n_headers < MAX_HEADERS; i += 2)
	{
		header *h = &j.headers[j.n_headers++];
		bool null_value = fuzz_field_is(f[i + 1], "<null>");

		rd_kafka_header_add(hdrs, f[i].data, (ssize_t) f[i].len, null_value ? NULL : f[i + 1].data,
							null_value ? 0 : (ssize_t) f[i + 1].len);
		/* librdkafka copies the name and ends it with a NUL; so do we. */
		h->name = fuzz_cstring(f[i]);
		h->name_len = f[i].len;
		h->value = null_value ? NULL : f[i + 1].data;
		h->value_len = null_value ? 0 : f[i + 1].len;
	}
	err = rd_kafka_producev(producer, RD_KAFKA_V_TOPIC(j.topic),
							RD_KAFKA_V_VALUE((void *) j.payload, j.payload_len),
							RD_KAFKA_V_HEADERS(hdrs), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
							RD_KAFKA_V_OPAQUE(&j), RD_KAFKA_V_END);
	FUZZ_CHECK(err == RD_KAFKA_RESP_ERR_NO_ERROR);
	rd_kafka_purge(producer, RD_KAFKA_PURGE_F_QUEUE);
	for (int i = 0; i < 1000 && !j.done; i++)
		rd_kafka_poll(producer, i == 0 ? 0 : 10);
	FUZZ_CHECK(j.done);
	for (int i = 0; i < j.n_headers; i++)
		free((char *) j.headers[i].name);
	return 0;
}
