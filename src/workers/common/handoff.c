/*
 * handoff.c: the retry/DLQ producer (see handoff.h).
 *
 * A write that Kafka did not acknowledge is queued again after a short pause instead of
 * being reported done, so a copy is never lost to a broker hiccup; the caller's offset
 * stays uncommitted meanwhile. A write Kafka refuses as too large would be refused
 * forever: it goes to the DLQ by reference instead (see refer_to_dlq).
 *
 * A fatal error of the idempotent producer (librdkafka refuses every produce from then
 * on; librdkafka 2.0 raises one after a broker restart, a sequence desynchronization it
 * fixed in 2.3) replaces the producer: every write it had not acknowledged is sent again
 * through the new one, so the worker rides out broker restarts (see replace_producer).
 */
#include "handoff.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "clock.h"
#include "fatal_error_hook.h"
#include "kafka_conf.h"
#include "log.h"
#include "metrics.h"

#define RESEND_PAUSE_MS  1000
#define REPLACE_RETRY_MS 1000 /* after a new producer could not be made */
#define PURGE_WAIT_MS    5000 /* for the purged producer's last delivery reports */

/* One write in flight, with everything needed to send it again. */
typedef struct pending_write
{
	char *topic;
	int32_t partition;
	char *key;
	char *payload;
	size_t payload_len;
	rd_kafka_headers_t *headers;
	void *opaque;
	int64_t resend_at_ms; /* 0 while in flight */
	char *dlq_topic;      /* where it goes should Kafka refuse it as too large */
	bool by_reference;    /* already that small DLQ message */
	struct pending_write *next;
} pending_write;

struct handoff_producer
{
	rd_kafka_t *rk;
	rd_kafka_conf_t *template; /* what each replacement is made from */
	bool failed;               /* rk had a fatal error: replace it */
	int64_t replace_at_ms;
	handoff_done_fn done;
	void *arg;
	int pending;
	pending_write *to_resend;
	metric *too_large;
	metric *replaced;
	metric *pending_gauge; /* every producer of the process adds its own */
};

/*
 * A header's first value in place (librdkafka NUL-terminates it). The first: the relay
 * and the hand-off write their own headers before anything a record brings, so a record
 * can never stand in for them. A value with a NUL inside is no value: cut at the NUL, two
 * different keys could become one and a record be dropped as the other's duplicate.
 */
static bool
header_view(rd_kafka_headers_t *hdrs, const char *name, const char **value, size_t *len)
{
	const void *v;
	size_t size;

	if (hdrs == NULL ||
		rd_kafka_header_get(hdrs, 0, name, &v, &size) != RD_KAFKA_RESP_ERR_NO_ERROR || v == NULL ||
		strnlen(v, size) != size)
		return false;
	*value = v;
	*len = size;
	return true;
}

/*
 * The first header named name in any case, in place (as header_view): a record's header
 * names ignore case (its "TraceParent" is its traceparent), and the relay writes them as
 * the record gave them.
 */
static bool
header_view_any_case(rd_kafka_headers_t *hdrs, const char *name, const char **value, size_t *len)
{
	const char *n;
	const void *v;
	size_t size;

	for (size_t i = 0; hdrs != NULL && rd_kafka_header_get_all(hdrs, i, &n, &v, &size) ==
										   RD_KAFKA_RESP_ERR_NO_ERROR;
		 i++)
		if (strcasecmp(n, name) == 0)
		{
			if (v == NULL || strnlen(v, size) != size)
				return false;
			*value = v;
			*len = size;
			return true;
		}
	return false;
}

char *
kafka_header_value(const rd_kafka_message_t *rkm, const char *name)
{
	rd_kafka_headers_t *hdrs = NULL;
	const char *value;
	size_t len;

	if (rd_kafka_message_headers(rkm, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR ||
		!header_view(hdrs, name, &value, &len))
		return NULL;
	return strndup(value, len);
}

/* Copies n bytes to *cursor as a C string and moves the cursor past it. */
static char *
pack(char **cursor, const char *s, size_t n)
{
	char *start = *cursor;

	memcpy(start, s, n);
	start[n] = '\0';
	*cursor += n + 1;
	return start;
}

enum
{
	TOPIC,
	KEY,
	CONTENT_TYPE,
	OUTBOX_ID,
	CREATED_AT,
	TRACEPARENT,
	TRACESTATE,
	N_FIELDS
};

/* What a message says of itself, in place: header values and the topic name are
 * NUL-terminated by librdkafka and live as long as the message. */
typedef struct message_fields
{
	const char *value[N_FIELDS];
	size_t len[N_FIELDS];
	char fallback_key[512];
} message_fields;

static void
read_fields(message_fields *f, const rd_kafka_message_t *rkm, bool origin_from_headers)
{
	static const char *const names[N_FIELDS] = {
		"source-topic", "idempotency-key",  "content-type",   "outbox-id",
		"created-at",   TRACEPARENT_HEADER, TRACESTATE_HEADER};
	rd_kafka_headers_t *hdrs = NULL;

	memset(f->value, 0, sizeof(f->value));
	memset(f->len, 0, sizeof(f->len));
	if (rd_kafka_message_headers(rkm, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR)
		hdrs = NULL;
	for (int i = 0; i < N_FIELDS; i++)
		if (i == TRACEPARENT || i == TRACESTATE)
			header_view_any_case(hdrs, names[i], &f->value[i], &f->len[i]);
		else if (i != TOPIC || origin_from_headers)
			header_view(hdrs, names[i], &f->value[i], &f->len[i]);
	if (f->value[TOPIC] == NULL)
	{
		f->value[TOPIC] = rd_kafka_topic_name(rkm->rkt);
		f->len[TOPIC] = strlen(f->value[TOPIC]);
	}
	if (f->value[KEY] == NULL)
	{
		/* Not written by the relay: the record's place in Kafka is its identity. */
		snprintf(f->fallback_key, sizeof(f->fallback_key), "%.*s-%d-%" PRId64, (int) f->len[TOPIC],
				 f->value[TOPIC], rkm->partition, rkm->offset);
		f->value[KEY] = f->fallback_key;
		f->len[KEY] = strlen(f->fallback_key);
	}
}

static void *
must_alloc(size_t bytes)
{
	void *p = malloc(bytes);

	if (p == NULL)
	{
		log_error("event=out_of_memory bytes=%zu msg=\"cannot keep a consumed record\"", bytes);
		abort();
	}
	return p;
}

void
handoff_message_from_kafka(handoff_message *m, const rd_kafka_message_t *rkm,
						   bool origin_from_headers)
{
	message_fields f;
	size_t total = rkm->len + 1;
	char *cursor;

	read_fields(&f, rkm, origin_from_headers);
	for (int i = 0; i < N_FIELDS; i++)
		total += f.value[i] ? f.len[i] + 1 : 0;

	memset(m, 0, sizeof(*m));
	cursor = m->block = must_alloc(total);
	m->source_topic = pack(&cursor, f.value[TOPIC], f.len[TOPIC]);
	m->idempotency_key = pack(&cursor, f.value[KEY], f.len[KEY]);
	m->content_type =
		f.value[CONTENT_TYPE] ? pack(&cursor, f.value[CONTENT_TYPE], f.len[CONTENT_TYPE]) : NULL;
	m->outbox_id = f.value[OUTBOX_ID] ? pack(&cursor, f.value[OUTBOX_ID], f.len[OUTBOX_ID]) : NULL;
	m->created_at =
		f.value[CREATED_AT] ? pack(&cursor, f.value[CREATED_AT], f.len[CREATED_AT]) : NULL;
	m->traceparent =
		f.value[TRACEPARENT] ? pack(&cursor, f.value[TRACEPARENT], f.len[TRACEPARENT]) : NULL;
	m->tracestate =
		f.value[TRACESTATE] ? pack(&cursor, f.value[TRACESTATE], f.len[TRACESTATE]) : NULL;
	m->payload = pack(&cursor, rkm->payload ? rkm->payload : "", rkm->len);
	m->payload_len = rkm->len;
	m->source_partition = rkm->partition;
	m->source_offset = rkm->offset;
	handoff_message_read_trace(m);
}

void
handoff_message_read_trace(handoff_message *m)
{
	/* One that cannot be read (not from a door that checks it) is no context. */
	m->has_trace = m->traceparent != NULL &&
				   trace_context_parse(m->traceparent, strlen(m->traceparent), &m->trace) == NULL;
}

void
handoff_message_clear(handoff_message *m)
{
	free(m->block);
	memset(m, 0, sizeof(*m));
}

const char *
handoff_target_name(handoff_target target)
{
	switch (target)
	{
		case HANDOFF_RETRY_STEP_1:
			return "retry.1";
		case HANDOFF_RETRY_STEP_2:
			return "retry.2";
		case HANDOFF_RETRY_STEP_3:
			return "retry.3";
		case HANDOFF_DLQ:
			return "dlq";
	}
	return "?";
}

static bool
is_too_large(rd_kafka_resp_err_t err)
{
	return err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE ||
		   err == RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE;
}

/*
 * The record's trace context travels with every copy, so each attempt of every step, and
 * a dead letter and its replay, continue the record's trace. Its names are the record's,
 * not the hand-off's own: a record brings them.
 */
static void
add_trace_headers(rd_kafka_headers_t *h, const char *traceparent, size_t traceparent_len,
				  const char *tracestate, size_t tracestate_len)
{
	if (traceparent != NULL)
		rd_kafka_header_add(h, TRACEPARENT_HEADER, -1, traceparent, (ssize_t) traceparent_len);
	if (tracestate != NULL)
		rd_kafka_header_add(h, TRACESTATE_HEADER, -1, tracestate, (ssize_t) tracestate_len);
}

static void
add_header(rd_kafka_headers_t *h, const char *name, const char *value)
{
	if (value != NULL)
		rd_kafka_header_add(h, name, -1, value, -1);
}

/* A header's value as a string for a message, "?" when the write has none. */
static const char *
header_or_unknown(rd_kafka_headers_t *hdrs, const char *name)
{
	const char *value;
	size_t len;

	return header_view(hdrs, name, &value, &len) ? value : "?";
}

/* The trace id of the record a write copies, from its traceparent header; NULL: none. */
static const char *
write_trace_id(rd_kafka_headers_t *hdrs, trace_context *tc)
{
	const char *value;
	size_t len;

	if (!header_view(hdrs, TRACEPARENT_HEADER, &value, &len) ||
		trace_context_parse(value, len, tc) != NULL)
		return NULL;
	return tc->trace_id;
}

/* A log line about the record a write copies (log_record's fields), from its headers. */
#define log_write(level, w, ...)                                                                   \
	do                                                                                             \
	{                                                                                              \
		trace_context tc_;                                                                         \
		log_record(level, header_or_unknown((w)->headers, "source-topic"), (w)->key,               \
				   write_trace_id((w)->headers, &tc_), __VA_ARGS__);                               \
	} while (0)

/*
 * Kafka will never take this copy (the payload and our headers are over the topic's
 * max.message.bytes or the producer's message.max.bytes): trying again would hold the
 * caller's offset for good. It becomes a small DLQ message that says where the record is
 * (its outbox id, source topic, partition and offset, and why), the payload omitted;
 * the record stays in its source topic and, for its idempotency window, in the outbox.
 */
static void
refer_to_dlq(handoff_producer *p, pending_write *w, rd_kafka_resp_err_t err)
{
	static const char *const kept[] = {
		"idempotency-key",  "content-type",  "outbox-id",   "created-at", "source-topic",
		"source-partition", "source-offset", "destination", "attempt",    "step-entered-at"};
	rd_kafka_headers_t *h = rd_kafka_headers_new(16);
	char error[1024];

	for (size_t i = 0; i < sizeof(kept) / sizeof(kept[0]); i++)
	{
		const char *value;
		size_t len;

		if (header_view(w->headers, kept[i], &value, &len))
			rd_kafka_header_add(h, kept[i], -1, value, (ssize_t) len);
	}
	{
		const char *tp = NULL, *ts = NULL;
		size_t tp_len = 0, ts_len = 0;

		header_view(w->headers, TRACEPARENT_HEADER, &tp, &tp_len);
		header_view(w->headers, TRACESTATE_HEADER, &ts, &ts_len);
		add_trace_headers(h, tp, tp_len, ts, ts_len);
	}
	snprintf(
		error, sizeof(error),
		"Kafka refused the hand-off to %s as too large (%s, %zu bytes of payload); sent to the "
		"DLQ by reference, payload omitted: the record is in %s partition %s offset %s "
		"(outbox id %s)",
		w->topic, rd_kafka_err2str(err), w->payload_len,
		header_or_unknown(w->headers, "source-topic"),
		header_or_unknown(w->headers, "source-partition"),
		header_or_unknown(w->headers, "source-offset"), header_or_unknown(w->headers, "outbox-id"));
	add_header(h, "last-error", error);
	add_header(h, "payload-omitted", "true");
	log_write(LOG_WARN, w,
			  "event=handoff_too_large to=%s bytes=%zu error=\"%s\" msg=\"sent to the DLQ by "
			  "reference, payload omitted\"",
			  w->topic, w->payload_len, rd_kafka_err2str(err));
	metric_add(p->too_large, 1, NULL);

	rd_kafka_headers_destroy(w->headers);
	w->headers = h;
	free(w->topic);
	w->topic = strdup(w->dlq_topic);
	w->partition = RD_KAFKA_PARTITION_UA;
	w->payload[0] = '\0';
	w->payload_len = 0;
	w->by_reference = true;
}

/*
 * Queues w to be produced again: at once when it became a DLQ reference, after a pause
 * otherwise. A reference refused as too large as well is tried again like any write.
 */
static void
send_again(handoff_producer *p, pending_write *w, rd_kafka_resp_err_t err, const char *event)
{
	if (is_too_large(err) && !w->by_reference)
	{
		refer_to_dlq(p, w, err);
		w->resend_at_ms = now_ms();
	}
	else
	{
		log_write(LOG_WARN, w, "event=%s to=%s error=\"%s\" msg=\"trying again\"", event, w->topic,
				  rd_kafka_err2str(err));
		w->resend_at_ms = now_ms() + RESEND_PAUSE_MS;
	}
	w->next = p->to_resend;
	p->to_resend = w;
}

static void
produce(handoff_producer *p, pending_write *w)
{
	rd_kafka_resp_err_t err = rd_kafka_producev(
		p->rk, RD_KAFKA_V_TOPIC(w->topic), RD_KAFKA_V_PARTITION(w->partition),
		RD_KAFKA_V_KEY(w->key, strlen(w->key)), RD_KAFKA_V_VALUE(w->payload, w->payload_len),
		RD_KAFKA_V_HEADERS(rd_kafka_headers_copy(w->headers)),
		RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_OPAQUE(w), RD_KAFKA_V_END);

	w->resend_at_ms = 0;
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
		send_again(p, w, err, "handoff_produce_failed");
}

static void
free_write(pending_write *w)
{
	free(w->topic);
	free(w->key);
	free(w->payload);
	free(w->dlq_topic);
	rd_kafka_headers_destroy(w->headers);
	free(w);
}

static void
on_delivery(rd_kafka_t *rk __attribute__((unused)), const rd_kafka_message_t *rkm, void *opaque)
{
	handoff_producer *p = opaque;
	pending_write *w = rkm->_private;

	if (rkm->err == RD_KAFKA_RESP_ERR_NO_ERROR &&
		rd_kafka_message_status(rkm) == RD_KAFKA_MSG_STATUS_PERSISTED)
	{
		p->pending--;
		metric_add(p->pending_gauge, -1, NULL);
		p->done(w->opaque, p->arg);
		free_write(w);
		return;
	}
	send_again(p, w, rkm->err, "handoff_not_acknowledged");
}

/* Served by rd_kafka_poll on the caller's thread: the replacement waits for handoff_poll. */
static void
on_error(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	handoff_producer *p = opaque;
	char why[512];

	if (err != RD_KAFKA_RESP_ERR__FATAL)
	{
		kafka_log_error(rk, err, reason);
		return;
	}
	log_error("event=kafka_fatal_error client=%s code=%s error=\"%s\" msg=\"the hand-off producer "
			  "is replaced; writes it did not acknowledge are sent again\"",
			  rd_kafka_name(rk), rd_kafka_err2name(rd_kafka_fatal_error(rk, why, sizeof(why))),
			  why);
	if (rk == p->rk) /* not a late report of the producer being replaced */
		p->failed = true;
}

/*
 * A new producer first, then the failed one's writes: purged (queued and in flight), their
 * delivery reports, served by the old producer, put each write Kafka had not stored in
 * the resend queue (one it stored but could not confirm is sent again: a duplicate
 * hand-off rather than a lost one). The purged producer is destroyed after.
 */
static void
replace_producer(handoff_producer *p)
{
	char errbuf[512];
	rd_kafka_conf_t *conf = rd_kafka_conf_dup(p->template);
	rd_kafka_t *fresh = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errbuf, sizeof(errbuf));
	rd_kafka_t *old = p->rk;
	int64_t give_up = now_ms() + PURGE_WAIT_MS;

	if (fresh == NULL) /* conf is still ours: rd_kafka_new frees it only on success */
	{
		rd_kafka_conf_destroy(conf);
		log_error("event=handoff_producer_not_replaced error=\"%s\" msg=\"trying again in %d ms\"",
				  errbuf, REPLACE_RETRY_MS);
		p->replace_at_ms = now_ms() + REPLACE_RETRY_MS;
		return;
	}
	p->rk = fresh;
	p->failed = false;
	rd_kafka_purge(old, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
	while (rd_kafka_outq_len(old) > 0 && now_ms() < give_up)
		rd_kafka_poll(old, 100);
	rd_kafka_destroy(old);
	metric_add(p->replaced, 1, NULL);
	log_info("event=handoff_producer_replaced client=%s pending=%d", rd_kafka_name(fresh),
			 p->pending);
}

handoff_producer *
handoff_producer_new(const worker_options *opts, const control_plane_config *config,
					 handoff_done_fn done, void *arg, char *errbuf, size_t errbuf_size)
{
	kafka_default defaults[] = {
		{"acks", "all"},
		{"enable.idempotence", "true"},
		{"client.id", "wal-worker-handoff"},
		{"linger.ms", "5"},
		{"message.max.bytes", KAFKA_MESSAGE_MAX_BYTES},
	};
	rd_kafka_conf_t *conf =
		kafka_conf_build(defaults, sizeof(defaults) / sizeof(defaults[0]),
						 config->kafka_bootstrap_servers, opts, errbuf, errbuf_size);
	handoff_producer *p;

	if (conf == NULL)
		return NULL;
	p = calloc(1, sizeof(*p));
	p->done = done;
	p->arg = arg;
	p->too_large = metric_counter("wal_handoff_too_large_total",
								  "Hand-offs Kafka refused as too large, sent to the DLQ by "
								  "reference with the payload omitted",
								  0, NULL);
	p->replaced = metric_counter("wal_handoff_producer_replaced_total",
								 "Hand-off producers replaced after a fatal Kafka error; their "
								 "unacknowledged writes were sent again",
								 0, NULL);
	p->pending_gauge = metric_gauge("wal_handoffs_pending",
									"Hand-offs to a retry step or the DLQ that Kafka has not "
									"acknowledged yet (their records' offsets wait)",
									0, NULL);
	rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
	rd_kafka_conf_set_error_cb(conf, on_error);
	rd_kafka_conf_set_opaque(conf, p);
	p->template = rd_kafka_conf_dup(conf);
	p->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errbuf, errbuf_size);
	if (p->rk == NULL)
	{
		rd_kafka_conf_destroy(conf);
		rd_kafka_conf_destroy(p->template);
		free(p);
		return NULL;
	}
	return p;
}

void
handoff_send(handoff_producer *p, const control_plane_config *config,
			 const destination_config *destination, const char *destination_name,
			 const handoff_message *m, handoff_target target, int attempt, const char *error,
			 long not_before_s, void *opaque)
{
	pending_write *w = calloc(1, sizeof(*w));
	char number[64];
	int64_t entered = wall_ms();

	if (target == HANDOFF_DLQ)
	{
		w->topic = strdup(config->dlq_topic);
		w->partition = RD_KAFKA_PARTITION_UA;
	}
	else
	{
		size_t len = strlen(config->retry_topic_prefix) + 4;

		w->topic = malloc(len);
		snprintf(w->topic, len, "%s%d", config->retry_topic_prefix, (int) target);
		/* A destination deleted meanwhile has no partition: partition 0 keeps the copy. */
		w->partition = destination ? destination->retry_partition : 0;
	}
	w->key = strdup(m->idempotency_key);
	w->payload = malloc(m->payload_len + 1);
	memcpy(w->payload, m->payload, m->payload_len);
	w->payload[m->payload_len] = '\0';
	w->payload_len = m->payload_len;
	w->opaque = opaque;
	w->dlq_topic = strdup(config->dlq_topic);
	w->headers = rd_kafka_headers_new(16);
	add_header(w->headers, "idempotency-key", m->idempotency_key);
	add_header(w->headers, "content-type", m->content_type);
	add_header(w->headers, "outbox-id", m->outbox_id);
	add_header(w->headers, "created-at", m->created_at);
	add_header(w->headers, "source-topic", m->source_topic);
	snprintf(number, sizeof(number), "%d", m->source_partition);
	add_header(w->headers, "source-partition", number);
	snprintf(number, sizeof(number), "%" PRId64, m->source_offset);
	add_header(w->headers, "source-offset", number);
	add_header(w->headers, "destination", destination_name);
	snprintf(number, sizeof(number), "%d", attempt);
	add_header(w->headers, "attempt", number);
	snprintf(number, sizeof(number), "%" PRId64, entered);
	add_header(w->headers, "step-entered-at", number);
	if (target != HANDOFF_DLQ && destination != NULL)
	{
		/* Drawn once, here: it travels with the message so a restart keeps its clock. */
		long delay = destination->retry_delays_ms[target - 1];
		long jitter = (long) (destination->retry_jitter * delay * ((double) rand() / RAND_MAX));

		snprintf(number, sizeof(number), "%ld", jitter);
		add_header(w->headers, "step-jitter-ms", number);
	}
	if (not_before_s >= 0)
	{
		snprintf(number, sizeof(number), "%" PRId64, entered + (int64_t) not_before_s * 1000);
		add_header(w->headers, "not-before", number);
	}
	add_header(w->headers, "last-error", error);
	add_trace_headers(w->headers, m->traceparent, m->traceparent ? strlen(m->traceparent) : 0,
					  m->tracestate, m->tracestate ? strlen(m->tracestate) : 0);
	p->pending++;
	metric_add(p->pending_gauge, 1, NULL);
	produce(p, w);
}

void
handoff_poll(handoff_producer *p)
{
	pending_write **wp = &p->to_resend;
	int64_t now = now_ms();

	rd_kafka_poll(p->rk, 0);
	fatal_error_hook_poll(p->rk);
	if (p->failed && now >= p->replace_at_ms)
		replace_producer(p);
	while (*wp)
	{
		pending_write *w = *wp;

		if (w->resend_at_ms > now)
		{
			wp = &w->next;
			continue;
		}
		*wp = w->next;
		w->next = NULL;
		produce(p, w);
	}
}

int
handoff_pending(const handoff_producer *p)
{
	return p->pending;
}

void
handoff_producer_free(handoff_producer *p)
{
	rd_kafka_flush(p->rk, 5000);
	rd_kafka_destroy(p->rk);
	rd_kafka_conf_destroy(p->template);
	/* Writes given up here: their records' offsets were not committed, so they come again. */
	metric_add(p->pending_gauge, -p->pending, NULL);
	while (p->to_resend)
	{
		pending_write *w = p->to_resend;

		p->to_resend = w->next;
		free_write(w);
	}
	free(p);
}
