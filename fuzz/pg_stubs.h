/*
 * pg_stubs.h: the few backend functions the extension's S3 answer handling calls
 * (palloc and friends, StringInfo, ereport), stood in for outside a Postgres backend so
 * that fuzz/s3_answer.c can run that code as it is.
 *
 * palloc'd memory lives until pg_stub_reset(), as in a memory context that is reset after
 * each input. An ERROR is caught as a backend would catch it: pg_stub_catch points at a
 * sigjmp_buf that errfinish() jumps to, after filling pg_stub_error; an ERROR with no
 * catcher aborts.
 */
#ifndef WAL_FUZZ_PG_STUBS_H
#define WAL_FUZZ_PG_STUBS_H

#include <setjmp.h>

typedef struct pg_stub_error_data
{
	int elevel;
	int sqlerrcode;
	char message[4096];
	char detail[4096];
	char hint[4096];
} pg_stub_error_data;

extern pg_stub_error_data pg_stub_error;
extern sigjmp_buf *pg_stub_catch;

/* Frees everything palloc'd since the last reset. */
void pg_stub_reset(void);
/* How many palloc'd chunks are live. */
long pg_stub_live_chunks(void);

#endif
