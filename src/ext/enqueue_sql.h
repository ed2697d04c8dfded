/*
 * enqueue_sql.h: the SQL that enqueue calls, as SPI plans prepared once per backend and
 * kept: the SQL path it hands every record it does not take to, and the look-up of a key
 * a concurrent enqueue wrote. door is the calling door function (fcinfo->flinfo->fn_oid):
 * each statement runs as its owner, with search_path pinned (see enqueue_sql.c).
 */
#ifndef ENQUEUE_SQL_H
#define ENQUEUE_SQL_H

#include "postgres.h"

#include "utils/array.h"
#include "utils/jsonb.h"

/*
 * wal_delivery.repeated_key_id(): the id of the record the key names, or the error it
 * raises (40001 when it is not visible, 23W01 when it is a different record).
 */
int64 enqueue_repeated_key_id(Oid door, text *topic, text *key, bytea *payload, text *content_type,
							  text *message_key, Jsonb *headers);

/*
 * The SQL path: what wal_enqueue did before C (wal_delivery.enqueue_payload), for every
 * record the C path does not take (a topic with a processor, a record that breaks a
 * rule: the SQL raises the rule's own error).
 */
Datum enqueue_sql_one(Oid door, text *topic, bytea *payload, text *content_type,
					  text *idempotency_key, text *message_key, Jsonb *headers, bool *isnull);

/* The payload type of a door overload: how its payloads become bytea, and its content type. */
typedef enum PayloadKind
{
	PAYLOAD_JSONB,
	PAYLOAD_TEXT,
	PAYLOAD_BYTEA
} PayloadKind;

/* The SQL path of wal_enqueue_batch: enqueue_payload_batch on the payloads as given. */
Datum enqueue_sql_batch(Oid door, PayloadKind kind, Datum *args, const bool *nulls, bool *isnull);

#endif
