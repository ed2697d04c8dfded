/*
 * kafka_producer.c: create, use and drain the relay's producers (see kafka_producer.h).
 *
 * Every librdkafka callback here is served by rd_kafka_poll/flush on the relay's own
 * thread (logs are routed to the main queue), so they may use palloc and elog.
 */
#include "postgres.h"

#include <time.h>

#include "miscadmin.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "utils/jsonb.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/timestamp.h"

#include "kafka_inflight.h"
#include "kafka_producer.h"
#include "relay_wakeup.h"
#include "shared/record_contract.h"

static rd_kafka_t *producer_all = NULL;
static rd_kafka_t *producer_leader = NULL;
static int deliveries_waiting = 0;

bool kafka_report_details = false;

static void
on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque)
{
	KafkaDelivery *delivery = (KafkaDelivery *) msg->_private;

	delivery->reported = true;
	delivery->err = msg->err;
	delivery->status = rd_kafka_message_status(msg);
	if (kafka_report_details)
	{
		struct timespec now;

		clock_gettime(CLOCK_REALTIME, &now);
		delivery->partition = msg->partition;
		delivery->offset = msg->offset;
		delivery->reported_unix_ns = (int64) now.tv_sec * 1000000000 + now.tv_nsec;
	}
	deliveries_waiting--;
	/* Not acknowledged, yet perhaps stored: sending it again may make a second copy. */
	if (msg->err != RD_KAFKA_RESP_ERR_NO_ERROR &&
		delivery->status == RD_KAFKA_MSG_STATUS_POSSIBLY_PERSISTED)
		relay_count_possible_duplicates(1);
	if (delivery->handed_off)
		kafka_inflight_reported(delivery);
}

static void
on_log(const rd_kafka_t *rk, int level, const char *facility, const char *message)
{
	/*
	 * syslog levels. Connection failures come at level 3 on every reconnect; the relay
	 * logs outages once per state change itself, so only 0-2 reach the server log.
	 */
	ereport(level <= 2 ? LOG : DEBUG1,
			(errmsg("wal_delivery relay: librdkafka %s: %s", facility, message)));
}

static void
on_error(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	ereport(DEBUG1, (errmsg("wal_delivery relay: Kafka error: %s", reason)));
}

static bool
set_property(rd_kafka_conf_t *conf, const char *name, const char *value, char *errbuf,
			 size_t errbuf_size)
{
	char rderr[512];

	if (rd_kafka_conf_set(conf, name, value, rderr, sizeof(rderr)) != RD_KAFKA_CONF_OK)
	{
		snprintf(errbuf, errbuf_size, "librdkafka property %s=%s: %s", name, value, rderr);
		return false;
	}
	return true;
}

/* Applies "name=value;name=value" from wal_delivery.kafka_properties, unchanged. */
static bool
set_passthrough_properties(rd_kafka_conf_t *conf, const char *properties, char *errbuf,
						   size_t errbuf_size)
{
	char *copy = pstrdup(properties ? properties : "");
	char *save = NULL;

	for (char *item = strtok_r(copy, ";", &save); item != NULL; item = strtok_r(NULL, ";", &save))
	{
		char *eq;
		char *name = item;

		while (*name == ' ')
			name++;
		if (*name == '\0')
			continue;
		eq = strchr(name, '=');
		if (eq == NULL || eq == name)
		{
			snprintf(errbuf, errbuf_size,
					 "wal_delivery.kafka_properties item \"%s\" is not name=value", name);
			return false;
		}
		*eq = '\0';
		if (!set_property(conf, name, eq + 1, errbuf, errbuf_size))
			return false;
	}
	return true;
}

bool
kafka_conf_apply(rd_kafka_conf_t *conf, const char *bootstrap, const char *properties, char *errbuf,
				 size_t errbuf_size)
{
	return set_property(conf, "bootstrap.servers", bootstrap, errbuf, errbuf_size) &&
		   set_passthrough_properties(conf, properties, errbuf, errbuf_size);
}

/*
 * librdkafka refuses, before sending, a record larger than message.max.bytes (1 MB by
 * default). The largest a topic may allow is its max_payload_bytes (at most 100,000,000)
 * plus the headroom the reconciler gives max.message.bytes (64 KiB): 1 MiB over that
 * leaves the broker, which knows each topic's limit, to judge every record, and stays
 * under a broker's default socket.request.max.bytes (100 MiB), which caps a request.
 */
#define RELAY_MESSAGE_MAX_BYTES "101048576"

/*
 * How long the idempotent producer keeps retrying a record. Its retries never make a
 * second copy (the broker knows the sequence), a record that times out may still be
 * committed and is then sent again as a new one. So a sent record is given the time a
 * leader needs to drop dead replicas from its ISR (replica.lag.time.max.ms, 30 s by
 * default) and a new leader to be elected, several times over; a pass does not wait that
 * long for it (kafka_inflight.h). The row stays unmarked in the outbox meanwhile.
 */
#define RELAY_IDEMPOTENT_MESSAGE_TIMEOUT_MS 300000

static rd_kafka_t *
create_producer(const char *bootstrap, const char *properties, int delivery_timeout_ms,
				bool idempotent, char *errbuf, size_t errbuf_size)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	char timeout[32];
	rd_kafka_t *rk;

	snprintf(timeout, sizeof(timeout), "%d",
			 idempotent ? Max(delivery_timeout_ms, RELAY_IDEMPOTENT_MESSAGE_TIMEOUT_MS)
						: delivery_timeout_ms);
	if (!set_property(conf, "client.id", "wal_delivery_relay", errbuf, errbuf_size) ||
		!set_property(conf, "message.timeout.ms", timeout, errbuf, errbuf_size) ||
		!set_property(conf, "log.queue", "true", errbuf, errbuf_size) ||
		/* Topics are the reconciler's to make; a produce never asks the broker for one. */
		!set_property(conf, "allow.auto.create.topics", "false", errbuf, errbuf_size) ||
		!set_property(conf, "enable.idempotence", idempotent ? "true" : "false", errbuf,
					  errbuf_size) ||
		!set_property(conf, "acks", idempotent ? "all" : "1", errbuf, errbuf_size) ||
		!set_property(conf, "message.max.bytes", RELAY_MESSAGE_MAX_BYTES, errbuf, errbuf_size) ||
		!kafka_conf_apply(conf, bootstrap, properties, errbuf, errbuf_size))
	{
		rd_kafka_conf_destroy(conf);
		return NULL;
	}
	rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
	rd_kafka_conf_set_log_cb(conf, on_log);
	rd_kafka_conf_set_error_cb(conf, on_error);

	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errbuf, errbuf_size);
	if (rk == NULL)
	{
		rd_kafka_conf_destroy(conf); /* rd_kafka_new frees it only on success */
		return NULL;
	}
	rd_kafka_set_log_queue(rk, NULL);
	return rk;
}

bool
kafka_producers_create(const char *bootstrap, const char *properties, int delivery_timeout_ms,
					   char *errbuf, size_t errbuf_size)
{
	producer_all =
		create_producer(bootstrap, properties, delivery_timeout_ms, true, errbuf, errbuf_size);
	if (producer_all == NULL)
		return false;
	producer_leader =
		create_producer(bootstrap, properties, delivery_timeout_ms, false, errbuf, errbuf_size);
	if (producer_leader == NULL)
	{
		rd_kafka_destroy(producer_all);
		producer_all = NULL;
		return false;
	}
	deliveries_waiting = 0;
	return true;
}

bool
kafka_producers_exist(void)
{
	return producer_all != NULL;
}

void
kafka_producers_destroy(int flush_timeout_ms)
{
	if (producer_all == NULL)
		return;
	rd_kafka_flush(producer_all, flush_timeout_ms);
	rd_kafka_flush(producer_leader, flush_timeout_ms);
	rd_kafka_destroy(producer_all);
	rd_kafka_destroy(producer_leader);
	producer_all = producer_leader = NULL;
	deliveries_waiting = 0;
	kafka_inflight_forget();
}

/*
 * Adds the record's own headers (a JSON object of strings) to hdrs, after the relay's.
 * enqueue refuses reserved names (the record contract); a row that has one anyway (written
 * before that check) must still never stand in for the real value, so it is dropped here.
 */
static void
add_json_headers(rd_kafka_headers_t *hdrs, const char *headers_json)
{
	Jsonb *jb;
	JsonbIterator *it;
	JsonbValue v;
	JsonbIteratorToken tok;
	const char *name = NULL;
	int name_len = 0;

	if (headers_json == NULL)
		return;
	jb = DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(headers_json)));
	it = JsonbIteratorInit(&jb->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY)
			name = v.val.string.val, name_len = v.val.string.len;
		else if (tok == WJB_VALUE && name != NULL && v.type == jbvString &&
				 !record_header_is_reserved(name, (size_t) name_len))
			rd_kafka_header_add(hdrs, name, name_len, v.val.string.val, v.val.string.len);
	}
}

rd_kafka_resp_err_t
kafka_produce(const KafkaRecord *record, KafkaDelivery *delivery)
{
	rd_kafka_t *rk = record->acks == 1 ? producer_leader : producer_all;
	rd_kafka_headers_t *hdrs = rd_kafka_headers_new(8);
	char outbox_id[32];
	rd_kafka_resp_err_t err;

	snprintf(outbox_id, sizeof(outbox_id), INT64_FORMAT, delivery->outbox_id);
	rd_kafka_header_add(hdrs, "idempotency-key", -1, record->idempotency_key, -1);
	rd_kafka_header_add(hdrs, "outbox-id", -1, outbox_id, -1);
	rd_kafka_header_add(hdrs, "source-topic", -1, record->topic, -1);
	rd_kafka_header_add(hdrs, "content-type", -1, record->content_type, -1);
	rd_kafka_header_add(hdrs, "created-at", -1, record->created_at, -1);
	add_json_headers(hdrs, record->headers_json);

	delivery->reported = delivery->queued = delivery->handed_off = false;
	for (;;)
	{
		err = rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(record->topic),
								RD_KAFKA_V_VALUE((void *) record->value, record->value_len),
								RD_KAFKA_V_KEY(record->key, record->key ? strlen(record->key) : 0),
								RD_KAFKA_V_HEADERS(hdrs), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
								RD_KAFKA_V_OPAQUE(delivery), RD_KAFKA_V_END);
		if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL)
			break;
		/* The local queue is full: serve reports to make room, then try again. */
		rd_kafka_poll(rk, 100);
		CHECK_FOR_INTERRUPTS();
	}
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		rd_kafka_headers_destroy(hdrs); /* not taken over on failure */
		return err;
	}
	delivery->queued = true;
	deliveries_waiting++;
	return RD_KAFKA_RESP_ERR_NO_ERROR;
}

void
kafka_wait_for_deliveries(int timeout_ms, int shutdown_timeout_ms)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), timeout_ms);
	bool shutdown_seen = false;

	while (deliveries_waiting > kafka_inflight_waiting() && GetCurrentTimestamp() < deadline)
	{
		rd_kafka_poll(producer_all, 50);
		rd_kafka_poll(producer_leader, 0);
		CHECK_FOR_INTERRUPTS();
		if (ShutdownRequestPending && !shutdown_seen)
		{
			/* Stopping: wait at most the shutdown flush from now on. */
			TimestampTz flush_end =
				TimestampTzPlusMilliseconds(GetCurrentTimestamp(), shutdown_timeout_ms);

			shutdown_seen = true;
			if (flush_end < deadline)
				deadline = flush_end;
		}
	}
	if (deliveries_waiting > kafka_inflight_waiting() && !ShutdownRequestPending)
	{
		/* Not sent again while librdkafka still retries it: its report comes later. */
		kafka_inflight_hand_off();
	}
	else if (deliveries_waiting > 0 && ShutdownRequestPending)
	{
		/*
		 * Stopping: purge what is left so every delivery gets its report now. A purged
		 * in-flight message may still land in Kafka; it is not marked stored, so it is
		 * sent again later (at least once: a lost acknowledgement).
		 */
		rd_kafka_purge(producer_all, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
		rd_kafka_purge(producer_leader, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
		deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), 10000);
		while (deliveries_waiting > 0 && GetCurrentTimestamp() < deadline)
		{
			rd_kafka_poll(producer_all, 10);
			rd_kafka_poll(producer_leader, 10);
		}
		if (deliveries_waiting > 0)
		{
			/* Reports could still write into this batch: start over as a new process. */
			ereport(
				LOG,
				(errmsg("wal_delivery relay: %d deliveries got no report after a purge; restarting",
						deliveries_waiting)));
			proc_exit(1);
		}
	}
	/* Logs and errors that arrived meanwhile. */
	rd_kafka_poll(producer_all, 0);
	rd_kafka_poll(producer_leader, 0);
}

bool
kafka_producers_failed(char *errbuf, size_t errbuf_size)
{
	if (producer_all == NULL)
		return false;
	if (rd_kafka_fatal_error(producer_all, errbuf, errbuf_size) != RD_KAFKA_RESP_ERR_NO_ERROR)
		return true;
	return rd_kafka_fatal_error(producer_leader, errbuf, errbuf_size) != RD_KAFKA_RESP_ERR_NO_ERROR;
}

bool
kafka_reachable(int timeout_ms)
{
	const struct rd_kafka_metadata *md = NULL;
	rd_kafka_resp_err_t err = rd_kafka_metadata(producer_all, 0, NULL, &md, timeout_ms);

	if (md != NULL)
		rd_kafka_metadata_destroy(md);
	rd_kafka_poll(producer_all, 0);
	return err == RD_KAFKA_RESP_ERR_NO_ERROR;
}
