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
#include "common/text_buffer.h"

/* One element of a text[] literal: quoted, with " and \ escaped, or NULL. */
static void
append_text_element(text_buffer *b, const char *s)
{
	if (s == NULL)
	{
		text_buffer_puts(b, "NULL");
		return;
	}
	text_buffer_puts(b, "\"");
	for (const char *p = s; *p; p++)
	{
		if (*p == '"' || *p == '\\')
			text_buffer_append(b, "\\", 1);
		text_buffer_append(b, p, 1);
	}
	text_buffer_puts(b, "\"");
}

/* One element of a bytea[] literal in hex ("\\x..." once the array parser unescapes). */
static void
append_bytea_element(text_buffer *b, const char *bytes, size_t n)
{
	static const char hex[] = "0123456789abcdef";

	if (bytes == NULL)
	{
		text_buffer_puts(b, "NULL");
		return;
	}
	text_buffer_reserve(b, n * 2 + 8);
	text_buffer_puts(b, "\"\\\\x");
	for (size_t i = 0; i < n; i++)
	{
		b->data[b->len++] = hex[(unsigned char) bytes[i] >> 4];
		b->data[b->len++] = hex[(unsigned char) bytes[i] & 15];
	}
	b->data[b->len] = '\0';
	text_buffer_puts(b, "\"");
}

static char *
id_array(attempt_result *const *results, int n, bool tokens)
{
	text_buffer b = {0};
	char num[32];

	text_buffer_puts(&b, "{");
	for (int i = 0; i < n; i++)
	{
		snprintf(num, sizeof(num), "%s%" PRId64, i ? "," : "",
				 tokens ? results[i]->row->lease_token : results[i]->row->id);
		text_buffer_puts(&b, num);
	}
	text_buffer_puts(&b, "}");
	return b.data;
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
claim_rows_to_process(PGconn *db, int max_rows, claimed_row **rows)
{
	char limit[16];
	const char *params[1] = {limit};
	PGresult *res;
	int n;

	snprintf(limit, sizeof(limit), "%d", max_rows);
	res = PQexecParams(db,
					   "SELECT id, lease_token, attempts, lease_ms_left, processing_timeout_ms,"
					   " processor_kind, topic, idempotency_key, content_type, processor, payload"
					   " FROM wal_delivery.claim_for_processor($1)",
					   1, NULL, params, NULL, NULL, 0);
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
	static const char *const names[] = {"processed", "failed", "dead", "refused", "unknown"};

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

static bool
set_statement_timeout(PGconn *db, long ms)
{
	char value[32];
	const char *params[1] = {value};
	PGresult *res;
	bool ok;

	snprintf(value, sizeof(value), "%ld", ms);
	res = PQexecParams(db, "SELECT set_config('statement_timeout', $1, false)", 1, NULL, params,
					   NULL, NULL, 0);
	ok = PQresultStatus(res) == PGRES_TUPLES_OK;
	if (!ok)
		log_error("event=set_statement_timeout_failed error=\"%s\"", first_line(db));
	PQclear(res);
	return ok;
}

bool
run_sql_processors(PGconn *db, attempt_result *results, int n, long statement_timeout_ms,
				   bool *timed_out)
{
	attempt_result **each;
	char *ids, *tokens;
	const char *params[2];
	PGresult *res;
	bool ok;

	*timed_out = false;
	if (n == 0)
		return true;
	if (!set_statement_timeout(db, statement_timeout_ms))
		return false;
	each = malloc(n * sizeof(attempt_result *));
	if (each == NULL)
		fatal("event=out_of_memory");
	for (int i = 0; i < n; i++)
		each[i] = &results[i];
	ids = id_array(each, n, false);
	tokens = id_array(each, n, true);
	params[0] = ids;
	params[1] = tokens;
	res = PQexecParams(db, "SELECT id, outcome, detail FROM wal_delivery.run_sql_processor($1, $2)",
					   2, NULL, params, NULL, NULL, 0);
	ok = PQresultStatus(res) == PGRES_TUPLES_OK;
	if (ok)
		take_outcomes(res, each, n);
	else
	{
		const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);

		*timed_out = state != NULL && strcmp(state, "57014") == 0;
		log_error("event=sql_processors_failed rows=%d first_id=%" PRId64
				  " error=\"%s\" msg=\"%s\"",
				  n, results[0].row->id, first_line(db),
				  *timed_out ? "a processor outlived the lease; the lease expiry returns the "
							   "rows, and the next claims are one row at a time"
							 : "the lease expiry returns the rows");
	}
	PQclear(res);
	free(each);
	free(ids);
	free(tokens);
	return ok;
}

bool
finish_attempts(PGconn *db, attempt_result *const *results, int n)
{
	text_buffer payloads = {0}, errors = {0};
	char *ids, *tokens;
	const char *params[4];
	PGresult *res;
	bool ok;

	if (n == 0)
		return true;
	text_buffer_puts(&payloads, "{");
	text_buffer_puts(&errors, "{");
	for (int i = 0; i < n; i++)
	{
		if (i)
		{
			text_buffer_puts(&payloads, ",");
			text_buffer_puts(&errors, ",");
		}
		append_bytea_element(&payloads, results[i]->error ? NULL : results[i]->payload,
							 results[i]->payload_len);
		append_text_element(&errors, results[i]->error);
	}
	text_buffer_puts(&payloads, "}");
	text_buffer_puts(&errors, "}");
	ids = id_array(results, n, false);
	tokens = id_array(results, n, true);
	params[0] = ids;
	params[1] = tokens;
	params[2] = payloads.data;
	params[3] = errors.data;
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
	free(payloads.data);
	free(errors.data);
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
