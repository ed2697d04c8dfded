/*
 * processing_rows.h: the processor worker's side of the outbox, through the extension's
 * functions (sql/src/processing.sql): claim rows of one kind with a lease, run SQL
 * processors in the database one row per statement, and hand back the results of HTTP
 * processors.
 *
 * Words used here:
 *   claimed row  an outbox row this worker holds: its lease token fences every write,
 *                and the write is refused once lease_ms_left has passed
 *   outcome      what became of a claimed row after its attempt (see row_outcome)
 */
#ifndef WAL_PROCESSING_ROWS_H
#define WAL_PROCESSING_ROWS_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "common/log.h"
#include "shared/trace_context.h"

typedef enum
{
	PROCESSOR_SQL,
	PROCESSOR_HTTP
} processor_kind;

typedef struct claimed_row
{
	int64_t id;
	int64_t lease_token;
	int attempts; /* this claim included */
	long lease_ms_left;
	long lease_ms;          /* the topic's processing_lease */
	long timeout_ms;        /* the topic's processing_timeout */
	long max_payload_bytes; /* the topic's limit, also on an HTTP processor's answer */
	processor_kind kind;
	char *topic;
	char *idempotency_key;
	char *content_type;
	char *processor; /* function name or URL */
	char *payload;
	size_t payload_len;
	bool has_trace; /* the record's traceparent header is valid: trace holds it */
	trace_context trace;
} claimed_row;

/* A log line about a claimed row's record: its topic, key and trace id (log_record). */
#define log_row(level, row, ...)                                                                   \
	log_record(level, (row)->topic, (row)->idempotency_key,                                        \
			   (row)->has_trace ? (row)->trace.trace_id : NULL, __VA_ARGS__)

typedef enum
{
	OUTCOME_PROCESSED, /* stored; the relay ships it */
	OUTCOME_FAILED,    /* attempt counted, back to pending after a backoff */
	OUTCOME_DEAD,      /* last attempt failed: in dead_letters */
	OUTCOME_REFUSED,   /* lease lost or run out: nothing written */
	OUTCOME_RELEASED,  /* given back unstarted, without spending an attempt */
	OUTCOME_UNKNOWN    /* the database call failed: the lease expiry will return it */
} row_outcome;

/* What one attempt produced: a processed payload, or the error that failed it. */
typedef struct attempt_result
{
	const claimed_row *row;
	char *payload; /* NULL when error is set */
	size_t payload_len;
	char *error;
	row_outcome outcome; /* filled in by finish_attempts / run_sql_batch */
	char *detail;        /* why, unless processed */
	bool timed_out;      /* a SQL processor cancelled by its statement timeout */
} attempt_result;

/*
 * Claims up to max_rows rows of topics with a `kind` processor, with a lease each. Returns
 * the number claimed (0..max_rows) and sets *rows (free with free_claimed_rows), or -1 on a
 * database error (logged).
 */
int claim_rows_to_process(PGconn *db, int max_rows, processor_kind kind, claimed_row **rows);
void free_claimed_rows(claimed_row *rows, int n);

/* Returns rows whose lease ran out to the pool; the number returned, or -1 (logged). */
int expire_processing_leases(PGconn *db);

/*
 * Runs the SQL processors of results[i].row in one transaction that holds every row from
 * the start, one statement per row with a statement timeout of that row's lease plus a
 * second, so a processor that hangs is cancelled alone (a failed attempt of its own row)
 * and each row's lease starts when its processor does. Rows not started when *stop is set
 * are released. Fills in each outcome once the transaction committed. False when the
 * database failed (logged): nothing of the batch is written, and its rows, but the one
 * whose statement failed, are released.
 */
bool run_sql_batch(PGconn *db, attempt_result *results, int n, const volatile sig_atomic_t *stop);

/* Hands HTTP processors' results to the database in one call; fills in their outcomes. */
bool finish_attempts(PGconn *db, attempt_result *const *results, int n);

void free_attempt_results(attempt_result *results, int n);
const char *row_outcome_name(row_outcome outcome);

#endif
