/*
 * dlq.c: `wal-worker dlq`, copying the DLQ topic into wal_delivery.dead_letters.
 *
 * Each message is inserted with its Kafka position, which is unique in the table, so a
 * message consumed again after a crash writes nothing the second time (exactly once per
 * message). Its offset is committed only after the insert committed.
 *
 * Alerts: every dead letter, whether ingested here or written by the database itself (a
 * row whose processing failed for the last time), raises one alert: a metric, and a POST
 * to settings.dlq_alert_url when set. A row is marked alerted only after the webhook took
 * it, so alerts are at least once across crashes; a failing webhook is logged, counted
 * and tried again later, and never holds up ingestion.
 *
 * Replays: on-call's wal_delivery.replay_dead_letter() marks an entry; this worker writes
 * it to its destination's partition of retry step 1 and, once Kafka acknowledged that,
 * resolves the entry.
 */
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>

#include "common/admin_server.h"
#include "common/clock.h"
#include "common/config_watch.h"
#include "common/db_connect.h"
#include "common/handoff.h"
#include "common/kafka_conf.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/role_setup.h"
#include "common/stop_signal.h"
#include "roles.h"

#define ALERT_CHECK_MS   1000 /* looking for dead letters still to alert */
#define ALERT_RETRY_MS   5000 /* after the webhook failed */
#define REPLAY_CHECK_MS  1000
#define MAX_REPLAYS_OPEN 256

typedef struct dlq_state
{
	const worker_options *opts;
	config_watch *watch;
	PGconn *db;
	rd_kafka_t *consumer;
	handoff_producer *replays;
	admin_server *admin;
	int64_t replaying[MAX_REPLAYS_OPEN]; /* dead letter ids written, not yet acked */
	int n_replaying;
	bool assigned;
	int64_t next_alert_check_ms;
	int64_t next_replay_check_ms;
	metric *ingested;
	metric *duplicates;
	metric *alerts;
	metric *alerts_failed;
	metric *replayed;
} dlq_state;

/* POSTs the alert for one dead letter; false (logged and counted) when the webhook failed. */
static bool
raise_alert(dlq_state *st, int64_t id, const char *origin, const char *topic, const char *key,
			const char *destination, const char *error)
{
	const char *url = config_watch_current(st->watch)->dlq_alert_url;
	json_t *body;
	char *text;
	CURL *curl;
	struct curl_slist *headers = NULL;
	long status = 0;
	CURLcode rc;
	bool ok;

	log_warn("event=dead_letter id=%" PRId64 " origin=%s topic=%s key=%s destination=%s "
			 "error=\"%s\"",
			 id, origin, topic ? topic : "", key ? key : "", destination ? destination : "",
			 error ? error : "");
	metric_add(st->alerts, 1, (const char *const[]){origin});
	if (url == NULL)
		return true;
	body = json_pack("{s:s, s:I, s:s, s:s?, s:s?, s:s?, s:s?}", "event", "dead_letter", "id",
					 (json_int_t) id, "origin", origin, "topic", topic, "idempotency_key", key,
					 "destination", destination, "last_error", error);
	text = json_dumps(body, JSON_COMPACT);
	curl = curl_easy_init();
	headers = curl_slist_append(headers, "Content-Type: application/json");
	curl_easy_setopt(curl, CURLOPT_URL, url);
	curl_easy_setopt(curl, CURLOPT_POSTFIELDS, text);
	curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
	curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 5000L);
	rc = curl_easy_perform(curl);
	curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
	ok = rc == CURLE_OK && status >= 200 && status <= 299;
	if (!ok)
	{
		metric_add(st->alerts_failed, 1, NULL);
		log_error("event=alert_failed id=%" PRId64 " url=%s error=\"%s\"", id, url,
				  rc != CURLE_OK ? curl_easy_strerror(rc) : "non-2xx answer");
	}
	curl_slist_free_all(headers);
	curl_easy_cleanup(curl);
	free(text);
	json_decref(body);
	return ok;
}

static bool
ensure_db(dlq_state *st)
{
	return db_ensure(&st->db, st->opts->conninfo, "dlq", "not consuming", NULL);
}

/*
 * Inserts one DLQ message. True when it is safely in the table (new or seen before),
 * false when the database failed: then the offset must not be committed.
 */
static bool
ingest(dlq_state *st, const rd_kafka_message_t *rkm)
{
	char partition[16], offset[32];
	char *topic = kafka_header_value(rkm, "source-topic");
	char *key = kafka_header_value(rkm, "idempotency-key");
	char *destination = kafka_header_value(rkm, "destination");
	char *outbox_id = kafka_header_value(rkm, "outbox-id");
	char *content_type = kafka_header_value(rkm, "content-type");
	char *attempt = kafka_header_value(rkm, "attempt");
	char *error = kafka_header_value(rkm, "last-error");
	const char *values[11];
	int lengths[11] = {0};
	int formats[11] = {0};
	PGresult *res;
	bool ok;

	snprintf(partition, sizeof(partition), "%d", rkm->partition);
	snprintf(offset, sizeof(offset), "%" PRId64, rkm->offset);
	values[0] = rd_kafka_topic_name(rkm->rkt);
	values[1] = partition;
	values[2] = offset;
	values[3] = topic;
	values[4] = key;
	values[5] = destination;
	values[6] =
		outbox_id && strspn(outbox_id, "0123456789") == strlen(outbox_id) ? outbox_id : NULL;
	values[7] = content_type;
	values[8] = rkm->payload ? rkm->payload : "";
	lengths[8] = (int) rkm->len;
	formats[8] = 1; /* the payload goes in as raw bytes */
	values[9] = attempt && strspn(attempt, "0123456789") == strlen(attempt) ? attempt : NULL;
	values[10] = error;
	if (topic == NULL || key == NULL)
		log_warn("event=dlq_message_without_headers partition=%d offset=%" PRId64
				 " msg=\"ingesting with what it has\"",
				 rkm->partition, rkm->offset);

	res = PQexecParams(st->db,
					   "SELECT wal_delivery.ingest_dead_letter($1, $2, $3, $4, $5, $6, $7, $8, $9, "
					   "$10, $11)",
					   11, NULL, values, lengths, formats, 0);
	ok = PQresultStatus(res) == PGRES_TUPLES_OK;
	if (!ok)
		log_error("event=ingest_failed partition=%d offset=%" PRId64 " error=\"%s\"",
				  rkm->partition, rkm->offset, strtok(PQerrorMessage(st->db), "\n"));
	else if (PQgetisnull(res, 0, 0))
		metric_add(st->duplicates, 1, NULL);
	else
	{
		metric_add(st->ingested, 1, NULL);
		st->next_alert_check_ms = 0; /* alert it now */
	}
	PQclear(res);
	free(topic);
	free(key);
	free(destination);
	free(outbox_id);
	free(content_type);
	free(attempt);
	free(error);
	return ok;
}

/* ---------------------------------------------------------------- alerts */

static void
mark_alerted(dlq_state *st, const char *id)
{
	const char *values[1] = {id};
	PGresult *res = PQexecParams(st->db, "SELECT wal_delivery.mark_dead_letter_alerted($1)", 1,
								 NULL, values, NULL, NULL, 0);

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		log_error("event=mark_alerted_failed id=%s error=\"%s\" msg=\"it will be alerted again\"",
				  id, strtok(PQerrorMessage(st->db), "\n"));
	PQclear(res);
}

/* Alerts every dead letter not alerted yet, oldest first; stops at a failing webhook. */
static void
send_pending_alerts(dlq_state *st)
{
	PGresult *res;

	if (now_ms() < st->next_alert_check_ms)
		return;
	st->next_alert_check_ms = now_ms() + ALERT_CHECK_MS;
	res = PQexec(st->db, "SELECT id, origin, topic, idempotency_key, destination, last_error "
						 "FROM wal_delivery.dead_letters_to_alert(100)");
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		log_error("event=alert_query_failed error=\"%s\"", strtok(PQerrorMessage(st->db), "\n"));
	for (int r = 0; PQresultStatus(res) == PGRES_TUPLES_OK && r < PQntuples(res); r++)
	{
		const char *v[6];

		for (int c = 0; c < 6; c++)
			v[c] = PQgetisnull(res, r, c) ? NULL : PQgetvalue(res, r, c);
		if (!raise_alert(st, strtoll(v[0], NULL, 10), v[1], v[2], v[3], v[4], v[5]))
		{
			st->next_alert_check_ms = now_ms() + (int64_t) (ALERT_RETRY_MS / st->opts->time_scale);
			break;
		}
		mark_alerted(st, v[0]);
	}
	PQclear(res);
}

/* ---------------------------------------------------------------- replays */

static bool
replay_open(const dlq_state *st, int64_t id)
{
	for (int i = 0; i < st->n_replaying; i++)
		if (st->replaying[i] == id)
			return true;
	return false;
}

/* Kafka acknowledged the replay's write to retry step 1: resolve the entry. */
static void
on_replayed(void *opaque, void *arg)
{
	dlq_state *st = arg;
	int64_t id = (int64_t) (intptr_t) opaque;
	char text[32];
	const char *values[1] = {text};
	PGresult *res;

	for (int i = 0; i < st->n_replaying; i++)
		if (st->replaying[i] == id)
			st->replaying[i] = st->replaying[--st->n_replaying];
	snprintf(text, sizeof(text), "%" PRId64, id);
	res = PQexecParams(st->db, "SELECT wal_delivery.complete_replay($1)", 1, NULL, values, NULL,
					   NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		log_error("event=complete_replay_failed id=%s error=\"%s\" msg=\"it will be replayed "
				  "again\"",
				  text, strtok(PQerrorMessage(st->db), "\n"));
	else
	{
		metric_add(st->replayed, 1, NULL);
		log_info("event=replayed id=%s to=retry.1", text);
	}
	PQclear(res);
}

/* Writes the entries on-call asked to replay to their destination's retry step 1. */
static void
replay_requested(dlq_state *st)
{
	const control_plane_config *config = config_watch_current(st->watch);
	PGresult *res;

	if (now_ms() < st->next_replay_check_ms)
		return;
	st->next_replay_check_ms = now_ms() + REPLAY_CHECK_MS;
	res = PQexec(st->db, "SELECT id, topic, idempotency_key, destination, outbox_id, "
						 "content_type, payload FROM wal_delivery.dead_letters_to_replay(100)");
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		log_error("event=replay_query_failed error=\"%s\"", strtok(PQerrorMessage(st->db), "\n"));
	for (int r = 0; PQresultStatus(res) == PGRES_TUPLES_OK && r < PQntuples(res); r++)
	{
		int64_t id = strtoll(PQgetvalue(res, r, 0), NULL, 10);
		const destination_config *d = config_find_destination(config, PQgetvalue(res, r, 3));
		handoff_message m = {0};
		size_t len;
		unsigned char *payload;

		if (replay_open(st, id) || st->n_replaying == MAX_REPLAYS_OPEN)
			continue;
		if (d == NULL)
		{
			/* Not in this worker's config yet: its partition is unknown, so wait. */
			log_warn("event=replay_waiting id=%" PRId64 " destination=%s msg=\"destination not in "
					 "the published config yet\"",
					 id, PQgetvalue(res, r, 3));
			continue;
		}
		payload = PQunescapeBytea((const unsigned char *) PQgetvalue(res, r, 6), &len);
		m.source_topic = PQgetvalue(res, r, 1);
		m.source_partition = -1;
		m.source_offset = -1;
		m.idempotency_key = PQgetvalue(res, r, 2);
		m.outbox_id = PQgetisnull(res, r, 4) ? NULL : PQgetvalue(res, r, 4);
		m.content_type = PQgetisnull(res, r, 5) ? NULL : PQgetvalue(res, r, 5);
		m.payload = (char *) payload;
		m.payload_len = len;
		st->replaying[st->n_replaying++] = id;
		handoff_send(st->replays, config, d, d->name, &m, HANDOFF_RETRY_STEP_1, 1,
					 "replayed from dead_letters", -1, (void *) (intptr_t) id);
		PQfreemem(payload);
	}
	PQclear(res);
}

static void
on_rebalance(rd_kafka_t *rk, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t *parts,
			 void *opaque)
{
	dlq_state *st = opaque;

	st->assigned = err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS;
	rd_kafka_assign(rk, st->assigned ? parts : NULL);
	log_info("event=%s partitions=%d", st->assigned ? "assigned" : "revoked", parts->cnt);
}

static bool
dlq_ready(void *arg)
{
	return ((dlq_state *) arg)->assigned;
}

static char *
dlq_config_json(void *arg)
{
	return config_watch_json_for_peers(((dlq_state *) arg)->watch);
}

static void
register_metrics(dlq_state *st)
{
	st->ingested = metric_counter(
		"wal_dead_letters_ingested_total",
		"DLQ messages written to wal_delivery.dead_letters (each alerted).", 0, NULL);
	st->duplicates =
		metric_counter("wal_dead_letters_redelivered_total",
					   "DLQ messages consumed again and found already ingested.", 0, NULL);
	st->alerts = metric_counter("wal_dead_letter_alerts_total",
								"Dead letters alerted (webhook accepted, or metric only).", 1,
								(const char *const[]){"origin"});
	st->alerts_failed = metric_counter("wal_dead_letter_alerts_failed_total",
									   "Alerts the alert webhook did not accept.", 0, NULL);
	st->replayed = metric_counter("wal_dead_letters_replayed_total",
								  "Dead letters written back to retry step 1 on request.", 0, NULL);
}

static rd_kafka_t *
create_consumer(dlq_state *st, char *errbuf, size_t errbuf_size)
{
	kafka_default defaults[] = {
		{"group.id", "wal_delivery.dlq"},
		{"enable.auto.commit", "false"},
		{"auto.offset.reset", "earliest"},
		{"client.id", "wal-worker-dlq"},
	};
	rd_kafka_conf_t *conf = kafka_conf_build(
		defaults, (int) (sizeof(defaults) / sizeof(defaults[0])),
		config_watch_current(st->watch)->kafka_bootstrap_servers, st->opts, errbuf, errbuf_size);
	rd_kafka_t *rk;

	if (conf == NULL)
		return NULL;
	rd_kafka_conf_set_rebalance_cb(conf, on_rebalance);
	rd_kafka_conf_set_opaque(conf, st);
	rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errbuf, errbuf_size);
	if (rk != NULL)
		rd_kafka_poll_set_consumer(rk);
	return rk;
}

/* The DLQ consumer and the replays' producer; false (logged) when librdkafka refuses them. */
static bool
connect_kafka(dlq_state *st)
{
	char errbuf[512];

	st->consumer = create_consumer(st, errbuf, sizeof(errbuf));
	st->replays = st->consumer ? handoff_producer_new(st->opts, config_watch_current(st->watch),
													  on_replayed, st, errbuf, sizeof(errbuf))
							   : NULL;
	if (st->consumer == NULL || st->replays == NULL)
	{
		log_error("event=kafka_setup_failed msg=\"%s\"", errbuf);
		return false;
	}
	return true;
}

static void
subscribe_dlq_topic(dlq_state *st)
{
	rd_kafka_topic_partition_list_t *topics = rd_kafka_topic_partition_list_new(1);

	rd_kafka_topic_partition_list_add(topics, config_watch_current(st->watch)->dlq_topic,
									  RD_KAFKA_PARTITION_UA);
	rd_kafka_subscribe(st->consumer, topics);
	rd_kafka_topic_partition_list_destroy(topics);
}

/* The insert failed, so the message is not in the table: read it again from its offset. */
static void
read_again(dlq_state *st, const rd_kafka_message_t *rkm)
{
	rd_kafka_topic_partition_list_t *again = rd_kafka_topic_partition_list_new(1);

	rd_kafka_topic_partition_list_add(again, rd_kafka_topic_name(rkm->rkt), rkm->partition)
		->offset = rkm->offset;
	rd_kafka_seek_partitions(st->consumer, again, 5000);
	rd_kafka_topic_partition_list_destroy(again);
}

/* One DLQ message into dead_letters; its offset is committed only once it is in the table. */
static void
take_message(dlq_state *st)
{
	rd_kafka_message_t *rkm = rd_kafka_consumer_poll(st->consumer, 200);

	if (rkm == NULL)
		return;
	if (rkm->err)
	{
		if (rkm->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
			log_warn("event=consume_error error=\"%s\"", rd_kafka_message_errstr(rkm));
	}
	else if (ingest(st, rkm))
		rd_kafka_commit_message(st->consumer, rkm, 0);
	else
	{
		/* From the last commit once the database is back. */
		read_again(st, rkm);
		sleep(1);
	}
	rd_kafka_message_destroy(rkm);
}

static void
shut_down(dlq_state *st)
{
	rd_kafka_consumer_close(st->consumer);
	rd_kafka_destroy(st->consumer);
	/* Replays still in flight resolve their entries here, so the database goes after. */
	handoff_producer_free(st->replays);
	if (st->db)
		PQfinish(st->db);
	if (st->admin)
		admin_server_stop(st->admin);
	config_watch_stop(st->watch);
	log_info("event=stopped");
}

int
run_dlq(const worker_options *opts)
{
	dlq_state st = {.opts = opts};

	stop_on_signals();
	register_metrics(&st);
	/* The config comes first: it names the brokers and the DLQ topic. */
	st.watch = config_watch_start(opts, &stop_requested);
	if (st.watch == NULL)
		return stop_requested ? 0 : 1;
	if (!role_start_admin(opts, &(admin_handlers){dlq_ready, dlq_config_json, &st}, &st.admin))
		return 1;
	if (!connect_kafka(&st))
		return 1;
	subscribe_dlq_topic(&st);
	log_info("event=started topic=%s", config_watch_current(st.watch)->dlq_topic);

	while (!stop_requested)
	{
		config_watch_poll(st.watch);
		/* Every step below needs the database: wait for it. */
		if (!ensure_db(&st))
		{
			sleep(1);
			continue;
		}
		send_pending_alerts(&st);
		replay_requested(&st);
		handoff_poll(st.replays);
		take_message(&st);
	}

	shut_down(&st);
	return 0;
}
