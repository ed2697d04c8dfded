/*
 * settings.h: every setting (GUC) of the extension; settings.c defines them.
 *
 * The relay, the reconciler and the enqueue path read these variables; only
 * define_settings writes them (through the GUC machinery), once, from _PG_init.
 */
#ifndef SETTINGS_H
#define SETTINGS_H

#include "postgres.h"

/* The most relay workers wal_delivery.relay_workers allows. */
#define MAX_RELAY_WORKERS 16

/* Where the background workers connect, and how many relays there are. */
extern char *wal_delivery_database;
extern int wal_delivery_relay_workers;

/* How the relay and the reconciler reach Kafka. */
extern char *kafka_bootstrap_servers;
extern char *kafka_properties;

/* The relay's passes. */
extern int relay_batch_size;
extern int relay_idle_interval_ms;
extern int relay_linger_ms; /* relay.c: coalescing of commit wake-ups */
extern int relay_delivery_timeout_ms;
extern int relay_max_backoff_ms;
extern int relay_shutdown_flush_ms;
/* Where the relay exports its spans (OTLP/HTTP); empty: nowhere. */
extern char *otlp_endpoint;

/* Relay 0's periodic tasks (maintenance.c) and the reconciler's rounds. */
extern int maintenance_interval_ms;
extern int reconcile_interval_ms;

/* Lets a DELETE of a topic or destination drop its undelivered records. */
extern bool wal_delivery_force_delete;

/*
 * The session's trace context (wal_delivery.traceparent, .tracestate), checked when set;
 * "" when unset. Records enqueued without a traceparent header take them.
 */
extern char *wal_delivery_traceparent;
extern char *wal_delivery_tracestate;

void define_settings(void);

#endif
