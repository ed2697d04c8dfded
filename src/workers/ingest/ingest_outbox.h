/*
 * ingest_outbox.h: the ingest service's durable fallback, the outbox.
 *
 * Records handed here are written with wal_delivery.ingest_enqueue_batch (one call per
 * topic and content type, many records a call) by a few writer threads, each with its
 * own connection, and settled 202 once committed; the relay ships them later. A record
 * the database refuses is settled with the status its SQLSTATE means (404, 413, 400);
 * while the database cannot be reached records are settled 503 at once.
 */
#ifndef WAL_INGEST_OUTBOX_H
#define WAL_INGEST_OUTBOX_H

#include <stdbool.h>

#include "common/options.h"
#include "ingest/ingest_record.h"

void ingest_outbox_start(const worker_options *opts, int writers);

/* r->route must be ROUTE_OUTBOX; reason (static) is NULL for topics that need processing. */
void ingest_outbox_submit(ingest_record *r, const char *reason);

/* True while the last attempt to reach the database worked. */
bool ingest_outbox_up(void);

/* Writes what is queued (for at most a few seconds), then stops the writers. */
void ingest_outbox_stop(void);

#endif
