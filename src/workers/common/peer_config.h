/*
 * peer_config.h: asking the --peer workers for their cached configuration while the
 * database is unreachable, and which answer wins.
 *
 * The rule: a worker never settles for an older version when a newer one is reachable,
 * and never moves back to a lower one. At start it asks every --peer PEER_ASKS_AT_START
 * times (a load balancer hands each ask to its next instance) and takes the highest
 * version that answered. Then, while the database stays unreachable, it asks one peer
 * at a time (the next in turn) and moves up when a peer holds a higher published
 * version; an older or equal one is ignored. The database, once back, is the authority
 * again (config_watch.c).
 *
 * Each ask is counted in wal_peer_config_total{peer, outcome}: outcome is "loaded" (the
 * version adopted), "same" (the version we hold or chose), "older" (ignored: below it),
 * "unpublished" (newer, but Kafka may not match it yet), "refused" (HTTP 401/403: the
 * peer token is missing or wrong) or "failed" (anything else).
 */
#ifndef WAL_PEER_CONFIG_H
#define WAL_PEER_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "control_plane.h"
#include "options.h"

#define PEER_ASKS_AT_START 3

typedef struct peer_asker peer_asker;

peer_asker *peer_asker_new(const worker_options *opts);
void peer_asker_free(peer_asker *asker);

/*
 * The highest version any peer holds, NULL when none answered; why_db is the database's
 * error, quoted in the log line that says a peer's config is in use.
 */
control_plane_config *peer_config_at_start(peer_asker *asker, const char *why_db);

/* Asks the next peer once: its config when its published version is above current_version. */
control_plane_config *peer_config_newer(peer_asker *asker, int64_t current_version);

#endif
