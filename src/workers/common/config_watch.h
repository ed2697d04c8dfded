/*
 * config_watch.h: keeps a worker's configuration current.
 *
 * At start it loads the configuration from the database, or, when the database is
 * unreachable, the newest one the --peer workers hold (peer_config.h); it retries until
 * one answers (logging each failure) and never returns an empty configuration. Then it
 * follows the published version: a NOTIFY on wal_delivery_published triggers a reload at
 * once, and a poll every 30 s (divided by --time-scale) catches a missed notification. A
 * version the reconciler has not published yet (Kafka does not match it) is not adopted.
 * While the database is down the cached configuration stays in use, the connection is
 * retried, and every 5 s one peer is asked: a higher published version replaces the
 * cached one, a lower one never does.
 *
 * After the start all of that runs on a thread of its own: a database that hangs, a lock
 * a DBA holds on the control plane's tables or a peer that does not answer holds up the
 * next configuration, never the worker's loop.
 */
#ifndef WAL_CONFIG_WATCH_H
#define WAL_CONFIG_WATCH_H

#include <signal.h>
#include <stdbool.h>

#include "control_plane.h"
#include "options.h"

typedef struct config_watch config_watch;

/* NULL only when *stop became set before any configuration was loaded. */
config_watch *config_watch_start(const worker_options *opts, volatile sig_atomic_t *stop);

const control_plane_config *config_watch_current(const config_watch *watch);

/*
 * Non-blocking (it takes what the watcher thread handed over). True when a newer
 * configuration replaced the current one; only the worker's own thread calls it.
 */
bool config_watch_poll(config_watch *watch);

/* The cached document for peers, signing secrets redacted (malloc'd). */
char *config_watch_json_for_peers(config_watch *watch);

void config_watch_stop(config_watch *watch);

#endif
