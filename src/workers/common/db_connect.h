/*
 * db_connect.h: opening a control-plane connection the same way in every worker.
 *
 * The worker's --db conninfo (or the PG* environment when it is empty) decides, with two
 * defaults it can override: connect_timeout 5 s, so a database that is unreachable (not
 * refusing) costs a worker's loop seconds rather than the operating system's TCP timeout,
 * and application_name "wal-worker <role>", so pg_stat_activity says who is connected.
 */
#ifndef WAL_DB_CONNECT_H
#define WAL_DB_CONNECT_H

#include <stdbool.h>

#include <libpq-fe.h>

/*
 * The libpq "options" of a worker's session, malloc'd (NULL when out of memory): the
 * conninfo's own (or PGOPTIONS'), then search_path pinned to pg_catalog, pg_temp. A
 * client's option outranks the database's and the role's settings, and a database's
 * owner, who need not be a superuser, may ALTER DATABASE ... SET search_path to a schema
 * of its own: the workers' statements name pg_catalog's functions unqualified
 * (set_config, json_build_object, ...), which would then run its lookalikes with the
 * rights of the worker, or of the person signed in to the console.
 */
char *db_pinned_options(const char *conninfo);

/* Like PQconnectdb: never NULL; check PQstatus. */
PGconn *db_connect(const char *conninfo, const char *role);

/*
 * The same connection opened without waiting, for a loop that must not stop: NULL when
 * libpq cannot even allocate one. Drive it with db_connect_advance (first with
 * PGRES_POLLING_WRITING, then with what it last returned) until PGRES_POLLING_OK or
 * PGRES_POLLING_FAILED; connect_timeout does not apply, the caller keeps its own deadline.
 */
PGconn *db_connect_start(const char *conninfo, const char *role);

/* One non-blocking step of the connection's handshake: it returns `last` until its socket is ready.
 */
PostgresPollingStatusType db_connect_advance(PGconn *conn, PostgresPollingStatusType last);

/*
 * Keeps *conn connected for a worker that cannot go on without it. True when it is
 * connected; *fresh (may be NULL) says it was connected just now ("event=db_connected").
 * False, *conn NULL, when the database cannot be reached: logged as db_unreachable with
 * `waiting`, what stops until it is back.
 */
bool db_ensure(PGconn **conn, const char *conninfo, const char *role, const char *waiting,
			   bool *fresh);

/*
 * Like PQexecParams, but waits at most timeout_ms for the answer, for a worker's loop that
 * must not stop for a database that hangs (a cut link that drops packets answers nothing,
 * ever). NULL when the statement could not be sent or no answer came in time; then
 * *timed_out says which, and the connection is unusable (an answer may still arrive on
 * it): close it. A lock the statement waits for is the server's statement_timeout's to
 * end, so that a closed connection leaves no backend waiting on it.
 */
PGresult *db_exec_within(PGconn *conn, const char *sql, int n, const char *const *values,
						 long timeout_ms, bool *timed_out);

#endif
