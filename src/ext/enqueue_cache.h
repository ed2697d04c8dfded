/*
 * enqueue_cache.h: what enqueue reads of the control plane (a topic's limits, the current
 * log generation), kept per backend until a change to wal_delivery.topics or
 * wal_delivery.outbox_generations invalidates it, as Postgres keeps its catalogs.
 *
 * What it means for a change: an enqueue sees the latest committed state of those tables
 * as of the start of its transaction (and its own transaction's changes), as it sees
 * catalogs; a change that commits while a transaction runs may be seen only by the next
 * one. See enqueue_cache.c for why.
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
