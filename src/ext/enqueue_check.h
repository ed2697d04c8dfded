/*
 * enqueue_check.h: the SQL door's use of the record contract (src/shared/record_contract.h).
 *
 * The rules live in the contract alone. This file turns what wal_enqueue* hold (bytea,
 * text, jsonb) into the contract's byte strings, answers the fast path's "is it valid",
 * and raises the contract's error, with its SQLSTATE, for wal_delivery.check_record.
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

/* True when the record meets every rule; on false, check_record raises the rule's error. */
bool enqueue_record_surely_valid(const EnqueueRecord *record, int32 max_payload_bytes);

#endif
