/*
 * process.c: `wal-worker process`, the processor of topics whose records need processing.
 *
 * Each pass claims a batch of pending rows (SKIP LOCKED, a lease and a fencing token per
 * row), runs each row's processor (SQL functions in the database, HTTP transform services
 * from here) and hands the outcome back; the database writes a result only from the
 * row's current holder within its lease, so any number of processors run side by side
 * and a late or crashed one writes nothing. The relay then ships the processed payload.
 *
 * A batch is one kind of processor, alternating, so HTTP rows never wait behind SQL rows.
 * SQL rows run one statement each in a transaction that holds the whole batch, each with
 * a statement timeout of its own lease (plus a second) and its lease started when its
 * processor starts: a processor that hangs is cancelled alone, as a failed attempt of its
 * own row, and the other rows spend nothing on it. Processors run as the configured
 * processing role; a processor can RESET ROLE back to the worker's own, so the worker
 * refuses to run as a superuser (checked at every connect).
 */
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <curl/curl.h>
#include <libpq-fe.h>

#include "common/admin_server.h"
#include "common/clock.h"
#include "common/db_connect.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/role_setup.h"
#include "common/sd_notify.h"
#include "common/stop_signal.h"
#include "process/http_processor.h"
#include "process/processing_rows.h"
#include "roles.h"

#define MAX_CLAIM_ROWS  100
#define IDLE_POLL_MS    250
#define EXPIRY_CHECK_MS 1000

typedef struct process_state
{
	const worker_options *opts;
	PGconn *db;
	atomic_bool connected; /* read by the admin server's thread */
	bool superuser;        /* connected as a superuser: the worker exits */
	processor_kind next_kind;
	int64_t empty_until_ms[2]; /* per kind: had nothing to claim, asked again after this */
	int64_t next_expiry_check_ms;
	metric *claimed;
	metric *processed;
	metric *failed;
	metric *dead;
	metric *refused;
	metric *expired;
	metric *batches;
	metric *batch_seconds;
	metric *last_batch_seconds;
	metric *db_errors;
	metric *sql_timeouts;
	metric *released;
} process_state;

static bool
processor_ready(void *arg)
{
	return atomic_load(&((process_state *) arg)->connected);
}

static void
register_metrics(process_state *st)
{
	static const char *const topic[] = {"topic"};

	st->claimed =
		metric_counter("wal_process_claimed_total",
					   "Rows claimed for processing (each claim is one attempt).", 0, NULL);
	st->processed = metric_counter("wal_process_processed_total",
								   "Rows whose processed payload was stored.", 1, topic);
	st->failed = metric_counter(
		"wal_process_failed_total",
		"Attempts that failed (processor error, timeout, bad answer), dead ones included.", 1,
		topic);
	st->dead =
		metric_counter("wal_process_dead_total",
					   "Rows buried in dead_letters after their last failed attempt.", 1, topic);
	st->refused = metric_counter(
		"wal_process_results_refused_total",
		"Results not written because the lease was lost or ran out first (late results).", 1,
		topic);
	st->expired = metric_counter(
		"wal_process_lease_expiries_total",
		"Rows this worker found holding an expired lease and returned to the pool (checked "
		"once a second; claims and the relay's maintenance return them too, uncounted).",
		0, NULL);
	st->batches = metric_counter("wal_process_batches_total", "Batches claimed and run.", 0, NULL);
	st->batch_seconds =
		metric_counter("wal_process_batch_seconds_total",
					   "Time spent running batches, claim to last outcome.", 0, NULL);
	st->last_batch_seconds =
		metric_gauge("wal_process_last_batch_seconds", "How long the last batch took.", 0, NULL);
	st->sql_timeouts = metric_counter(
		"wal_process_sql_timeouts_total",
		"SQL processor calls cancelled because a processor outlived its lease.", 0, NULL);
	st->released = metric_counter(
		"wal_process_released_total",
		"Claimed rows given back unstarted without spending an attempt (a stop, or a batch "
		"the database failed).",
		0, NULL);
	st->db_errors =
		metric_counter("wal_process_db_errors_total",
					   "Database calls that failed (rows wait for their lease).", 0, NULL);
}

/* Server notices (a shutdown warning, say) as log events rather than bare stderr lines. */
static void
log_db_notice(void *arg, const char *message)
{
	(void) arg;
	log_warn("event=db_notice msg=\"%.*s\"", (int) strcspn(message, "\n"), message);
}

/*
 * True when the login is a superuser: a processor can RESET ROLE (or SESSION
 * AUTHORIZATION) back to it, so SQL processors would run with a superuser's rights.
 */
static bool
refuse_superuser(PGconn *db)
{
	const char *superuser = PQparameterStatus(db, "is_superuser");

	if (superuser == NULL || strcmp(superuser, "on") != 0)
		return false;
	log_error("event=superuser_refused user=%s msg=\"wal-worker process does not run as a "
			  "superuser: a SQL processor could RESET ROLE to it; connect as a non-superuser "
			  "member of wal_delivery_worker\"",
			  PQuser(db));
	return true;
}

static bool
ensure_db(process_state *st)
{
	bool fresh;
	bool ok = db_ensure(&st->db, st->opts->conninfo, "process", "not processing", &fresh);

	if (fresh)
	{
		PQsetNoticeProcessor(st->db, log_db_notice, NULL);
		st->superuser = refuse_superuser(st->db);
		ok = ok && !st->superuser;
	}
	atomic_store(&st->connected, ok);
	return ok;
}

/* Counts and logs one row's outcome. */
static void
report_outcome(process_state *st, const attempt_result *r)
{
	const claimed_row *row = r->row;
	const char *labels[] = {row->topic};
	const char *detail = r->detail ? r->detail : "";

	if (r->timed_out)
		metric_add(st->sql_timeouts, 1, NULL);
	switch (r->outcome)
	{
		case OUTCOME_PROCESSED:
			metric_add(st->processed, 1, labels);
			log_row(LOG_DEBUG, row, "event=processed id=%" PRId64 " attempt=%d", row->id,
					row->attempts);
			break;
		case OUTCOME_FAILED:
		case OUTCOME_DEAD:
			metric_add(st->failed, 1, labels);
			if (r->outcome == OUTCOME_DEAD)
				metric_add(st->dead, 1, labels);
			log_row(LOG_WARN, row,
					"event=processing_failed id=%" PRId64 " attempt=%d error=\"%s\" next=%s",
					row->id, row->attempts, detail,
					r->outcome == OUTCOME_DEAD ? "dead_letters" : "retry_after_backoff");
			break;
		case OUTCOME_REFUSED:
			metric_add(st->refused, 1, labels);
			log_row(LOG_WARN, row,
					"event=result_refused id=%" PRId64 " attempt=%d detail=\"%s\" msg=\"nothing "
					"written; the row's current holder writes its result\"",
					row->id, row->attempts, detail);
			break;
		case OUTCOME_RELEASED:
			metric_add(st->released, 1, NULL);
			log_row(LOG_DEBUG, row, "event=released id=%" PRId64, row->id);
			break;
		case OUTCOME_UNKNOWN:
			break; /* the failed call was logged; the lease expiry returns the row */
	}
}

/* Hands completed HTTP attempts to the database as they come (attempts_done_fn). */
typedef struct http_finish
{
	process_state *st;
	bool db_ok;
} http_finish;

static void
finish_http_attempts(void *arg, attempt_result *const *done, int n)
{
	http_finish *f = arg;

	f->db_ok = finish_attempts(f->st->db, done, n) && f->db_ok;
}

/* Runs one claimed batch, all of one kind, to its outcomes. */
static void
run_batch(process_state *st, claimed_row *rows, int n, processor_kind kind)
{
	attempt_result *results = calloc(n, sizeof(attempt_result));
	bool db_ok;

	if (results == NULL)
		fatal("event=out_of_memory");
	for (int i = 0; i < n; i++)
	{
		results[i].row = &rows[i];
		results[i].outcome = OUTCOME_UNKNOWN;
	}
	if (kind == PROCESSOR_SQL)
		db_ok = run_sql_batch(st->db, results, n, &stop_requested);
	else
	{
		http_finish finish = {st, true};

		run_http_processors(results, n, finish_http_attempts, &finish);
		db_ok = finish.db_ok;
	}
	if (!db_ok)
		metric_add(st->db_errors, 1, NULL);
	for (int i = 0; i < n; i++)
		report_outcome(st, &results[i]);
	free_attempt_results(results, n);
}

/*
 * Returns rows whose lease ran out to the pool, counted and logged. Every claim does this
 * too, uncounted; doing it here once a second instead of before every claim keeps the
 * metric without paying for the index scan twice per batch.
 */
static void
return_expired_leases(process_state *st)
{
	int expired;

	if (now_ms() < st->next_expiry_check_ms)
		return;
	st->next_expiry_check_ms = now_ms() + (int64_t) (EXPIRY_CHECK_MS / st->opts->time_scale);
	expired = expire_processing_leases(st->db);
	if (expired < 0)
		metric_add(st->db_errors, 1, NULL);
	else if (expired > 0)
	{
		metric_add(st->expired, expired, NULL);
		log_warn("event=leases_expired rows=%d msg=\"their processors did not finish in time; "
				 "back to pending, or dead after the last attempt\"",
				 expired);
	}
}

/*
 * Claims a batch of the kind whose turn it is, or of the other kind when that one has
 * nothing ready, so both kinds take turns while both have work. A kind that had nothing
 * is asked again only after the idle poll, so a fleet with one kind of processor does not
 * pay a second claim per batch. Sets *kind to the kind claimed; the number of rows, or -1
 * when the database failed.
 */
static int
claim_next_batch(process_state *st, claimed_row **rows, processor_kind *kind)
{
	for (int turn = 0; turn < 2; turn++)
	{
		int n;

		*kind = st->next_kind;
		st->next_kind = *kind == PROCESSOR_SQL ? PROCESSOR_HTTP : PROCESSOR_SQL;
		if (turn == 0 && now_ms() < st->empty_until_ms[*kind])
			continue;
		n = claim_rows_to_process(st->db, MAX_CLAIM_ROWS, *kind, rows);
		if (n != 0)
			return n;
		st->empty_until_ms[*kind] = now_ms() + (int64_t) (IDLE_POLL_MS / st->opts->time_scale);
	}
	return 0;
}

/* One claim and its batch; false when there was nothing to do (or the database failed). */
static bool
process_one_batch(process_state *st)
{
	claimed_row *rows = NULL;
	processor_kind kind;
	int n;
	int64_t started = now_ms();
	double seconds;

	return_expired_leases(st);
	n = claim_next_batch(st, &rows, &kind);
	if (n <= 0)
	{
		if (n < 0)
			metric_add(st->db_errors, 1, NULL);
		return false;
	}
	metric_add(st->claimed, n, NULL);
	log_debug("event=claimed rows=%d kind=%s ms=%" PRId64, n,
			  kind == PROCESSOR_SQL ? "sql" : "http", now_ms() - started);
	run_batch(st, rows, n, kind);
	free_claimed_rows(rows, n);

	seconds = (now_ms() - started) / 1000.0;
	metric_add(st->batches, 1, NULL);
	metric_add(st->batch_seconds, seconds, NULL);
	metric_set(st->last_batch_seconds, seconds, NULL);
	log_debug("event=batch rows=%d ms=%.0f", n, seconds * 1000);
	return true;
}

int
run_process(const worker_options *opts)
{
	process_state st = {.opts = opts, .next_kind = PROCESSOR_SQL};
	admin_server *admin = NULL;
	long idle_ms = (long) (IDLE_POLL_MS / opts->time_scale);

	stop_on_signals();
	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
	{
		log_error("event=curl_init_failed");
		return 1;
	}
	register_metrics(&st);
	{
		admin_handlers handlers = {processor_ready, NULL, &st};

		if (!role_start_admin(opts, &handlers, &admin))
			return 1;
	}
	log_info("event=started max_batch=%d", MAX_CLAIM_ROWS);

	while (!stop_requested)
	{
		sd_notify_loop();
		if (!ensure_db(&st))
		{
			if (st.superuser)
				break;
			sleep(1);
			continue;
		}
		if (process_one_batch(&st))
			continue;
		if (PQstatus(st.db) != CONNECTION_OK)
			atomic_store(&st.connected, false);
		else
			usleep((useconds_t) (idle_ms > 10 ? idle_ms : 10) * 1000);
	}

	if (st.db)
		PQfinish(st.db);
	if (admin)
		admin_server_stop(admin);
	curl_global_cleanup();
	if (st.superuser)
		return 1;
	log_info("event=stopped");
	return 0;
}
