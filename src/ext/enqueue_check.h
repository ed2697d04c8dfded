/*
 * enqueue_check.h: whether a record surely meets the rules of wal_delivery.check_record.
 *
 * The rules and their errors stay in SQL (check_record, README.md "Errors from enqueue").
 * C only answers "valid for sure"; on "no" the caller takes the SQL path, which raises the
 * rule's error (or accepts the record, if this check was stricter than the rule).
 */
#ifndef ENQUEUE_CHECK_H
#define ENQUEUE_CHECK_H

#include "postgres.h"

#include "utils/jsonb.h"

typedef struct EnqueueRecord
{
	bytea *payload;        /* NULL when the caller passed NULL */
	text *idempotency_key; /* the key it will have: the caller's, or a generated one */
	bool caller_key;       /* the caller gave the key */
	text *message_key;     /* NULL: none */
	Jsonb *headers;        /* NULL: none */
} EnqueueRecord;

bool enqueue_record_surely_valid(const EnqueueRecord *record, int32 max_payload_bytes);

#endif
