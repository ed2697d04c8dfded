/*
 * delivery_stats.c: see delivery_stats.h. Two tables of the same size: the workers count
 * into the live one; the flush thread swaps it with the empty spare under the mutex and
 * sends the spare without holding it, so a slow or absent Postgres never holds a count.
 */
#include "common/delivery_stats.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "common/db_connect.h"
#include "common/log.h"
#include "common/metrics.h"

/* Open addressing at half load at most: a lookup ends after a slot or two. */
#define SLOTS (2 * DELIVERY_STATS_MAX_KEYS)

typedef struct
{
	int64_t minute; /* seconds since the epoch, a multiple of 60; 0: free */
	char *topic;
	char *destination;
	int64_t counts[STAT_KINDS];
} slot;

typedef struct
{
	slot *slots;
	int n;
} table;

struct delivery_stats
{
	char *conninfo;
	char *role;
	PGconn *conn;
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t wake;
	bool stopping;
	bool failing;  /* the last flush failed: logged once until one succeeds */
	bool dropping; /* counts were dropped since the last log line about it */
	table live, spare;
	metric *flushes;
	metric *dropped;
};

static uint64_t
hash(int64_t minute, const char *topic, const char *destination)
{
	uint64_t h = 1469598103934665603ULL ^ (uint64_t) minute;

	for (const char *p = topic; *p; p++)
		h = (h ^ (unsigned char) *p) * 1099511628211ULL;
	h = (h ^ 0xff) * 1099511628211ULL; /* so "ab"+"c" and "a"+"bc" differ */
	for (const char *p = destination; *p; p++)
		h = (h ^ (unsigned char) *p) * 1099511628211ULL;
	return h;
}

/* The key's slot, added when new; NULL when the table is full (or out of memory). */
static slot *
find(table *t, int64_t minute, const char *topic, const char *destination)
{
	size_t i = (size_t) (hash(minute, topic, destination) % SLOTS);

	for (;; i = (i + 1) % SLOTS)
	{
		slot *s = &t->slots[i];

		if (s->minute == 0)
		{
			if (t->n >= DELIVERY_STATS_MAX_KEYS)
				return NULL;
			s->topic = strdup(topic);
			s->destination = strdup(destination);
			if (s->topic == NULL || s->destination == NULL)
			{
				free(s->topic);
				free(s->destination);
				s->topic = s->destination = NULL;
				return NULL;
			}
			s->minute = minute;
			t->n++;
			return s;
		}
		if (s->minute == minute && strcmp(s->topic, topic) == 0 &&
			strcmp(s->destination, destination) == 0)
			return s;
	}
}

static void
clear(table *t)
{
	for (int i = 0; i < SLOTS && t->n > 0; i++)
		if (t->slots[i].minute != 0)
		{
			free(t->slots[i].topic);
			free(t->slots[i].destination);
			memset(&t->slots[i], 0, sizeof(slot));
			t->n--;
		}
}

/* Under the lock: counts that found no slot. */
static void
drop(delivery_stats *ds, int64_t n)
{
	metric_add(ds->dropped, (double) n, NULL);
	if (!ds->dropping)
		log_warn("event=delivery_stats_dropped keys=%d msg=\"per-topic delivery counts dropped: "
				 "Postgres has not taken them for a while (the console's rates will be low)\"",
				 DELIVERY_STATS_MAX_KEYS);
	ds->dropping = true;
}

void
delivery_stats_count(delivery_stats *ds, const char *topic, const char *destination,
					 delivery_stat_kind kind)
{
	int64_t minute = (int64_t) time(NULL) / 60 * 60;
	slot *s;

	if (ds == NULL || topic == NULL || destination == NULL)
		return;
	pthread_mutex_lock(&ds->lock);
	s = find(&ds->live, minute, topic, destination);
	if (s)
		s->counts[kind]++;
	else
		drop(ds, 1);
	pthread_mutex_unlock(&ds->lock);
}

static json_t *
rows_of(const table *t)
{
	json_t *rows = json_array();

	for (int i = 0; i < SLOTS; i++)
	{
		const slot *s = &t->slots[i];

		if (s->minute != 0)
			json_array_append_new(
				rows, json_pack("{s:I, s:s, s:s, s:I, s:I, s:I}", "minute", (json_int_t) s->minute,
								"topic", s->topic, "destination", s->destination, "delivered",
								(json_int_t) s->counts[STAT_DELIVERED], "failed",
								(json_int_t) s->counts[STAT_FAILED], "dead_lettered",
								(json_int_t) s->counts[STAT_DEAD_LETTERED]));
	}
	return rows;
}

/* One call of add_delivery_stats with the spare table; false when Postgres did not take it. */
static bool
send_spare(delivery_stats *ds)
{
	json_t *rows = rows_of(&ds->spare);
	char *text = json_dumps(rows, JSON_COMPACT);
	const char *values[] = {text};
	PGresult *res;
	bool ok = false;
	const char *error = "out of memory";

	json_decref(rows);
	if (text == NULL)
		goto done;
	if (ds->conn == NULL || PQstatus(ds->conn) != CONNECTION_OK)
	{
		if (ds->conn)
			PQfinish(ds->conn);
		ds->conn = db_connect(ds->conninfo, ds->role);
	}
	error = PQerrorMessage(ds->conn);
	if (PQstatus(ds->conn) == CONNECTION_OK)
	{
		res = PQexecParams(ds->conn, "SELECT wal_delivery.add_delivery_stats($1::jsonb)", 1, NULL,
						   values, NULL, NULL, 0);
		ok = PQresultStatus(res) == PGRES_TUPLES_OK;
		if (!ok)
			error = PQresultErrorMessage(res);
		if (!ok && ds->failing == false)
			log_warn("event=delivery_stats_flush_failed keys=%d error=\"%.*s\" msg=\"counts "
					 "kept for the next flush\"",
					 ds->spare.n, (int) strcspn(error, "\n"), error);
		PQclear(res);
		if (ok && ds->failing)
			log_info("event=delivery_stats_flushed keys=%d msg=\"flushing again\"", ds->spare.n);
	}
	else if (ds->failing == false)
		log_warn("event=delivery_stats_flush_failed keys=%d error=\"%.*s\" msg=\"counts kept "
				 "for the next flush\"",
				 ds->spare.n, (int) strcspn(error, "\n"), error);
done:
	free(text);
	ds->failing = !ok;
	metric_add(ds->flushes, 1, (const char *const[]){ok ? "ok" : "failed"});
	return ok;
}

/* Under the lock: the spare's counts go back into the live table, as far as they fit. */
static void
merge_back(delivery_stats *ds)
{
	for (int i = 0; i < SLOTS; i++)
	{
		const slot *from = &ds->spare.slots[i];
		slot *to;

		if (from->minute == 0)
			continue;
		to = find(&ds->live, from->minute, from->topic, from->destination);
		if (to)
			for (int k = 0; k < STAT_KINDS; k++)
				to->counts[k] += from->counts[k];
		else
			drop(ds, from->counts[0] + from->counts[1] + from->counts[2]);
	}
}

static void
flush(delivery_stats *ds)
{
	table t;
	bool ok;

	pthread_mutex_lock(&ds->lock);
	t = ds->live;
	ds->live = ds->spare;
	ds->spare = t;
	pthread_mutex_unlock(&ds->lock);
	if (ds->spare.n == 0)
		return;
	ok = send_spare(ds);
	pthread_mutex_lock(&ds->lock);
	if (ok)
		ds->dropping = false;
	else
		merge_back(ds);
	pthread_mutex_unlock(&ds->lock);
	clear(&ds->spare);
}

static void *
run(void *arg)
{
	delivery_stats *ds = arg;
	bool stopping = false;

	while (!stopping)
	{
		struct timespec until;

		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += DELIVERY_STATS_FLUSH_MS / 1000;
		pthread_mutex_lock(&ds->lock);
		while (!ds->stopping && pthread_cond_timedwait(&ds->wake, &ds->lock, &until) != ETIMEDOUT)
			;
		stopping = ds->stopping;
		pthread_mutex_unlock(&ds->lock);
		/* Stopping with the database away: no connect timeout on the way out. */
		if (!(stopping && ds->failing))
			flush(ds);
	}
	return NULL;
}

delivery_stats *
delivery_stats_start(const char *conninfo, const char *role)
{
	delivery_stats *ds = calloc(1, sizeof(*ds));

	if (ds == NULL)
		return NULL;
	ds->conninfo = strdup(conninfo ? conninfo : "");
	ds->role = strdup(role);
	ds->live.slots = calloc(SLOTS, sizeof(slot));
	ds->spare.slots = calloc(SLOTS, sizeof(slot));
	ds->flushes = metric_counter("wal_delivery_stats_flushes_total",
								 "Flushes of per-topic delivery counts to Postgres, by result.", 1,
								 (const char *const[]){"result"});
	ds->dropped =
		metric_counter("wal_delivery_stats_dropped_total",
					   "Delivery counts dropped: Postgres did not take them in time.", 0, NULL);
	pthread_mutex_init(&ds->lock, NULL);
	pthread_cond_init(&ds->wake, NULL);
	if (ds->conninfo == NULL || ds->role == NULL || ds->live.slots == NULL ||
		ds->spare.slots == NULL || pthread_create(&ds->thread, NULL, run, ds) != 0)
	{
		log_error("event=delivery_stats_off msg=\"no per-topic delivery counts: out of "
				  "memory or threads\"");
		free(ds->conninfo);
		free(ds->role);
		free(ds->live.slots);
		free(ds->spare.slots);
		free(ds);
		return NULL;
	}
	return ds;
}

void
delivery_stats_stop(delivery_stats *ds)
{
	if (ds == NULL)
		return;
	pthread_mutex_lock(&ds->lock);
	ds->stopping = true;
	pthread_cond_signal(&ds->wake);
	pthread_mutex_unlock(&ds->lock);
	pthread_join(ds->thread, NULL);
	if (ds->live.n > 0)
		log_warn("event=delivery_stats_dropped keys=%d msg=\"stopping: the last counts did not "
				 "reach Postgres\"",
				 ds->live.n);
	clear(&ds->live);
	if (ds->conn)
		PQfinish(ds->conn);
	free(ds->live.slots);
	free(ds->spare.slots);
	free(ds->conninfo);
	free(ds->role);
	free(ds);
}
