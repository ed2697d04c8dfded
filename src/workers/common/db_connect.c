/*
 * db_connect.c: see db_connect.h.
 */
#include "db_connect.h"

#include <stdio.h>
#include <string.h>

#include "log.h"

PGconn *
db_connect(const char *conninfo, const char *role)
{
	char application_name[64];
	/* Defaults first: settings in the expanded conninfo that follows override them. */
	const char *keys[] = {"connect_timeout", "fallback_application_name", "dbname", NULL};
	const char *values[] = {"5", application_name, conninfo ? conninfo : "", NULL};

	snprintf(application_name, sizeof(application_name), "wal-worker %s", role);
	return PQconnectdbParams(keys, values, 1);
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
