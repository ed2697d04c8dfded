/*
 * pause_state.h: the shared pause state of destinations, as every worker process sees it.
 *
 * The state lives in wal_delivery.destination_pauses so that all retry and main-consumer
 * processes agree on it. A process keeps a copy, refreshed at once on a NOTIFY on
 * wal_delivery_pause and every 5 s (divided by --time-scale) as a fallback. While the
 * database is unreachable the last copy stays in use and the connection is retried.
 *
 * A pause this process decided on is in effect locally at once and written to the
 * database (again and again until that works), so no further attempt starts meanwhile.
 * It is also announced on the pause topic (pause_channel.h), and a pause heard there is
 * in effect at once, so a pause spreads while the database is unreachable. A heard pause
 * ends when the database has it (then the database decides the resume), when the
 * database shows a resume after it, or when the database, reachable again, has not shown
 * it within ANNOUNCED_PAUSE_CONFIRM_MS (its announcer died before writing it). The
 * retry processes repeat the pauses in force every 20 s (divided by --time-scale), so
 * a worker that starts while the database is unreachable learns of them too.
 */
#ifndef WAL_PAUSE_STATE_H
#define WAL_PAUSE_STATE_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "control_plane.h"
#include "options.h"

typedef struct pause_state pause_state;

typedef enum
{
	PROBE_SUCCESS,
	PROBE_TRANSIENT,
	PROBE_PERMANENT
} probe_outcome;

/*
 * holder names this process in probe leases (e.g. "retry:<host>:<pid>"). config names
 * the pause topic and the brokers; without the pause topic (librdkafka refused the
 * listener: logged) pauses come from the database alone. A process that announces
 * (the retry role, which decides pauses) repeats every pause in force on the topic.
 */
pause_state *pause_state_new(const worker_options *opts, const control_plane_config *config,
							 const char *holder, bool announces);
void pause_state_free(pause_state *ps);

/* Non-blocking unless a refresh is due. True when some destination paused or resumed. */
bool pause_state_poll(pause_state *ps);

bool pause_state_is_paused(const pause_state *ps, const char *destination);

/* While paused: when a probe may run (wall-clock ms), 0 when unknown. */
int64_t pause_state_next_probe_ms(const pause_state *ps, const char *destination);

/* Pauses it on all steps, here at once and in the database as soon as it answers. */
void pause_state_pause(pause_state *ps, const char *destination, int step, const char *error,
					   long probe_after_ms);

/* The probe lease: true for exactly one process per probe interval. */
bool pause_state_claim_probe(pause_state *ps, const char *destination, long lease_ms);

/* Records the probe's answer; success and permanent resume the destination everywhere. */
void pause_state_finish_probe(pause_state *ps, const char *destination, probe_outcome outcome,
							  const char *error, long probe_after_ms);

/* Sends counters to wal_delivery.report_step_stats; false when the database failed. */
bool pause_state_report_stats(pause_state *ps, json_t *stats);

#endif
