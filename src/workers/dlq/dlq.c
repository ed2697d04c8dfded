/*
 * dlq.c: `wal-worker dlq`, copying the DLQ topic into wal_delivery.dead_letters.
 *
 * Each message is inserted with its Kafka position, which is unique in the table, so a
 * message consumed again after a crash writes nothing the second time (exactly once per
 * message). Its offset is committed only after the insert committed.
 *
 * A message's headers are read defensively (dlq_message.c) and one that still cannot be
 * stored as is is stored bare: only a database that is down makes the worker read a
 * message again, so no message blocks the ones behind it.
 *
 * Alerts go out from a thread of their own (dlq_alerts.c), so a slow webhook never holds
 * up ingestion.
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
#include "common/role_lifecycle.h"
#include "common/role_setup.h"
#include "common/sd_notify.h"
#include "common/stop_signal.h"
#include "dlq/dlq_alerts.h"
#include "dlq/dlq_message.h"
#include "roles.h"

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
	dlq_alerts *alerts;
	bool assigned;
	int64_t next_replay_check_ms;
	metric *ingested;
	metric *duplicates;
	metric *stored_bare;
	metric *unstorable;
	metric *replayed;
} dlq_state;

static bool
ensure_db(dlq_state *st)
{
	return db_ensure(&st->db, st->opts->conninfo, "dlq", "not consuming", NULL);
}

/*
 * Whether a failed call may succeed as is once the database is back: connection loss,
 * shutdown, lack of resources, a serialization conflict. Anything else is about the
 * data, and retrying it would block every message behind it forever.
 */
static bool
is_transient_db_failure(PGconn *db, const PGresult *res)
{
	const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);

	if (PQstatus(db) != CONNECTION_OK || state == NULL)
		return true;
	return strncmp(state, "08", 2) == 0 || strncmp(state, "40", 2) == 0 ||
		   strncmp(state, "53", 2) == 0 || strncmp(state, "57", 2) == 0 ||
		   strncmp(state, "58", 2) == 0;
}

/* One insert of a DLQ message through ingest_dead_letter; values as its 12 parameters. */
static PGresult *
insert_dead_letter(dlq_state *st, const char *const values[12], int payload_len)
{
	int lengths[12] = {[8] = payload_len};
	int formats[12] = {[8] = 1}; /* the payload goes in as raw bytes */

	return PQexecParams(
		st->db,
		"SELECT wal_delivery.ingest_dead_letter($1, $2, $3, $4, $5, $6, $7, $8, $9, "
		"$10, $11, $12)",
		12, NULL, values, lengths, formats, 0);
}

typedef enum
{
	INGESTED,
	INGEST_RETRY,   /* the database failed: read the message again later */
	INGEST_SKIPPED, /* not even its bare form could be stored: logged and counted */
} ingest_result;

/*
 * Inserts one DLQ message. Its fields are read defensively (dlq_message.c); should the
 * insert still fail on its data, the message is stored in a bare form (its position,
 * payload and escaped headers, the error as last_error) rather than retried forever.
 */
static ingest_result
ingest(dlq_state *st, const rd_kafka_message_t *rkm)
{
	char partition[16], offset[32], outbox_id[24], attempt[16];
	dlq_message m;
	const char *values[12];
	PGresult *res;
	ingest_result result = INGESTED;

	dlq_message_read(&m, rkm);
	snprintf(partition, sizeof(partition), "%d", rkm->partition);
	snprintf(offset, sizeof(offset), "%" PRId64, rkm->offset);
	snprintf(outbox_id, sizeof(outbox_id), "%" PRId64, m.outbox_id);
	snprintf(attempt, sizeof(attempt), "%d", (int) m.attempt);
	values[0] = rd_kafka_topic_name(rkm->rkt);
	values[1] = partition;
	values[2] = offset;
	values[3] = m.topic;
	values[4] = m.idempotency_key;
	values[5] = m.destination;
	values[6] = m.has_outbox_id ? outbox_id : NULL;
	values[7] = m.content_type;
	values[8] = rkm->payload ? rkm->payload : "";
	values[9] = m.has_attempt ? attempt : NULL;
	values[10] = m.last_error;
	values[11] = m.headers_json;
	if (m.topic == NULL || m.idempotency_key == NULL)
		log_warn("event=dlq_message_without_headers partition=%d offset=%" PRId64
				 " msg=\"ingesting with what it has\"",
				 rkm->partition, rkm->offset);

	res = insert_dead_letter(st, values, (int) rkm->len);
	if (PQresultStatus(res) != PGRES_TUPLES_OK && !is_transient_db_failure(st->db, res))
	{
		char reason[1024];

		snprintf(reason, sizeof(reason), "stored bare, its fields refused: %s",
				 PQresultErrorMessage(res));
		log_warn("event=dlq_message_stored_bare partition=%d offset=%" PRId64 " error=\"%s\"",
				 rkm->partition, rkm->offset, PQresultErrorMessage(res));
		metric_add(st->stored_bare, 1, NULL);
		PQclear(res);
		values[3] = values[4] = values[5] = values[6] = values[7] = values[9] = NULL;
		values[10] = reason;
		res = insert_dead_letter(st, values, (int) rkm->len);
	}
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		result = is_transient_db_failure(st->db, res) ? INGEST_RETRY : INGEST_SKIPPED;
		log_error("event=ingest_failed partition=%d offset=%" PRId64 " error=\"%s\" next=%s",
				  rkm->partition, rkm->offset, PQresultErrorMessage(res),
				  result == INGEST_RETRY ? "read_again" : "skipped");
		if (result == INGEST_SKIPPED)
			metric_add(st->unstorable, 1, NULL);
	}
	else if (PQgetisnull(res, 0, 0))
		metric_add(st->duplicates, 1, NULL);
	else
	{
		metric_add(st->ingested, 1, NULL);
		alerts_wake(st->alerts);
	}
	PQclear(res);
	dlq_message_clear(&m);
	return result;
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
				  text, st->db ? PQerrorMessage(st->db) : "no connection");
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
						 "content_type, payload, traceparent, tracestate "
						 "FROM wal_delivery.dead_letters_to_replay(100)");
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		log_error("event=replay_query_failed error=\"%s\"", PQerrorMessage(st->db));
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
			log_record(LOG_WARN, PQgetvalue(res, r, 1), PQgetvalue(res, r, 2), NULL,
					   "event=replay_waiting id=%" PRId64 " destination=%s msg=\"destination not "
					   "in the published config yet\"",
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
		/* The replay continues the record's trace: its attempts are spans of it too. */
		m.traceparent = PQgetisnull(res, r, 7) ? NULL : PQgetvalue(res, r, 7);
		m.tracestate = PQgetisnull(res, r, 8) ? NULL : PQgetvalue(res, r, 8);
		handoff_message_read_trace(&m);
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
	st->stored_bare = metric_counter(
		"wal_dead_letters_stored_bare_total",
		"DLQ messages whose fields the database refused, stored with their position, payload "
		"and raw headers only.",
		0, NULL);
	st->unstorable = metric_counter(
		"wal_dead_letters_unstorable_total",
		"DLQ messages that could not be stored even bare (logged with their position; their "
		"offsets were committed so the rest could go on).",
		0, NULL);
	st->replayed = metric_counter("wal_dead_letters_replayed_total",
								  "Dead letters written back to retry step 1 on request.", 0, NULL);
}

/* The DLQ consumer and the replays' producer; false (logged) when librdkafka refuses them. */
static bool
connect_kafka(dlq_state *st)
{
	kafka_default defaults[] = {
		{"group.id", "wal_delivery.dlq"},
		{"enable.auto.commit", "false"},
		{"auto.offset.reset", "earliest"},
		{"client.id", "wal-worker-dlq"},
	};
	role_kafka kafka = {defaults, (int) (sizeof(defaults) / sizeof(defaults[0])), on_rebalance,
						on_replayed, st};

	return role_connect_kafka(st->opts, st->watch, &kafka, &st->consumer, &st->replays);
}

static void
subscribe_dlq_topic(dlq_state *st)
{
	role_subscribe(st->consumer, &config_watch_current(st->watch)->dlq_topic, 1);
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

/* A DLQ message into dead_letters; its offset is committed only once it is in the table. */
static void
store_message(dlq_state *st, const rd_kafka_message_t *rkm)
{
	if (ingest(st, rkm) != INGEST_RETRY)
		rd_kafka_commit_message(st->consumer, rkm, 0);
	else
	{
		/* From the last commit once the database is back. */
		read_again(st, rkm);
		sleep(1);
	}
}

/* One message (or event) from the DLQ topic. */
static void
take_message(dlq_state *st)
{
	rd_kafka_message_t *rkm = rd_kafka_consumer_poll(st->consumer, 200);

	if (rkm == NULL)
		return;
	if (role_is_record(rkm))
		store_message(st, rkm);
	rd_kafka_message_destroy(rkm);
}

static void
shut_down(dlq_state *st)
{
	alerts_stop(st->alerts);
	role_close_consumer(st->consumer);
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
	if (!connect_kafka(&st) || (st.alerts = alerts_start(opts)) == NULL)
		return 1;
	alerts_set_url(st.alerts, config_watch_current(st.watch)->dlq_alert_url);
	subscribe_dlq_topic(&st);
	log_info("event=started topic=%s", config_watch_current(st.watch)->dlq_topic);

	while (!stop_requested)
	{
		sd_notify_loop();
		if (config_watch_poll(st.watch))
			alerts_set_url(st.alerts, config_watch_current(st.watch)->dlq_alert_url);
		/* Every step below needs the database: wait for it. */
		if (!ensure_db(&st))
		{
			sleep(1);
			continue;
		}
		replay_requested(&st);
		handoff_poll(st.replays);
		take_message(&st);
	}

	shut_down(&st);
	return 0;
}
