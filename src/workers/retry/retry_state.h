/*
 * retry_state.h: what `wal-worker retry` keeps in memory, shared by its files: retry.c
 * (the role: scheduling, pausing, Kafka, the loop), retry_delivery.c (an attempt and its
 * outcome), retry_lanes.c (the messages held per partition, and per-destination state)
 * and retry_report.c (counters for wal_delivery.destination_status).
 */
#ifndef WAL_RETRY_STATE_H
#define WAL_RETRY_STATE_H

#include <stdbool.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "common/admin_server.h"
#include "common/config_watch.h"
#include "common/delivery_trace.h"
#include "common/handoff.h"
#include "common/http_delivery.h"
#include "common/metrics.h"
#include "common/offset_tracker.h"
#include "retry/partition_backlog.h"
#include "common/delivery_stats.h"
#include "common/pause_state.h"
#include "retry/retry_message.h"

struct lane;

/* One consumed message, from its lane to its outcome. */
typedef struct queued
{
	retry_message m;
	tracked_record *record;
	struct lane *lane;
	int64_t offset;           /* in its retry topic */
	bool probe;               /* the half-open probe */
	bool pause_after_handoff; /* its failure tripped the pause */
	char error[256];          /* its last failure */
	/* The span of its current attempt (delivery_request): on_http_done has its answer. */
	delivery_trace attempt_trace;
	struct queued *next;
} queued;

typedef struct lane
{
	char *topic;
	int32_t partition;
	int step;
	bool assigned;
	bool fetch_paused;
	queued *head, *tail;
	int n;
	int64_t backlog;
} lane;

typedef struct step_stats
{
	int consecutive_failures;
	int in_flight;
	long delivered; /* since the last report */
	long failed;
	char last_error[256];
	int64_t last_error_at; /* wall ms, 0: none since the last report */
	int64_t last_success_at;
} step_stats;

typedef struct dest_state
{
	char *name;
	step_stats steps[RETRY_STEPS];
	int in_flight;
	int window; /* attempts allowed in flight; ramps up after a pause */
	int64_t next_ramp_ms;
	int64_t next_probe_try_ms;
	bool paused;  /* as last seen in the shared state */
	bool pausing; /* tripped here; the shared pause follows the hand-off's ack */
	bool probing;
} dest_state;

typedef struct retry_state
{
	const worker_options *opts;
	config_watch *watch;
	pause_state *pauses;
	delivery_stats *stats; /* per-topic counts for the console */
	rd_kafka_t *consumer;
	http_engine *http;
	handoff_producer *handoff;
	offset_tracker *tracker;
	partition_backlog *backlogs;
	lane **lanes;
	int n_lanes;
	dest_state **dests;
	int n_dests;
	admin_server *admin;
	bool assigned;
	int64_t next_commit_ms;
	int64_t next_report_ms;
	int64_t shutdown_deadline; /* 0 until a stop is requested */
	metric *delivered;
	metric *failed;
	metric *handed_off;
	metric *bad_messages;
	metric *probes;
	metric *paused_gauge;
	metric *window_gauge;
	metric *backlog_gauge;
} retry_state;

/* A duration of the retry policy as this worker runs it (--time-scale). */
static inline long
scaled(const retry_state *st, long ms)
{
	return (long) (ms / st->opts->time_scale);
}

lane *lane_find(retry_state *st, const char *topic, int32_t partition);
lane *lane_get(retry_state *st, const char *topic, int32_t partition);
void lane_push_tail(lane *l, queued *q);
void lane_push_head(lane *l, queued *q);
queued *lane_take(lane *l, queued *prev, queued *q);
queued *lane_pop(lane *l);
queued *first_due(lane *l, int64_t now, queued **prev_out);
void drop_lane_messages(retry_state *st, lane *l);
void queued_free(queued *q);

dest_state *dest_get(retry_state *st, const char *name);
/* At shutdown: every lane with the messages it still holds, and every dest_state. */
void free_lanes_and_dests(retry_state *st);
const destination_config *partition_owner(const control_plane_config *config, int32_t partition);

/* Starts an attempt of q (taken from its lane) at d; its answer decides where q goes. */
void deliver_queued(retry_state *st, dest_state *ds, const destination_config *d, queued *q);
/* Messages that cannot be retried go to the DLQ with their reason, whatever the pause. */
void send_bad_to_dlq(retry_state *st, queued *q);
/* The hand-off producer's callback: q's write to the next step or the DLQ was acknowledged. */
void on_queued_handed_off(void *opaque, void *arg);

/* Per destination and step this process owns: counters into destination_step_stats. */
void report_stats(retry_state *st);

#endif
