/*
 * delivery_stats.h: deliveries counted per minute, topic and destination, added to
 * wal_delivery.delivery_stats (the console's rates and charts) by a thread of its own.
 *
 * `consume` and `retry` count each outcome here: an attempt delivered (2xx), an attempt
 * that failed, a copy handed to the DLQ. Counting takes a mutex and a hash lookup; the
 * flush runs on its own thread and connection every DELIVERY_STATS_FLUSH_MS, one call of
 * wal_delivery.add_delivery_stats (one upsert per key), so delivery never waits on
 * Postgres and never fails because of it. When the call fails the counts stay and go
 * with the next flush, up to DELIVERY_STATS_MAX_KEYS keys; counts past that are dropped,
 * counted in wal_delivery_stats_dropped_total and logged (event=delivery_stats_dropped).
 */
#ifndef WAL_DELIVERY_STATS_H
#define WAL_DELIVERY_STATS_H

#include <stdbool.h>

#ifndef DELIVERY_STATS_FLUSH_MS /* a test driver may shorten it */
#define DELIVERY_STATS_FLUSH_MS 10000
#endif
#define DELIVERY_STATS_MAX_KEYS 4096

typedef enum
{
	STAT_DELIVERED,     /* an attempt answered 2xx */
	STAT_FAILED,        /* an attempt that failed (the copy goes to a retry step or the DLQ) */
	STAT_DEAD_LETTERED, /* a copy handed to the DLQ */
	STAT_KINDS
} delivery_stat_kind;

typedef struct delivery_stats delivery_stats;

/* Starts the flush thread; conninfo and role as the worker's options have them. */
delivery_stats *delivery_stats_start(const char *conninfo, const char *role);

/* Counts one outcome in the current minute (thread-safe; NULL names count nothing). */
void delivery_stats_count(delivery_stats *ds, const char *topic, const char *destination,
						  delivery_stat_kind kind);

/* Flushes once more (unless the last flush failed) and stops the thread. NULL is fine. */
void delivery_stats_stop(delivery_stats *ds);

#endif
