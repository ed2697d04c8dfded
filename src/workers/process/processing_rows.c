/*
 * processing_rows.c: claiming, running and finishing processing rows through the
 * extension's functions (see processing_rows.h). Arrays go to the database as text
 * array literals, payloads inside them as hex bytea, so one call carries a whole batch.
 */
#include "process/processing_rows.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/pg_array.h"

/* The ids, or the lease tokens, of results as an int8[] literal (malloc'd). */
static char *
id_array(attempt_result *const *results, int n, bool tokens)
{
	pg_array a;

	pg_array_begin(&a);
	for (int i = 0; i < n; i++)
		pg_array_add_int64(&a, tokens ? results[i]->row->lease_token : results[i]->row->id);
	return pg_array_finish(&a);
}

/* The processed payloads of results as a bytea[] literal: NULL for a failed attempt. */
static char *
payload_array(attempt_result *const *results, int n)
{
	pg_array a;

	pg_array_begin(&a);
	for (int i = 0; i < n; i++)
		pg_array_add_bytea(&a, results[i]->error ? NULL : results[i]->payload,
						   results[i]->payload_len);
	return pg_array_finish(&a);
}

/* The errors of results as a text[] literal: NULL for a processed payload. */
static char *
error_array(attempt_result *const *results, int n)
{
	pg_array a;

	pg_array_begin(&a);
	for (int i = 0; i < n; i++)
		pg_array_add_text(&a, results[i]->error);
	return pg_array_finish(&a);
}

static char *
xstrdup(const char *s)
{
	char *copy = strdup(s ? s : "");

	if (copy == NULL)
		fatal("event=out_of_memory");
	return copy;
}

static const char *
first_line(PGconn *db)
{
	static char line[512];
	const char *msg = PQerrorMessage(db);
	size_t n = strcspn(msg, "\n");

	if (n >= sizeof(line))
		n = sizeof(line) - 1;
	memcpy(line, msg, n);
	line[n] = '\0';
	return line;
}

int
claim_rows_to_process(PGconn *db, int max_rows, processor_kind kind, claimed_row **rows)
{
	char limit[16];
	const char *params[2] = {limit, kind == PROCESSOR_SQL ? "sql" : "http"};
	PGresult *res;
	int n;

	snprintf(limit, sizeof(limit), "%d", max_rows);
	res = PQexecParams(db,
					   "SELECT id, lease_token, attempts, lease_ms_left, processing_timeout_ms,"
					   " processor_kind, topic, idempotency_key, content_type, processor, payload,"
					   " processing_lease_ms, max_payload_bytes, traceparent"
					   " FROM wal_delivery.claim_for_processor($1, $2)",
					   2, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		log_error("event=claim_failed error=\"%s\" msg=\"retrying after a pause\"", first_line(db));
		PQclear(res);
		return -1;
	}
	n = PQntuples(res);
	*rows = n ? calloc(n, sizeof(claimed_row)) : NULL;
	if (n && *rows == NULL)
		fatal("event=out_of_memory rows=%d", n);
	for (int i = 0; i < n; i++)
	{
		claimed_row *r = &(*rows)[i];
		unsigned char *raw;

		r->id = strtoll(PQgetvalue(res, i, 0), NULL, 10);
		r->lease_token = strtoll(PQgetvalue(res, i, 1), NULL, 10);
		r->attempts = atoi(PQgetvalue(res, i, 2));
		r->lease_ms_left = strtol(PQgetvalue(res, i, 3), NULL, 10);
		r->timeout_ms = strtol(PQgetvalue(res, i, 4), NULL, 10);
		r->kind = strcmp(PQgetvalue(res, i, 5), "http") == 0 ? PROCESSOR_HTTP : PROCESSOR_SQL;
		r->topic = xstrdup(PQgetvalue(res, i, 6));
		r->idempotency_key = xstrdup(PQgetvalue(res, i, 7));
		r->content_type = xstrdup(PQgetvalue(res, i, 8));
		r->processor = xstrdup(PQgetvalue(res, i, 9));
		r->lease_ms = strtol(PQgetvalue(res, i, 11), NULL, 10);
		r->max_payload_bytes = strtol(PQgetvalue(res, i, 12), NULL, 10);
		r->has_trace = !PQgetisnull(res, i, 13) &&
					   trace_context_parse(PQgetvalue(res, i, 13), (size_t) PQgetlength(res, i, 13),
										   &r->trace) == NULL;
		raw = PQunescapeBytea((const unsigned char *) PQgetvalue(res, i, 10), &r->payload_len);
		if (raw == NULL)
			fatal("event=out_of_memory");
		r->payload = malloc(r->payload_len + 1);
		if (r->payload == NULL)
			fatal("event=out_of_memory bytes=%zu", r->payload_len + 1);
		memcpy(r->payload, raw, r->payload_len);
		r->payload[r->payload_len] = '\0';
		PQfreemem(raw);
	}
	PQclear(res);
	return n;
}

void
free_claimed_rows(claimed_row *rows, int n)
{
	for (int i = 0; i < n; i++)
	{
		free(rows[i].topic);
		free(rows[i].idempotency_key);
		free(rows[i].content_type);
		free(rows[i].processor);
		free(rows[i].payload);
	}
	free(rows);
}

int
expire_processing_leases(PGconn *db)
{
	PGresult *res = PQexec(db, "SELECT wal_delivery.expire_processing_leases()");
	int n = -1;

	if (PQresultStatus(res) == PGRES_TUPLES_OK)
		n = atoi(PQgetvalue(res, 0, 0));
	else
		log_error("event=expire_leases_failed error=\"%s\"", first_line(db));
	PQclear(res);
	return n;
}

static row_outcome
outcome_from_name(const char *name)
{
	if (strcmp(name, "processed") == 0)
		return OUTCOME_PROCESSED;
	if (strcmp(name, "failed") == 0)
		return OUTCOME_FAILED;
	if (strcmp(name, "dead") == 0)
		return OUTCOME_DEAD;
	if (strcmp(name, "refused") == 0)
		return OUTCOME_REFUSED;
	return OUTCOME_UNKNOWN;
}

const char *
row_outcome_name(row_outcome outcome)
{
	static const char *const names[] = {"processed", "failed",   "dead",
										"refused",   "released", "unknown"};

	return names[outcome];
}

/* Matches each (id, outcome, detail) row of res to its result, by id. */
static void
take_outcomes(PGresult *res, attempt_result *const *results, int n)
{
	for (int i = 0; i < PQntuples(res); i++)
	{
		int64_t id = strtoll(PQgetvalue(res, i, 0), NULL, 10);

		for (int j = 0; j < n; j++)
		{
			if (results[j]->row->id != id || results[j]->outcome != OUTCOME_UNKNOWN)
				continue;
			results[j]->outcome = outcome_from_name(PQgetvalue(res, i, 1));
			if (!PQgetisnull(res, i, 2))
				results[j]->detail = xstrdup(PQgetvalue(res, i, 2));
			break;
		}
	}
}

/* Runs a statement that returns nothing the caller needs; false (logged) on an error. */
static bool
exec_command(PGconn *db, const char *sql, int n_params, const char *const *params,
			 const char *event)
{
	PGresult *res = PQexecParams(db, sql, n_params, NULL, params, NULL, NULL, 0);
	ExecStatusType status = PQresultStatus(res);
	bool ok = status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK;

	if (!ok)
		log_error("event=%s error=\"%s\"", event, first_line(db));
	PQclear(res);
	return ok;
}

/* COMMIT, checked: a transaction that failed answers COMMIT with ROLLBACK, not an error. */
static bool
commit_batch(PGconn *db)
{
	PGresult *res = PQexec(db, "COMMIT");
	bool ok = PQresultStatus(res) == PGRES_COMMAND_OK && strcmp(PQcmdStatus(res), "COMMIT") == 0;

	if (!ok)
		log_error("event=commit_failed status=%s error=\"%s\"", PQcmdStatus(res), first_line(db));
	PQclear(res);
	return ok;
}

/* Locks every row of the batch for this transaction; the ones no longer held are refused. */
static bool
hold_sql_rows(PGconn *db, attempt_result *results, int n)
{
	attempt_result **each = calloc(n, sizeof(attempt_result *));
	char *ids, *tokens;
	const char *params[2];
	PGresult *res;
	bool ok;

	if (each == NULL)
		fatal("event=out_of_memory");
	for (int i = 0; i < n; i++)
		each[i] = &results[i];
	params[0] = ids = id_array(each, n, false);
	params[1] = tokens = id_array(each, n, true);
	res =
		PQexecParams(db,
					 "SELECT id, CASE WHEN refusal IS NULL THEN 'held' ELSE 'refused' END, refusal"
					 " FROM wal_delivery.hold_processing_rows($1, $2)",
					 2, NULL, params, NULL, NULL, 0);
	ok = PQresultStatus(res) == PGRES_TUPLES_OK;
	if (ok)
		take_outcomes(res, each, n); /* "held" leaves a row UNKNOWN, to be run */
	else
		log_error("event=hold_rows_failed rows=%d first_id=%" PRId64 " error=\"%s\"", n,
				  results[0].row->id, first_line(db));
	PQclear(res);
	free(ids);
	free(tokens);
	free(each);
	return ok;
}

/* The statement timeout of the rows that follow, set only when it changes. */
static bool
set_row_timeout(PGconn *db, long ms, long *current)
{
	char value[32];
	const char *params[1] = {value};

	if (ms == *current)
		return true;
	snprintf(value, sizeof(value), "%ld", ms);
	if (!exec_command(db, "SELECT set_config('statement_timeout', $1, true)", 1, params,
					  "set_statement_timeout_failed"))
		return false;
	*current = ms;
	return true;
}

/* One row's processor, in its own statement; false when the statement itself failed. */
static bool
run_sql_row(PGconn *db, attempt_result *r)
{
	char id[24], token[24];
	const char *params[2] = {id, token};
	PGresult *res;
	bool ok;

	snprintf(id, sizeof(id), "%" PRId64, r->row->id);
	snprintf(token, sizeof(token), "%" PRId64, r->row->lease_token);
	res = PQexecParams(db,
					   "SELECT outcome, detail, timed_out"
					   " FROM wal_delivery.run_sql_processor_row($1, $2)",
					   2, NULL, params, NULL, NULL, 0);
	ok = PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1;
	if (ok)
	{
		r->outcome = outcome_from_name(PQgetvalue(res, 0, 0));
		if (!PQgetisnull(res, 0, 1))
			r->detail = xstrdup(PQgetvalue(res, 0, 1));
		r->timed_out = strcmp(PQgetvalue(res, 0, 2), "t") == 0;
	}
	else
		log_row(LOG_ERROR, r->row,
				"event=sql_processor_failed id=%" PRId64 " error=\"%s\" msg=\"the batch is "
				"rolled back; its other rows are released without spending an attempt, this "
				"one waits for its lease\"",
				r->row->id, first_line(db));
	PQclear(res);
	return ok;
}

/*
 * Gives back the rows of results whose outcome is still UNKNOWN, except skip (or none when
 * NULL), without spending their attempt; they become RELEASED when that worked.
 */
static bool
release_rows(PGconn *db, attempt_result *results, int n, const attempt_result *skip)
{
	attempt_result **each = calloc(n, sizeof(attempt_result *));
	const char *params[2];
	int k = 0;
	bool ok = true;

	if (each == NULL)
		fatal("event=out_of_memory");
	for (int i = 0; i < n; i++)
		if (results[i].outcome == OUTCOME_UNKNOWN && &results[i] != skip)
			each[k++] = &results[i];
	if (k > 0)
	{
		char *ids = id_array(each, k, false), *tokens = id_array(each, k, true);

		params[0] = ids;
		params[1] = tokens;
		ok = exec_command(db, "SELECT wal_delivery.release_processing_rows($1, $2)", 2, params,
						  "release_rows_failed");
		free(ids);
		free(tokens);
	}
	for (int i = 0; ok && i < k; i++)
		each[i]->outcome = OUTCOME_RELEASED;
	free(each);
	return ok;
}

/* Nothing of the batch was written: every outcome is unknown again. */
static void
forget_outcomes(attempt_result *results, int n)
{
	for (int i = 0; i < n; i++)
	{
		results[i].outcome = OUTCOME_UNKNOWN;
		results[i].timed_out = false;
		free(results[i].detail);
		results[i].detail = NULL;
	}
}

/* Runs the held rows one statement each; the row whose statement failed, or NULL. */
static attempt_result *
run_held_rows(PGconn *db, attempt_result *results, int n, const volatile sig_atomic_t *stop)
{
	long timeout_ms = -1;

	for (int i = 0; i < n && !*stop; i++)
	{
		attempt_result *r = &results[i];

		if (r->outcome != OUTCOME_UNKNOWN) /* refused by the hold */
			continue;
		/* A little past the lease, so a result that is merely late is refused by the
		 * database (and counted) rather than cut off. */
		if (!set_row_timeout(db, r->row->lease_ms + 1000, &timeout_ms) || !run_sql_row(db, r))
			return r;
	}
	return NULL;
}

bool
run_sql_batch(PGconn *db, attempt_result *results, int n, const volatile sig_atomic_t *stop)
{
	attempt_result *failed;

	if (n == 0)
		return true;
	if (!exec_command(db, "BEGIN", 0, NULL, "begin_failed"))
		return false;
	if (!hold_sql_rows(db, results, n))
	{
		exec_command(db, "ROLLBACK", 0, NULL, "rollback_failed");
		forget_outcomes(results, n);
		return false;
	}
	failed = run_held_rows(db, results, n, stop);
	if (failed == NULL && release_rows(db, results, n, NULL) && commit_batch(db))
		return true;
	exec_command(db, "ROLLBACK", 0, NULL, "rollback_failed");
	forget_outcomes(results, n);
	if (PQstatus(db) == CONNECTION_OK)
		release_rows(db, results, n, failed);
	return false;
}

bool
finish_attempts(PGconn *db, attempt_result *const *results, int n)
{
	char *ids, *tokens, *payloads, *errors;
	const char *params[4];
	PGresult *res;
	bool ok;

	if (n == 0)
		return true;
	params[0] = ids = id_array(results, n, false);
	params[1] = tokens = id_array(results, n, true);
	params[2] = payloads = payload_array(results, n);
	params[3] = errors = error_array(results, n);
	res = PQexecParams(
		db, "SELECT id, outcome, detail FROM wal_delivery.finish_processing_batch($1, $2, $3, $4)",
		4, NULL, params, NULL, NULL, 0);
	ok = PQresultStatus(res) == PGRES_TUPLES_OK;
	if (ok)
		take_outcomes(res, results, n);
	else
		log_error("event=finish_failed rows=%d first_id=%" PRId64
				  " error=\"%s\" msg=\"the lease expiry returns the rows\"",
				  n, results[0]->row->id, first_line(db));
	PQclear(res);
	free(ids);
	free(tokens);
	free(payloads);
	free(errors);
	return ok;
}

void
free_attempt_results(attempt_result *results, int n)
{
	for (int i = 0; i < n; i++)
	{
		free(results[i].payload);
		free(results[i].error);
		free(results[i].detail);
	}
	free(results);
}
