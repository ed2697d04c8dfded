/*
 * db_connect.c: see db_connect.h.
 */
#include "db_connect.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"

char *
db_pinned_options(const char *conninfo)
{
	static const char pin[] = "-c search_path=pg_catalog,pg_temp";
	PQconninfoOption *parsed = conninfo && *conninfo ? PQconninfoParse(conninfo, NULL) : NULL;
	const char *given = getenv("PGOPTIONS");
	char *options;

	for (PQconninfoOption *o = parsed; o && o->keyword; o++)
		if (strcmp(o->keyword, "options") == 0 && o->val)
			given = o->val;
	options = malloc((given ? strlen(given) : 0) + sizeof(pin) + 1);
	if (options != NULL)
		sprintf(options, "%s%s%s", given ? given : "", given ? " " : "", pin);
	PQconninfoFree(parsed);
	return options;
}

/* Opens a connection the worker's way; start: PQconnectStartParams, else PQconnectdbParams. */
static PGconn *
open_connection(const char *conninfo, const char *role, bool start)
{
	char application_name[64];
	char *options = db_pinned_options(conninfo);
	/* Defaults first: settings in the expanded conninfo that follows override them, but
	 * options, which come last (they hold the conninfo's own). */
	const char *keys[] = {"connect_timeout", "fallback_application_name", "dbname", "options",
						  NULL};
	const char *values[] = {"5", application_name, conninfo ? conninfo : "", options, NULL};
	PGconn *conn;

	snprintf(application_name, sizeof(application_name), "wal-worker %s", role);
	conn = start ? PQconnectStartParams(keys, values, 1) : PQconnectdbParams(keys, values, 1);
	free(options);
	return conn;
}

PGconn *
db_connect(const char *conninfo, const char *role)
{
	return open_connection(conninfo, role, false);
}

PGconn *
db_connect_start(const char *conninfo, const char *role)
{
	return open_connection(conninfo, role, true);
}

PostgresPollingStatusType
db_connect_advance(PGconn *conn, PostgresPollingStatusType last)
{
	struct pollfd p = {.fd = PQsocket(conn),
					   .events = last == PGRES_POLLING_READING ? POLLIN : POLLOUT};

	if (PQstatus(conn) == CONNECTION_BAD)
		return PGRES_POLLING_FAILED;
	/* libpq wants to be polled only once its socket is ready (libpq-connect). */
	if (p.fd >= 0 && poll(&p, 1, 0) == 0)
		return last;
	return PQconnectPoll(conn);
}

bool
db_ensure(PGconn **conn, const char *conninfo, const char *role, const char *waiting, bool *fresh)
{
	if (fresh)
		*fresh = false;
	if (*conn && PQstatus(*conn) == CONNECTION_OK)
		return true;
	if (*conn)
		PQfinish(*conn);
	*conn = db_connect(conninfo, role);
	if (PQstatus(*conn) == CONNECTION_OK)
	{
		log_info("event=db_connected");
		if (fresh)
			*fresh = true;
		return true;
	}
	log_error("event=db_unreachable error=\"%.*s\" msg=\"%s until it is back\"",
			  (int) strcspn(PQerrorMessage(*conn), "\n"), PQerrorMessage(*conn), waiting);
	PQfinish(*conn);
	*conn = NULL;
	return false;
}

/* Waits until the connection has a whole result to give, or the deadline passes. */
static bool
wait_for_result(PGconn *conn, int64_t deadline_ms, bool *timed_out)
{
	while (PQisBusy(conn))
	{
		struct pollfd p = {.fd = PQsocket(conn), .events = POLLIN};
		int64_t left = deadline_ms - now_ms();

		if (left <= 0)
		{
			*timed_out = true;
			return false;
		}
		if (poll(&p, 1, (int) left) < 0 && errno != EINTR)
			return false;
		if (!PQconsumeInput(conn))
			return false;
	}
	return true;
}

PGresult *
db_exec_within(PGconn *conn, const char *sql, int n, const char *const *values, long timeout_ms,
			   bool *timed_out)
{
	int64_t deadline_ms = now_ms() + timeout_ms;
	PGresult *last = NULL, *res;

	*timed_out = false;
	if (!PQsendQueryParams(conn, sql, n, NULL, values, NULL, NULL, 0))
		return NULL;
	for (;;)
	{
		if (!wait_for_result(conn, deadline_ms, timed_out))
		{
			PQclear(last);
			return NULL;
		}
		if ((res = PQgetResult(conn)) == NULL)
			return last;
		PQclear(last);
		last = res;
	}
}
