/*
 * enqueue_insert.h: enqueue's writes into the log, and the SQL path it hands everything
 * else to, as SPI plans prepared once per backend and kept.
 */
#ifndef ENQUEUE_INSERT_H
#define ENQUEUE_INSERT_H

#include "postgres.h"

#include "utils/array.h"
#include "utils/jsonb.h"

/* One log record's columns, less those the log's defaults fill (xid, created_at). */
typedef struct LogRecord
{
	int64 id;
	bool caller_key;
	text *topic;
	text *idempotency_key;
	text *message_key; /* NULL: none */
	text *content_type;
	Jsonb *headers; /* NULL: none */
	bytea *payload;
} LogRecord;

/*
 * Inserts record into generation gen; false when a record with the same caller's key
 * got there first (ON CONFLICT DO NOTHING: a concurrent or earlier enqueue of the key).
 */
bool enqueue_insert_log_record(int gen, const LogRecord *record);

/*
 * Inserts n records of one topic into generation gen, skipping those whose id is NULL
 * (ids_nulls[i]), in input order; each caller's key that got there first skips its
 * record. inserted[i] says whether record i went in.
 */
void enqueue_insert_log_batch(int gen, int n, const int64 *ids, const bool *ids_nulls,
							  const bool *caller_keys, text *topic, Datum *idempotency_keys,
							  Datum *message_keys, const bool *message_key_nulls,
							  text *content_type, Datum *headers, const bool *headers_nulls,
							  Datum *payloads, bool *inserted);

/* wal_delivery.repeated_key_id(): the id, or the 40001 error it raises. */
int64 enqueue_repeated_key_id(text *topic, text *key);

/*
 * The SQL path: what wal_enqueue did before C (wal_delivery.enqueue_payload), for every
 * record the C path does not take (a topic with a processor, a record that breaks a
 * rule: the SQL raises the rule's own error).
 */
Datum enqueue_sql_one(text *topic, bytea *payload, text *content_type, text *idempotency_key,
					  text *message_key, Jsonb *headers, bool *isnull);

/* The payload type of a door overload: how its payloads become bytea, and its content type. */
typedef enum PayloadKind
{
	PAYLOAD_JSONB,
	PAYLOAD_TEXT,
	PAYLOAD_BYTEA
} PayloadKind;

/* The SQL path of wal_enqueue_batch: enqueue_payload_batch on the payloads as given. */
Datum enqueue_sql_batch(PayloadKind kind, Datum *args, const bool *nulls, bool *isnull);

#endif
