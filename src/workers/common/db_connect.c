/*
 * db_connect.c: see db_connect.h.
 */
#include "db_connect.h"

#include <stdio.h>

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
