/*
 * ingest_outbox.c: the outbox writers (see ingest_outbox.h).
 *
 * The queue is one list under a mutex; each writer takes up to MAX_BATCH records at a
 * time, so batches grow with the load by themselves (one record when idle, many under
 * load) and nobody waits for a batch to fill.
 */
#include "ingest_outbox.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "common/clock.h"
#include "common/db_connect.h"
#include "common/log.h"
#include "common/pg_array.h"
#include "ingest/ingest_kafka.h"
#include "ingest/ingest_metrics.h"

#define MAX_BATCH          1000
#define RECONNECT_AFTER_MS 1000
#define IDLE_CHECK_MS      1000

static const char enqueue_sql[] =
	"SELECT wal_delivery.ingest_enqueue_batch($1, $2, $3::bytea[], $4::text[], $5::text[], "
	"$6::jsonb[])::text";

static struct
{
	pthread_mutex_t lock;
	pthread_cond_t cond;
	ingest_record *head;
	ingest_record *tail;
	bool stopping;
} queue = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, NULL, false};

static const worker_options *options;
static pthread_t *writers;
static int n_writers;
static atomic_bool db_up;
static _Atomic int64_t next_connect_ms; /* shared: one refused connect spares the others */

bool
ingest_outbox_up(void)
{
	return atomic_load(&db_up);
}

static void
set_up(bool up)
{
	if (atomic_exchange(&db_up, up) != up)
	{
		metric_set(ingest_m.outbox_up, up ? 1 : 0, NULL);
		if (up)
			log_info("event=outbox_reachable");
	}
}

void
ingest_outbox_submit(ingest_record *r, const char *reason)
{
	r->fallback_reason = reason;
	r->next_queued = NULL;
	pthread_mutex_lock(&queue.lock);
	if (queue.tail)
		queue.tail->next_queued = r;
	else
		queue.head = r;
	queue.tail = r;
	pthread_cond_signal(&queue.cond);
	pthread_mutex_unlock(&queue.lock);
}

static void
fail_unavailable(ingest_record *r, const char *why)
{
	char message[512];

	if (r->fallback_reason != NULL)
		snprintf(message, sizeof(message),
				 "Kafka did not take the record (%s) and the outbox database is unavailable (%s); "
				 "send it again with the same Idempotency-Key",
				 r->fallback_reason, why);
	else
		snprintf(message, sizeof(message),
				 "topic \"%s\" needs processing and goes through the outbox, whose database is "
				 "unavailable (%s); send it again with the same Idempotency-Key",
				 r->topic, why);
	ingest_kafka_outbox_failed(
		r, 503, r->fallback_reason ? "kafka_and_outbox_unavailable" : "outbox_unavailable",
		message);
}

static bool
ensure_db(PGconn **db, char *why, size_t why_size)
{
	PGresult *res;

	if (*db != NULL && PQstatus(*db) == CONNECTION_OK)
		return true;
	if (*db != NULL)
	{
		PQfinish(*db);
		*db = NULL;
	}
	if (now_ms() < atomic_load(&next_connect_ms))
	{
		snprintf(why, why_size, "not reachable a moment ago; retrying every %d ms",
				 RECONNECT_AFTER_MS);
		return false;
	}
	*db = db_connect(options->conninfo, "ingest");
	if (PQstatus(*db) == CONNECTION_OK)
	{
		res = PQprepare(*db, "enqueue", enqueue_sql, 6, NULL);
		if (PQresultStatus(res) == PGRES_COMMAND_OK)
		{
			PQclear(res);
			set_up(true);
			return true;
		}
		PQclear(res);
	}
	snprintf(why, why_size, "%s", PQerrorMessage(*db));
	why[strcspn(why, "\n")] = '\0';
	PQfinish(*db);
	*db = NULL;
	atomic_store(&next_connect_ms, now_ms() + RECONNECT_AFTER_MS);
	if (atomic_load(&db_up))
		log_warn("event=outbox_unreachable error=\"%s\" msg=\"records that need the outbox get "
				 "503 until it is back\"",
				 why);
	set_up(false);
	return false;
}

/* The record's headers as the JSON object enqueue takes, NULL when it has none. */
static char *
headers_json(const ingest_record *r)
{
	json_t *o;
	char *text;

	if (r->n_headers == 0)
		return NULL;
	o = json_object();
	for (int i = 0; i < r->n_headers; i++)
		json_object_set_new(o, r->header_names[i],
							json_stringn(r->header_values[i], r->header_value_lens[i]));
	text = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	return text;
}

/*
 * The four array literals of one call: payloads, idempotency keys, message keys and
 * headers. A record without a message key or headers has NULL there; a payload is never
 * NULL (an empty body is "", see ingest_parse.c).
 */
static void
build_arrays(ingest_record **recs, int n, char *arrays[4])
{
	pg_array payloads, keys, message_keys, headers;

	pg_array_begin(&payloads);
	pg_array_begin(&keys);
	pg_array_begin(&message_keys);
	pg_array_begin(&headers);
	for (int i = 0; i < n; i++)
	{
		const ingest_record *r = recs[i];
		char *json = headers_json(r);

		pg_array_add_bytea(&payloads, r->payload, r->payload_len);
		pg_array_add_text(&keys, r->idempotency_key);
		pg_array_add_text(&message_keys, r->message_key);
		pg_array_add_text(&headers, json);
		free(json);
	}
	arrays[0] = pg_array_finish(&payloads);
	arrays[1] = pg_array_finish(&keys);
	arrays[2] = pg_array_finish(&message_keys);
	arrays[3] = pg_array_finish(&headers);
}

/* The status a refusal's SQLSTATE means for the client. */
static int
status_for(const char *state)
{
	if (state == NULL)
		return 503;
	if (strcmp(state, "42704") == 0)
		return 404;
	if (strcmp(state, "42501") == 0)
		return 403;
	if (strcmp(state, "23W01") == 0)
		return 409; /* the key names a different record */
	if (strcmp(state, "54000") == 0)
		return 413;
	if (strncmp(state, "22", 2) == 0 || strcmp(state, "2202E") == 0)
		return 400;
	return 503;
}

/*
 * The error code of a refusal's status: the codes the service answers with before the
 * database, so a client reads one code for one cause (a topic removed after the service
 * took the request is unknown_topic either way).
 */
static const char *
code_for(int status)
{
	switch (status)
	{
		case 404:
			return "unknown_topic";
		case 403:
			return "forbidden";
		case 409:
			return "idempotency_key_conflict";
		case 413:
			return "too_large";
		default:
			return "bad_record";
	}
}

static void
settle_written(ingest_record **recs, int n, const char *ids)
{
	const char *p = ids + 1; /* past '{' */
	const char *labels[1] = {"outbox"};

	for (int i = 0; i < n; i++)
	{
		char *end;
		long long id = strtoll(p, &end, 10);

		p = end + 1;
		if (recs[i]->fallback_reason)
		{
			const char *reason[] = {recs[i]->fallback_reason};

			metric_add(ingest_m.fallbacks, 1, reason);
		}
		ingest_record_settle_outbox(recs[i], (int64_t) id);
	}
	metric_add(ingest_m.records, n, labels);
}

/* One ingest_enqueue_batch call for records of one topic and content type. */
static void
enqueue_group(PGconn **db, ingest_record **recs, int n)
{
	char *arrays[4];
	const char *values[6];
	PGresult *res;
	const char *state;
	char sqlstate[6];
	char why[512];
	double started;

	build_arrays(recs, n, arrays);
	values[0] = recs[0]->topic;
	values[1] = recs[0]->content_type;
	for (int a = 0; a < 4; a++)
		values[2 + a] = arrays[a];
	started = now_seconds();
	for (int attempt = 0;; attempt++)
	{
		res = PQexecPrepared(*db, "enqueue", 6, values, NULL, NULL, 0);
		state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
		/* Two writers raced on one idempotency key: the database asks to try again. */
		if (attempt == 0 && state && strcmp(state, "40001") == 0)
		{
			PQclear(res);
			continue;
		}
		break;
	}
	for (int a = 0; a < 4; a++)
		free(arrays[a]);
	metric_add(ingest_m.outbox_batches, 1, NULL);
	metric_observe(ingest_m.outbox_write_seconds, now_seconds() - started, NULL);
	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
	{
		metric_add(ingest_m.outbox_batch_records, n, NULL);
		settle_written(recs, n, PQgetvalue(res, 0, 0));
		PQclear(res);
		return;
	}
	/* The server's own message when there is one, without libpq's "ERROR:  " before it. */
	if (PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) != NULL)
		snprintf(why, sizeof(why), "%s", PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY));
	else
		snprintf(why, sizeof(why), "%s", PQresultErrorMessage(res));
	why[strcspn(why, "\n")] = '\0';
	/* The SQLSTATE lives in res: keep a copy before it is freed. */
	snprintf(sqlstate, sizeof(sqlstate), "%s", state ? state : "");
	state = state ? sqlstate : NULL;
	PQclear(res);
	if (PQstatus(*db) != CONNECTION_OK || status_for(state) == 503)
	{
		log_warn("event=outbox_write_failed records=%d sqlstate=%s error=\"%s\"", n,
				 state ? state : "none", why);
		if (PQstatus(*db) != CONNECTION_OK)
		{
			set_up(false);
			atomic_store(&next_connect_ms, now_ms() + RECONNECT_AFTER_MS);
		}
		for (int i = 0; i < n; i++)
			fail_unavailable(recs[i], why);
		return;
	}
	if (n > 1)
	{
		/* One record refused the whole call: write each alone so only it is refused. */
		for (int i = 0; i < n; i++)
			enqueue_group(db, &recs[i], 1);
		return;
	}
	ingest_kafka_outbox_failed(recs[0], status_for(state), code_for(status_for(state)), why);
}

static bool
same_group(const ingest_record *a, const ingest_record *b)
{
	return strcmp(a->topic, b->topic) == 0 && strcmp(a->content_type, b->content_type) == 0;
}

static void
write_records(PGconn **db, ingest_record **recs, int n)
{
	ingest_record **group = malloc(sizeof(*group) * n);
	bool *done = calloc(n, sizeof(bool));
	char why[512];

	for (int i = 0; i < n; i++)
	{
		int g = 0;

		if (done[i])
			continue;
		for (int j = i; j < n; j++)
			if (!done[j] && same_group(recs[i], recs[j]))
			{
				group[g++] = recs[j];
				done[j] = true;
			}
		if (ensure_db(db, why, sizeof(why)))
			enqueue_group(db, group, g);
		else
			for (int k = 0; k < g; k++)
				fail_unavailable(group[k], why);
	}
	free(group);
	free(done);
}

/* While idle: is the database still there? Keeps /readyz honest between records. */
static void
check_idle(PGconn **db)
{
	char why[512];

	if (ensure_db(db, why, sizeof(why)))
	{
		PGresult *res = PQexec(*db, "SELECT 1");

		if (PQresultStatus(res) != PGRES_TUPLES_OK)
			ensure_db(db, why, sizeof(why));
		PQclear(res);
	}
}

static void *
writer_main(void *arg)
{
	PGconn *db = NULL;
	ingest_record *batch[MAX_BATCH];

	(void) arg;
	for (;;)
	{
		int n = 0;

		pthread_mutex_lock(&queue.lock);
		while (queue.head == NULL && !queue.stopping)
		{
			struct timespec until;

			clock_gettime(CLOCK_REALTIME, &until);
			until.tv_sec += IDLE_CHECK_MS / 1000;
			if (pthread_cond_timedwait(&queue.cond, &queue.lock, &until) == ETIMEDOUT)
			{
				pthread_mutex_unlock(&queue.lock);
				check_idle(&db);
				pthread_mutex_lock(&queue.lock);
			}
		}
		while (queue.head != NULL && n < MAX_BATCH)
		{
			batch[n++] = queue.head;
			queue.head = queue.head->next_queued;
		}
		if (queue.head == NULL)
			queue.tail = NULL;
		pthread_mutex_unlock(&queue.lock);
		if (n == 0)
			break; /* stopping, and nothing is left */
		write_records(&db, batch, n);
	}
	if (db)
		PQfinish(db);
	return NULL;
}

void
ingest_outbox_start(const worker_options *opts, int n)
{
	PGconn *probe = NULL;
	char why[512];

	options = opts;
	metric_set(ingest_m.outbox_up, 0, NULL);
	/* Say at start whether the database is there; readiness depends on it. */
	if (ensure_db(&probe, why, sizeof(why)))
		PQfinish(probe);
	else
		log_warn("event=outbox_unreachable error=\"%s\"", why);
	atomic_store(&next_connect_ms, 0);
	n_writers = n;
	writers = calloc(n, sizeof(pthread_t));
	for (int i = 0; i < n; i++)
		if (pthread_create(&writers[i], NULL, writer_main, NULL) != 0)
			fatal("event=thread_failed what=outbox_writer");
}

void
ingest_outbox_stop(void)
{
	pthread_mutex_lock(&queue.lock);
	queue.stopping = true;
	pthread_cond_broadcast(&queue.cond);
	pthread_mutex_unlock(&queue.lock);
	for (int i = 0; i < n_writers; i++)
		pthread_join(writers[i], NULL);
	free(writers);
}
