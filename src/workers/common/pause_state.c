/*
 * pause_state.c: the shared pause state (see pause_state.h).
 */
#include "pause_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "clock.h"
#include "db_connect.h"
#include "log.h"
#include "pause_channel.h"

#define REFRESH_INTERVAL_MS   5000
#define RECONNECT_INTERVAL_MS 2000
/*
 * The worker's loop waits on this connection, so a database that hangs may cost it this
 * much per statement (the server ends a lock wait sooner: STATEMENT_TIMEOUT) ...
 */
#define ANSWER_TIMEOUT_MS 3000
#define STATEMENT_TIMEOUT "2s"
/*
 * ... and a connect, made step by step on each poll, is given this long before it is
 * dropped; after one that timed out rather than being refused, the next waits longer.
 */
#define CONNECT_TIMEOUT_MS         5000
#define RECONNECT_AFTER_TIMEOUT_MS 20000
#define CHECK_INTERVAL_MS          20 /* how often the main loop's poll looks for a NOTIFY */
/* How long a reachable database may lag behind a pause heard on the pause topic. */
#define ANNOUNCED_PAUSE_CONFIRM_MS 10000
/* How often a process that announces pauses repeats those in force (divided by --time-scale). */
#define REANNOUNCE_INTERVAL_MS 20000

typedef struct pause_entry
{
	char *destination;
	bool paused;           /* as the database last said */
	int64_t next_probe_ms; /* wall clock */
	int64_t since_ms;      /* wall clock: when the database last saw it pause or resume */
	/* A pause decided here and not yet written to the database. */
	bool pause_pending;
	int pending_step;
	char *pending_error;
	long pending_probe_after_ms;
	int64_t pending_since_ms; /* wall clock */
	/* A pause heard on the pause topic that the database has not shown yet. */
	bool announced;
	int64_t announced_at_ms;    /* wall clock: when that pause began */
	int64_t announced_until_ms; /* monotonic; INT64_MAX until the database was read */
} pause_entry;

struct pause_state
{
	const worker_options *opts;
	char *holder;
	PGconn *conn;
	PostgresPollingStatusType connect_step; /* of conn's handshake, while handshaking() */
	int64_t connect_deadline_ms;
	long refresh_interval_ms;
	int64_t next_refresh_ms;
	int64_t next_check_ms;
	int64_t next_reconnect_ms;
	bool down_logged;
	pause_channel *channel; /* NULL: pauses come from the database alone */
	bool announces;         /* this process decides pauses and announces them */
	int64_t next_reannounce_ms;
	bool heard_any; /* since the last poll */
	pause_entry *entries;
	int n_entries;
};

static pause_entry *
find_entry(const pause_state *ps, const char *destination)
{
	for (int i = 0; i < ps->n_entries; i++)
		if (strcmp(ps->entries[i].destination, destination) == 0)
			return &ps->entries[i];
	return NULL;
}

static pause_entry *
get_entry(pause_state *ps, const char *destination)
{
	pause_entry *e = find_entry(ps, destination);

	if (e)
		return e;
	ps->entries = realloc(ps->entries, sizeof(pause_entry) * (ps->n_entries + 1));
	e = &ps->entries[ps->n_entries++];
	memset(e, 0, sizeof(*e));
	e->destination = strdup(destination);
	return e;
}

/* One statement, bounded by ANSWER_TIMEOUT_MS; NULL (logged, connection closed) on failure. */
static PGresult *
run_on_connection(pause_state *ps, const char *sql, int n, const char *const *values)
{
	bool timed_out;
	PGresult *res = db_exec_within(ps->conn, sql, n, values, ANSWER_TIMEOUT_MS, &timed_out);

	if (res != NULL &&
		(PQresultStatus(res) == PGRES_TUPLES_OK || PQresultStatus(res) == PGRES_COMMAND_OK))
		return res;
	if (timed_out)
		log_warn("event=pause_state_query_failed error=\"no answer within %d ms\" msg=\"closing "
				 "the connection; using the last known pause states\"",
				 ANSWER_TIMEOUT_MS);
	else
		log_warn("event=pause_state_query_failed error=\"%.*s\"",
				 (int) strcspn(PQerrorMessage(ps->conn), "\n"), PQerrorMessage(ps->conn));
	PQclear(res);
	if (timed_out || PQstatus(ps->conn) != CONNECTION_OK)
	{
		PQfinish(ps->conn);
		ps->conn = NULL;
		ps->down_logged = timed_out; /* a lost connection says so when it connects */
	}
	return NULL;
}

static void
connect_failed(pause_state *ps, const char *why)
{
	if (!ps->down_logged)
		log_warn("event=pause_state_db_unreachable error=\"%.*s\" msg=\"using the last known "
				 "pause states\"",
				 (int) strcspn(why, "\n"), why);
	ps->down_logged = true;
	PQfinish(ps->conn);
	ps->conn = NULL;
}

/* The handshake is done: the session's settings, then the LISTEN. */
static bool
on_connected(pause_state *ps)
{
	PGresult *res;

	if (ps->down_logged)
		log_info("event=pause_state_db_back");
	ps->down_logged = false;
	res = run_on_connection(ps, "SET statement_timeout = '" STATEMENT_TIMEOUT "'", 0, NULL);
	if (res != NULL)
	{
		PQclear(res);
		PQclear(run_on_connection(ps, "LISTEN wal_delivery_pause", 0, NULL));
	}
	ps->next_refresh_ms = 0; /* notifications may have been missed */
	return ps->conn != NULL;
}

/* conn is still in its handshake (db_connect_advance): neither usable nor lost. */
static bool
handshaking(const pause_state *ps)
{
	return ps->conn != NULL && PQstatus(ps->conn) != CONNECTION_OK &&
		   PQstatus(ps->conn) != CONNECTION_BAD;
}

/*
 * True when the connection is usable. A new one is made a step per call, so that a
 * database that does not answer costs the worker's loop nothing while it connects.
 */
static bool
connected(pause_state *ps)
{
	int64_t now = now_ms();

	if (ps->conn && PQstatus(ps->conn) == CONNECTION_OK)
		return true;
	if (!handshaking(ps))
	{
		if (now < ps->next_reconnect_ms)
			return false;
		ps->next_reconnect_ms = now + RECONNECT_INTERVAL_MS;
		if (ps->conn)
			PQfinish(ps->conn);
		ps->conn = db_connect_start(ps->opts->conninfo, ps->opts->role);
		if (ps->conn == NULL)
		{
			connect_failed(ps, "out of memory");
			return false;
		}
		ps->connect_step = PGRES_POLLING_WRITING;
		ps->connect_deadline_ms = now + CONNECT_TIMEOUT_MS;
	}
	ps->connect_step = db_connect_advance(ps->conn, ps->connect_step);
	if (ps->connect_step == PGRES_POLLING_OK)
		return on_connected(ps);
	if (ps->connect_step == PGRES_POLLING_FAILED)
	{
		connect_failed(ps, PQerrorMessage(ps->conn));
		return false;
	}
	if (now >= ps->connect_deadline_ms)
	{
		/* It hung rather than being refused: not worth trying again as soon. */
		ps->next_reconnect_ms = now + RECONNECT_AFTER_TIMEOUT_MS;
		connect_failed(ps, "no answer to the connection within 5 s");
	}
	return false;
}

/* Runs one statement; NULL (logged) on failure. The caller clears the result. */
static PGresult *
run(pause_state *ps, const char *sql, int n, const char *const *values)
{
	if (!connected(ps))
		return NULL;
	return run_on_connection(ps, sql, n, values);
}

static void
interval_ms(char *out, size_t size, long ms)
{
	snprintf(out, size, "%ld milliseconds", ms > 0 ? ms : 1);
}

/* Writes pauses decided here; they stay pending until the database took them. */
static void
write_pending_pauses(pause_state *ps)
{
	for (int i = 0; i < ps->n_entries; i++)
	{
		pause_entry *e = &ps->entries[i];
		char step[16], after[48];
		const char *values[4] = {e->destination, step, e->pending_error, after};
		PGresult *res;

		if (!e->pause_pending)
			continue;
		snprintf(step, sizeof(step), "%d", e->pending_step);
		interval_ms(after, sizeof(after), e->pending_probe_after_ms);
		res = run(ps, "SELECT wal_delivery.pause_destination($1, $2, $3, $4::interval)", 4, values);
		if (res == NULL)
			return;
		log_warn("event=destination_paused destination=%s step=%d by_us=%s error=\"%s\"",
				 e->destination, e->pending_step, PQgetvalue(res, 0, 0), e->pending_error);
		PQclear(res);
		e->pause_pending = false;
		free(e->pending_error);
		e->pending_error = NULL;
		ps->next_refresh_ms = 0;
	}
}

/*
 * A heard pause against what the database says: gone once the database has the pause or
 * shows a resume after it; otherwise kept ANNOUNCED_PAUSE_CONFIRM_MS from the first read
 * that did not show it (its announcer may still be writing it after an outage).
 */
static void
settle_announcement(pause_entry *e, int64_t since_ms)
{
	const char *why = NULL;

	if (!e->announced)
		return;
	if (e->paused)
		why = "the database has it";
	else if (since_ms > e->announced_at_ms)
		why = "the database shows a resume after it";
	else if (e->announced_until_ms == INT64_MAX)
		e->announced_until_ms = now_ms() + ANNOUNCED_PAUSE_CONFIRM_MS;
	else if (now_ms() >= e->announced_until_ms)
		why = "the database never showed it";
	if (why == NULL)
		return;
	e->announced = false;
	log_info("event=heard_pause_settled destination=%s msg=\"%s\"", e->destination, why);
}

/* Re-reads every destination's state; true when one paused or resumed. */
static bool
refresh(pause_state *ps)
{
	PGresult *res = run(ps,
						"SELECT destination, paused, (extract(epoch FROM next_probe_at) * "
						"1000)::bigint, (extract(epoch FROM since) * 1000)::bigint "
						"FROM wal_delivery.destination_pauses",
						0, NULL);
	bool changed = false;

	if (res == NULL)
		return false;
	for (int i = 0; i < ps->n_entries; i++)
	{
		pause_entry *e = &ps->entries[i];
		bool paused = false, was = pause_state_is_paused(ps, e->destination);
		int64_t next_probe = 0, since = 0;

		for (int r = 0; r < PQntuples(res); r++)
			if (strcmp(PQgetvalue(res, r, 0), e->destination) == 0)
			{
				paused = PQgetvalue(res, r, 1)[0] == 't';
				next_probe = PQgetisnull(res, r, 2) ? 0 : strtoll(PQgetvalue(res, r, 2), NULL, 10);
				since = strtoll(PQgetvalue(res, r, 3), NULL, 10);
			}
		e->paused = paused;
		e->next_probe_ms = next_probe;
		e->since_ms = since;
		settle_announcement(e, since);
		changed = changed || was != pause_state_is_paused(ps, e->destination);
	}
	for (int r = 0; r < PQntuples(res); r++)
		if (find_entry(ps, PQgetvalue(res, r, 0)) == NULL)
		{
			pause_entry *e = get_entry(ps, PQgetvalue(res, r, 0));

			e->paused = PQgetvalue(res, r, 1)[0] == 't';
			e->next_probe_ms =
				PQgetisnull(res, r, 2) ? 0 : strtoll(PQgetvalue(res, r, 2), NULL, 10);
			e->since_ms = strtoll(PQgetvalue(res, r, 3), NULL, 10);
			changed = changed || e->paused;
		}
	PQclear(res);
	return changed;
}

/* A pause announced on the pause topic: in effect here at once. */
static void
on_heard(void *arg, const char *destination, const char *by, int64_t since_ms)
{
	pause_state *ps = arg;
	pause_entry *e = get_entry(ps, destination);

	/* Already paused, or an old announcement the database has seen a resume after. */
	if (e->paused || e->pause_pending || e->since_ms > since_ms)
		return;
	if (!e->announced)
		log_warn("event=pause_heard destination=%s by=%s", destination, by);
	ps->heard_any = ps->heard_any || !e->announced;
	e->announced = true;
	e->announced_at_ms = since_ms;
	e->announced_until_ms = INT64_MAX;
}

/*
 * Repeats every pause in force here (written or still pending), so a worker that starts
 * while the database is unreachable learns of it from the pause topic's last minute.
 */
static void
announce_again(pause_state *ps)
{
	if (!ps->announces || ps->channel == NULL || now_ms() < ps->next_reannounce_ms)
		return;
	ps->next_reannounce_ms = now_ms() + (long) (REANNOUNCE_INTERVAL_MS / ps->opts->time_scale);
	for (int i = 0; i < ps->n_entries; i++)
	{
		pause_entry *e = &ps->entries[i];

		if (e->pause_pending)
			pause_channel_announce(ps->channel, e->destination, e->pending_step,
								   e->pending_probe_after_ms, e->pending_since_ms, true);
		else if (e->paused)
			pause_channel_announce(ps->channel, e->destination, 0, 0, e->since_ms, true);
	}
}

pause_state *
pause_state_new(const worker_options *opts, const control_plane_config *config, const char *holder,
				bool announces)
{
	pause_state *ps = calloc(1, sizeof(*ps));
	char errbuf[512];

	ps->opts = opts;
	ps->holder = strdup(holder);
	ps->announces = announces;
	ps->refresh_interval_ms = (long) (REFRESH_INTERVAL_MS / opts->time_scale);
	ps->channel = pause_channel_new(opts, config, holder, errbuf, sizeof(errbuf));
	if (ps->channel == NULL)
		log_warn("event=pause_channel_unavailable error=\"%s\" msg=\"pauses come from the "
				 "database alone\"",
				 errbuf);
	/*
	 * The first connection is waited for (up to connect_timeout), so the pauses in force
	 * are known before the first delivery; later ones are made a step at a time.
	 */
	ps->conn = db_connect(opts->conninfo, opts->role);
	ps->next_reconnect_ms = now_ms() + RECONNECT_INTERVAL_MS;
	if (PQstatus(ps->conn) == CONNECTION_OK)
		on_connected(ps);
	else
		connect_failed(ps, PQerrorMessage(ps->conn));
	pause_state_poll(ps);
	return ps;
}

void
pause_state_free(pause_state *ps)
{
	if (ps == NULL)
		return;
	if (ps->conn)
		PQfinish(ps->conn);
	pause_channel_free(ps->channel);
	for (int i = 0; i < ps->n_entries; i++)
	{
		free(ps->entries[i].destination);
		free(ps->entries[i].pending_error);
	}
	free(ps->entries);
	free(ps->holder);
	free(ps);
}

bool
pause_state_poll(pause_state *ps)
{
	PGnotify *n;
	bool notified = false, heard;

	if (now_ms() < ps->next_check_ms)
		return false;
	ps->next_check_ms = now_ms() + CHECK_INTERVAL_MS;
	if (ps->channel)
		pause_channel_poll(ps->channel, on_heard, ps);
	heard = ps->heard_any;
	ps->heard_any = false;
	announce_again(ps);
	if (handshaking(ps))
		connected(ps); /* the next step of the handshake, if its socket is ready */
	if (ps->conn && PQstatus(ps->conn) == CONNECTION_OK && PQconsumeInput(ps->conn))
		while ((n = PQnotifies(ps->conn)) != NULL)
		{
			notified = true;
			PQfreemem(n);
		}
	write_pending_pauses(ps);
	if (!notified && now_ms() < ps->next_refresh_ms)
		return heard;
	ps->next_refresh_ms = now_ms() + ps->refresh_interval_ms;
	return refresh(ps) || heard;
}

bool
pause_state_is_paused(const pause_state *ps, const char *destination)
{
	const pause_entry *e = find_entry(ps, destination);

	return e &&
		   (e->paused || e->pause_pending || (e->announced && now_ms() < e->announced_until_ms));
}

int64_t
pause_state_next_probe_ms(const pause_state *ps, const char *destination)
{
	const pause_entry *e = find_entry(ps, destination);

	return e && e->paused ? e->next_probe_ms : 0;
}

void
pause_state_pause(pause_state *ps, const char *destination, int step, const char *error,
				  long probe_after_ms)
{
	pause_entry *e = get_entry(ps, destination);

	if (e->paused || e->pause_pending)
		return;
	e->pause_pending = true;
	e->pending_step = step;
	e->pending_error = strdup(error ? error : "");
	e->pending_probe_after_ms = probe_after_ms;
	e->pending_since_ms = wall_ms();
	/* Announced first: the database may be the part that is down. */
	if (ps->channel)
		pause_channel_announce(ps->channel, destination, step, probe_after_ms, e->pending_since_ms,
							   false);
	write_pending_pauses(ps);
	refresh(ps);
}

bool
pause_state_claim_probe(pause_state *ps, const char *destination, long lease_ms)
{
	char lease[48];
	const char *values[3] = {destination, ps->holder, lease};
	PGresult *res;
	bool claimed;

	interval_ms(lease, sizeof(lease), lease_ms);
	res = run(ps, "SELECT wal_delivery.claim_probe($1, $2, $3::interval)", 3, values);
	if (res == NULL)
		return false;
	claimed = PQgetvalue(res, 0, 0)[0] == 't';
	PQclear(res);
	return claimed;
}

void
pause_state_finish_probe(pause_state *ps, const char *destination, probe_outcome outcome,
						 const char *error, long probe_after_ms)
{
	static const char *const names[] = {"success", "transient", "permanent"};
	char after[48];
	const char *values[5] = {destination, ps->holder, names[outcome], error, after};
	PGresult *res;

	interval_ms(after, sizeof(after), probe_after_ms);
	res = run(ps, "SELECT wal_delivery.finish_probe($1, $2, $3, $4, $5::interval)", 5, values);
	log_warn("event=probe_finished destination=%s outcome=%s resumed=%s error=\"%s\"", destination,
			 names[outcome], res ? PQgetvalue(res, 0, 0) : "unknown", error ? error : "");
	if (res)
		PQclear(res);
	/* A lost answer leaves the lease to expire; the next probe asks again. */
	refresh(ps);
}

bool
pause_state_report_stats(pause_state *ps, json_t *stats)
{
	char *text = json_dumps(stats, JSON_COMPACT);
	const char *values[2] = {ps->holder, text};
	PGresult *res = run(ps, "SELECT wal_delivery.report_step_stats($1, $2::jsonb)", 2, values);

	free(text);
	if (res == NULL)
		return false;
	PQclear(res);
	return true;
}
