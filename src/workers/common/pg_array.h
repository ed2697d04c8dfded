/*
 * pg_array.h: Postgres array literals ({1,2}, {"a",NULL}) built element by element, so
 * that a whole batch goes to the database as one text parameter per column (cast to
 * int8[], text[], bytea[] or jsonb[] in the SQL). Used by the ingest outbox writers and
 * the processor's batches.
 *
 * Elements are written as the array parser reads them: text in double quotes with " and \
 * escaped, bytea in hex inside the quotes, NULL unquoted.
 */
#ifndef WAL_PG_ARRAY_H
#define WAL_PG_ARRAY_H

#include <stddef.h>
#include <stdint.h>

#include "text_buffer.h"

typedef struct pg_array
{
	text_buffer text; /* the literal so far */
	int n;            /* elements added: every one after the first is preceded by a comma */
} pg_array;

/* Starts an empty literal ("{"). */
void pg_array_begin(pg_array *a);

void pg_array_add_int64(pg_array *a, int64_t value);

/* s quoted, or NULL when s is NULL. */
void pg_array_add_text(pg_array *a, const char *s);

/* len bytes in hex ("\\x..." in quotes, \x... once parsed), or NULL when bytes is NULL. */
void pg_array_add_bytea(pg_array *a, const char *bytes, size_t len);

/* Closes the literal ("}"); returns it, malloc'd: the caller frees it. */
char *pg_array_finish(pg_array *a);

#endif
