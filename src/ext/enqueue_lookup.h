/*
 * enqueue_lookup.h: what enqueue reads before it writes (the topic, the current log
 * generation, a caller's key already enqueued), as direct index and heap reads under the
 * active snapshot.
 *
 * Why not SQL: each read would be an executor run of its own, about as costly as the
 * insert that follows, and a kept plan could turn into a sequential scan once planned
 * on a small table (nothing analyzes the log, whose autovacuum is off).
 */
#ifndef ENQUEUE_LOOKUP_H
#define ENQUEUE_LOOKUP_H

#include "postgres.h"

typedef struct EnqueueTopic
{
	int32 max_payload_bytes;
	bool has_processor;
	bool has_writers; /* a writers list: the SQL path checks the caller against it */
} EnqueueTopic;

/* The topic's row; false when there is none. */
bool enqueue_find_topic(text *name, EnqueueTopic *topic);

/* The generation new log records go to (sealed_at NULL); -1 unless exactly one is. */
int enqueue_current_generation(void);

/*
 * Finding records by a caller's key, as existing_record_id() does: the row table, then
 * the log's generations (records with a caller's key only). A lookup keeps its relations
 * and index scans open across keys (a batch looks up each of its keys), under the
 * snapshot active when it began; end it before that snapshot is popped.
 */
typedef struct KeyLookup KeyLookup;

/*
 * skip_gen: a generation not to look in (-1: none), the one the record goes to, where the
 * insert's own ON CONFLICT check finds the key (log_writer.c).
 */
KeyLookup *enqueue_key_lookup_begin(int skip_gen);
/* The id of the record of topic with idempotency key key; false when there is none. */
bool enqueue_key_lookup(KeyLookup *lookup, text *topic, text *key, int64 *id);
void enqueue_key_lookup_end(KeyLookup *lookup);

/* The oid of a relation of schema wal_delivery (an error if it does not exist). */
Oid enqueue_relation_oid(const char *name);

#endif
