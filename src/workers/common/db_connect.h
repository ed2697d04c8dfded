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

#include <libpq-fe.h>

/* Like PQconnectdb: never NULL; check PQstatus. */
PGconn *db_connect(const char *conninfo, const char *role);

#endif
