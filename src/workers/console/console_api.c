/*
 * console_api.c: the API's routing and its one way of running a query (console_api.h).
 */
#include "console/console_api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

static unsigned int
status_for(const char *sqlstate)
{
	if (sqlstate == NULL)
		return 500;
	if (strcmp(sqlstate, "42501") == 0)
		return 403;
	if (strcmp(sqlstate, "42704") == 0 || strcmp(sqlstate, "P0002") == 0)
		return 404;
	if (strcmp(sqlstate, "55000") == 0)
		return 409;
	if (strncmp(sqlstate, "22", 2) == 0 || strncmp(sqlstate, "23", 2) == 0)
		return 400;
	if (strcmp(sqlstate, "57014") == 0)
		return 503;
	return 500;
}

PGresult *
console_query(console_request *r, console_answer *a, const char *sql, int n_params,
			  const char *const *params)
{
	console_session *s = r->session;
	PGresult *res;
	const char *sqlstate, *message, *hint;
	json_t *error;

	pthread_mutex_lock(&s->conn_lock);
	res = PQexecParams(s->conn, sql, n_params, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(res) == PGRES_TUPLES_OK || PQresultStatus(res) == PGRES_COMMAND_OK)
	{
		pthread_mutex_unlock(&s->conn_lock);
		return res;
	}
	if (PQstatus(s->conn) != CONNECTION_OK)
	{
		pthread_mutex_unlock(&s->conn_lock);
		PQclear(res);
		log_warn("event=session_connection_lost user=%s", s->user);
		console_session_end(s);
		console_answer_error(a, 401,
							 "the database closed this session's connection; sign in again");
		return NULL;
	}
	pthread_mutex_unlock(&s->conn_lock);
	sqlstate = PQresultErrorField(res, PG_DIAG_SQLSTATE);
	message = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
	hint = PQresultErrorField(res, PG_DIAG_MESSAGE_HINT);
	error = json_pack("{s:s, s:s?, s:s?}", "error", message ? message : "the query failed",
					  "sqlstate", sqlstate, "hint", hint);
	console_answer_json(a, status_for(sqlstate), error);
	PQclear(res);
	return NULL;
}

void
console_answer_query(console_request *r, console_answer *a, const char *sql, int n_params,
					 const char *const *params)
{
	PGresult *res = console_query(r, a, sql, n_params, params);

	if (res == NULL)
		return;
	if (PQntuples(res) == 0 || PQgetisnull(res, 0, 0))
		console_answer_error(a, 404, "not found");
	else
		console_answer_json_text(a, 200, PQgetvalue(res, 0, 0));
	PQclear(res);
}

/* path after prefix: "" for the prefix itself, the rest after a "/", or NULL. */
static const char *
under(const char *path, const char *prefix)
{
	size_t n = strlen(prefix);

	if (strncmp(path, prefix, n) != 0)
		return NULL;
	if (path[n] == '\0')
		return "";
	return path[n] == '/' ? path + n + 1 : NULL;
}

void
console_api_dispatch(console_request *r, console_answer *a)
{
	const char *rest;
	bool get = strcmp(r->method, "GET") == 0;

	if (strcmp(r->path, "/api/overview") == 0 && get)
		console_api_overview(r, a);
	else if ((rest = under(r->path, "/api/dead-letters")) != NULL)
		console_api_dead_letters(r, a, rest);
	else if ((rest = under(r->path, "/api/destinations")) != NULL)
		console_api_destinations(r, a, rest);
	else if ((rest = under(r->path, "/api/archive")) != NULL)
		console_api_archive(r, a, rest);
	else if (strcmp(r->path, "/api/audit") == 0 && get)
		console_api_audit(r, a);
	else
		console_answer_error(a, 404, "no such endpoint (see docs/operations.md, \"The console\")");
}
