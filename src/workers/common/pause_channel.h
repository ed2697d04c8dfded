/*
 * pause_channel.h: pauses announced over Kafka, on the pause topic
 * (<retry_topic_prefix>pauses, one partition, created by the reconciler).
 *
 * The shared pause state lives in Postgres (pause_state.h). A pause decided while
 * Postgres is unreachable, or just before it went down (its NOTIFY lost), would reach
 * the other workers only once they can read the database again; meanwhile the main
 * consumers kept sending first attempts to the destination the pause exists to spare.
 * So the retry worker that decides a pause also announces it here, and every consume and
 * retry process listens: Kafka is up whenever records flow at all.
 *
 * An announcement only ever pauses; the database stays the authority on resuming (see
 * pause_state.c for how the two are reconciled).
 */
#ifndef WAL_PAUSE_CHANNEL_H
#define WAL_PAUSE_CHANNEL_H

#include <stdbool.h>
#include <stdint.h>

#include "control_plane.h"
#include "options.h"

typedef struct pause_channel pause_channel;

/* Called for each pause heard: the destination, who announced it, when it began (wall ms). */
typedef void (*pause_heard_fn)(void *arg, const char *destination, const char *by,
							   int64_t since_ms);

/* Listens from now (announcements of the last minute included); NULL with errbuf filled. */
pause_channel *pause_channel_new(const worker_options *opts, const control_plane_config *config,
								 const char *holder, char *errbuf, size_t errbuf_size);
void pause_channel_free(pause_channel *ch);

/*
 * Announces a pause that began at since_ms (wall clock), asynchronously; logged when
 * Kafka refuses it. An announcement is repeated while the pause lasts (pause_state.c),
 * so a worker that starts while Postgres is down learns of pauses from before.
 */
void pause_channel_announce(pause_channel *ch, const char *destination, int step,
							long probe_after_ms, int64_t since_ms, bool repeated);

/* Non-blocking: hands every announcement that arrived to heard. */
void pause_channel_poll(pause_channel *ch, pause_heard_fn heard, void *arg);

#endif
