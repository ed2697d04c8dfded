/*
 * enqueue_cache.h: what enqueue reads of the control plane (a topic's limits, the current
 * log generation), kept per backend until a change to wal_delivery.topics or
 * wal_delivery.outbox_generations invalidates it, as Postgres keeps its catalogs.
 *
 * What it means for a change: each enqueue sees the state of those tables committed when
 * it began, and its own transaction's changes, as a catalog lookup would; not the state
 * in its transaction's snapshot, which for a repeatable-read transaction can be older.
 * See enqueue_cache.c for why.
 */
#ifndef ENQUEUE_CACHE_H
#define ENQUEUE_CACHE_H

#include "postgres.h"

#include "enqueue_lookup.h"

/* enqueue_find_topic, from the cache. */
bool enqueue_cached_topic(text *name, EnqueueTopic *topic);

/* enqueue_current_generation, from the cache. */
int enqueue_cached_generation(void);

#endif
