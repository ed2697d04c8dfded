/*
 * process.c: `wal-worker process`, the processor of topics whose records need processing.
 *
 * Each pass claims a batch of pending rows (SKIP LOCKED, a lease and a fencing token per
 * row), runs each row's processor (SQL functions in the database, HTTP transform services
 * from here) and hands the outcome back; the database writes a result only from the
 * row's current holder within its lease, so any number of processors run side by side
 * and a late or crashed one writes nothing. The relay then ships the processed payload.
 *
 * A SQL processor that outlives the lease gets the whole batch call cancelled; the next
 * claims are then one row at a time (doubling back after each clean batch), so a row
 * that hangs its processor costs other rows no further attempts.
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
	int claim_rows;        /* MAX_CLAIM_ROWS, or fewer after a SQL processor timed out */
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
		"SQL processor calls cancelled because a processor outlived the lease.", 0, NULL);
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

static bool
ensure_db(process_state *st)
{
	bool fresh;
	bool ok = db_ensure(&st->db, st->opts->conninfo, "process", "not processing", &fresh);

	atomic_store(&st->connected, ok);
	if (fresh)
		PQsetNoticeProcessor(st->db, log_db_notice, NULL);
	return ok;
}

/* Counts and logs one row's outcome. */
static void
report_outcome(process_state *st, const attempt_result *r)
{
	const claimed_row *row = r->row;
	const char *labels[] = {row->topic};
	const char *detail = r->detail ? r->detail : "";

	switch (r->outcome)
	{
		case OUTCOME_PROCESSED:
			metric_add(st->processed, 1, labels);
			log_debug("event=processed id=%" PRId64 " topic=%s attempt=%d", row->id, row->topic,
					  row->attempts);
			break;
		case OUTCOME_FAILED:
		case OUTCOME_DEAD:
			metric_add(st->failed, 1, labels);
			if (r->outcome == OUTCOME_DEAD)
				metric_add(st->dead, 1, labels);
			log_warn("event=processing_failed id=%" PRId64 " topic=%s key=%s attempt=%d "
					 "error=\"%s\" next=%s",
					 row->id, row->topic, row->idempotency_key, row->attempts, detail,
					 r->outcome == OUTCOME_DEAD ? "dead_letters" : "retry_after_backoff");
			break;
		case OUTCOME_REFUSED:
			metric_add(st->refused, 1, labels);
			log_warn("event=result_refused id=%" PRId64 " topic=%s attempt=%d detail=\"%s\" "
					 "msg=\"nothing written; the row's current holder writes its result\"",
					 row->id, row->topic, row->attempts, detail);
			break;
		case OUTCOME_UNKNOWN:
			break; /* the failed call was logged; the lease expiry returns the row */
	}
}

/* SQL rows first, HTTP rows after: each kind is then run as one slice of the array. */
static int
order_by_kind(claimed_row *rows, int n, attempt_result *results)
{
	int n_sql = 0, next_http;

	for (int i = 0; i < n; i++)
		n_sql += rows[i].kind == PROCESSOR_SQL;
	next_http = n_sql;
	for (int i = 0, next_sql = 0; i < n; i++)
	{
		attempt_result *r = &results[rows[i].kind == PROCESSOR_SQL ? next_sql++ : next_http++];

		r->row = &rows[i];
		r->outcome = OUTCOME_UNKNOWN;
	}
	return n_sql;
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

/* Runs one claimed batch to its outcomes. */
static void
run_batch(process_state *st, claimed_row *rows, int n)
{
	attempt_result *results = calloc(n, sizeof(attempt_result));
	int n_sql;
	long sql_timeout_ms = 0;
	bool timed_out = false;
	bool db_ok = true;

	if (results == NULL)
		fatal("event=out_of_memory");
	n_sql = order_by_kind(rows, n, results);
	for (int i = 0; i < n_sql; i++)
		if (results[i].row->lease_ms_left > sql_timeout_ms)
			sql_timeout_ms = results[i].row->lease_ms_left;
	/* A little past the lease, so a result that is merely late is refused by the database
	 * (and counted) rather than cut off. */
	if (n_sql > 0)
		db_ok = run_sql_processors(st->db, results, n_sql, sql_timeout_ms + 1000, &timed_out);
	if (n - n_sql > 0)
	{
		http_finish finish = {st, true};

		run_http_processors(results + n_sql, n - n_sql, finish_http_attempts, &finish);
		db_ok = finish.db_ok && db_ok;
	}
	if (timed_out)
		metric_add(st->sql_timeouts, 1, NULL);
	else if (!db_ok)
		metric_add(st->db_errors, 1, NULL);

	for (int i = 0; i < n; i++)
		report_outcome(st, &results[i]);
	if (timed_out)
		st->claim_rows = 1;
	else if (db_ok && st->claim_rows < MAX_CLAIM_ROWS)
		st->claim_rows = st->claim_rows * 2 > MAX_CLAIM_ROWS ? MAX_CLAIM_ROWS : st->claim_rows * 2;
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

/* One claim and its batch; false when there was nothing to do (or the database failed). */
static bool
process_one_batch(process_state *st)
{
	claimed_row *rows = NULL;
	int n;
	int64_t started = now_ms();
	double seconds;

	return_expired_leases(st);
	n = claim_rows_to_process(st->db, st->claim_rows, &rows);
	if (n <= 0)
	{
		if (n < 0)
			metric_add(st->db_errors, 1, NULL);
		return false;
	}
	metric_add(st->claimed, n, NULL);
	log_debug("event=claimed rows=%d ms=%" PRId64, n, now_ms() - started);
	run_batch(st, rows, n);
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
	process_state st = {.opts = opts, .claim_rows = MAX_CLAIM_ROWS};
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
	log_info("event=stopped");
	return 0;
}
