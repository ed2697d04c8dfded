/*
 * retry.c: `wal-worker retry`, delivering the messages of the three retry steps when due.
 *
 * Each destination owns one partition on every step topic (its retry_partition); one
 * "lane" here is one assigned partition of one step. A lane keeps the messages fetched
 * from it in order and delivers each when due (see retry_message.h); their jitter makes
 * them due slightly out of order, so any due message in the lane may go. The lane's Kafka
 * partition is paused (the consumer keeps polling) while its newest message is not due
 * yet even without jitter, since nothing entered after it can be due earlier, or while
 * its buffer is full. Delivery goes straight to the destination: success is done,
 * a transient failure moves the message to the next step (step 3: the DLQ), a permanent
 * one to the DLQ. Offsets commit only up to messages whose outcome is durable.
 *
 * Pausing: per destination and step, a counter of consecutive transient failures. When
 * it reaches pause_after_failures, that message is handed on first, and once Kafka
 * acknowledged it the destination is paused in the shared pause state (pause_state.h):
 * every process stops ordinary attempts to it on all steps, and the main consumers' breaker
 * opens. An attempt is only started while the counter plus the attempts in flight stays
 * below the threshold, so exactly that many failures open the pause. After the probe
 * interval one process wins the probe lease and tries one due message: success or a
 * permanent answer resumes everything, a transient one keeps the message queued and the
 * pause on. After a resume the destination's concurrency starts at 1 and doubles every
 * RAMP_INTERVAL_MS (divided by the time scale) up to its max_in_flight.
 */
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <librdkafka/rdkafka.h>

#include "common/admin_server.h"
#include "common/clock.h"
#include "common/config_watch.h"
#include "common/handoff.h"
#include "common/http_delivery.h"
#include "common/kafka_conf.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/role_lifecycle.h"
#include "common/role_setup.h"
#include "common/sd_notify.h"
#include "common/stop_signal.h"
#include "common/offset_tracker.h"
#include "retry/partition_backlog.h"
#include "common/pause_state.h"
#include "retry/retry_message.h"
#include "retry/retry_state.h"
#include "roles.h"

#define LANE_BUFFER          500 /* messages kept per partition before its fetch pauses */
#define COMMIT_INTERVAL_MS   1000
#define REPORT_INTERVAL_MS   1000
#define RAMP_INTERVAL_MS     5000 /* before the time scale */
#define PROBE_LEASE_SLACK_MS 10000
/*
 * A paused partition's fetch resumes this long (real time, not scaled) before its newest
 * message can be due: a resumed partition joins the broker's next fetch request only after
 * the outstanding long poll returns (fetch.wait.max.ms, 500 ms by default), so messages
 * that arrived behind it during the pause would otherwise reach the lane up to that late.
 */
#define FETCH_RESUME_LEAD_MS 600

/* ---------------------------------------------------------------- scheduling */

static void
on_message(retry_state *st, const rd_kafka_message_t *rkm)
{
	const char *topic = rd_kafka_topic_name(rkm->rkt);
	lane *l = lane_get(st, topic, rkm->partition);
	queued *q = calloc(1, sizeof(*q));

	q->lane = l;
	q->offset = rkm->offset;
	q->record = tracker_open(st->tracker, topic, rkm->partition, rkm->offset, 1);
	retry_message_read(&q->m, rkm, l->step, config_watch_current(st->watch), st->opts->time_scale,
					   wall_ms());
	q->m.msg.owner = st;
	if (q->m.bad)
	{
		send_bad_to_dlq(st, q);
		return;
	}
	if (q->m.clock_jump)
		log_message(LOG_WARN, &q->m.msg,
					"event=clock_jump from=%s partition=%d offset=%" PRId64
					" msg=\"entered its step in the future beyond any delay; due now\"",
					topic, rkm->partition, rkm->offset);
	lane_push_tail(l, q);
}

static bool
can_start(const dest_state *ds, const destination_config *d, int step)
{
	const step_stats *ss = &ds->steps[step - 1];

	return !ds->paused && !ds->pausing && !d->secret_unavailable && ds->in_flight < ds->window &&
		   ss->consecutive_failures + ss->in_flight < d->pause_after_failures;
}

/* Its destination was deleted while it waited: no need to wait for its time. */
static void
send_orphan_to_dlq(retry_state *st, lane *l, queued *prev, queued *q)
{
	char reason[300];

	snprintf(reason, sizeof(reason), "destination \"%s\" no longer exists", q->m.destination);
	free(q->m.bad);
	q->m.bad = strdup(reason);
	send_bad_to_dlq(st, lane_take(l, prev, q));
}

/* After a config change: every held message whose destination is gone goes to the DLQ. */
static void
drop_deleted_destinations(retry_state *st)
{
	const control_plane_config *config = config_watch_current(st->watch);

	for (int i = 0; i < st->n_lanes; i++)
	{
		lane *l = st->lanes[i];
		queued *prev = NULL, *q = l->assigned ? l->head : NULL;

		while (q)
		{
			queued *next = q->next;

			if (config_find_destination(config, q->m.destination) == NULL)
				send_orphan_to_dlq(st, l, prev, q);
			else
				prev = q;
			q = next;
		}
	}
}

/* Starts every due message its destination has room for, oldest entry first. */
static void
dispatch_due(retry_state *st)
{
	const control_plane_config *config = config_watch_current(st->watch);
	int64_t now = wall_ms();

	for (int i = 0; i < st->n_lanes; i++)
	{
		lane *l = st->lanes[i];
		queued *prev = NULL, *q = l->assigned ? l->head : NULL;

		while (q)
		{
			queued *next = q->next;
			const destination_config *d;
			dest_state *ds;

			if (q->m.due_ms > now)
			{
				prev = q;
				q = next;
				continue;
			}
			d = config_find_destination(config, q->m.destination);
			if (d == NULL)
			{
				send_orphan_to_dlq(st, l, prev, q);
				q = next;
				continue;
			}
			ds = dest_get(st, d->name);
			if (!can_start(ds, d, l->step))
				break;
			deliver_queued(st, ds, d, lane_take(l, prev, q));
			q = next;
		}
	}
}

/* While a destination is paused: one due message as the probe, if this process wins it. */
static void
probe_paused(retry_state *st)
{
	const control_plane_config *config = config_watch_current(st->watch);
	int64_t now = wall_ms();

	for (int i = 0; i < st->n_lanes; i++)
	{
		lane *l = st->lanes[i];
		queued *prev = NULL, *q = l->assigned ? first_due(l, now, &prev) : NULL;
		const destination_config *d;
		dest_state *ds;
		int64_t next_probe;

		if (q == NULL || (d = config_find_destination(config, q->m.destination)) == NULL)
			continue;
		ds = dest_get(st, d->name);
		next_probe = pause_state_next_probe_ms(st->pauses, d->name);
		if (!ds->paused || ds->probing || next_probe == 0 || now < next_probe ||
			now_ms() < ds->next_probe_try_ms)
			continue;
		ds->next_probe_try_ms = now_ms() + 500;
		if (!pause_state_claim_probe(st->pauses, d->name, d->timeout_ms + PROBE_LEASE_SLACK_MS))
			continue;
		log_message(LOG_WARN, &q->m.msg, "event=probe destination=%s step=%d", d->name, l->step);
		ds->probing = true;
		q->probe = true;
		deliver_queued(st, ds, d, lane_take(l, prev, q));
	}
}

/* Follows the shared pause state; a resume restarts the destination's ramp at 1. */
static void
follow_pauses(retry_state *st)
{
	bool changed = pause_state_poll(st->pauses);

	for (int i = 0; i < st->n_dests; i++)
	{
		dest_state *ds = st->dests[i];
		bool paused = pause_state_is_paused(st->pauses, ds->name);

		if (paused)
			ds->pausing = false; /* the shared state has it now */
		if (paused == ds->paused)
			continue;
		ds->paused = paused;
		metric_set(st->paused_gauge, paused, (const char *const[]){ds->name});
		if (paused)
		{
			log_warn("event=destination_paused destination=%s", ds->name);
			continue;
		}
		for (int s = 0; s < RETRY_STEPS; s++)
			ds->steps[s].consecutive_failures = 0;
		ds->window = 1;
		ds->next_ramp_ms = now_ms() + scaled(st, RAMP_INTERVAL_MS);
		log_warn("event=destination_resumed destination=%s msg=\"ramping up from 1 in flight\"",
				 ds->name);
	}
	(void) changed;
}

static void
ramp_up(retry_state *st)
{
	const control_plane_config *config = config_watch_current(st->watch);

	for (int i = 0; i < st->n_dests; i++)
	{
		dest_state *ds = st->dests[i];
		const destination_config *d = config_find_destination(config, ds->name);
		int max = d ? d->max_in_flight : 1;

		if (ds->window > max)
			ds->window = max;
		if (ds->window < max && now_ms() >= ds->next_ramp_ms)
		{
			ds->window = ds->window * 2 < max ? ds->window * 2 : max;
			ds->next_ramp_ms = now_ms() + scaled(st, RAMP_INTERVAL_MS);
		}
		metric_set(st->window_gauge, ds->window, (const char *const[]){ds->name});
	}
}

/* Pauses a partition's fetch while its newest message is not due even without jitter (up
 * to FETCH_RESUME_LEAD_MS before), its buffer is full, or its destination is paused with a
 * message already in hand for the probe. */
static void
adjust_fetching(retry_state *st)
{
	int64_t now = wall_ms();

	for (int i = 0; i < st->n_lanes; i++)
	{
		lane *l = st->lanes[i];
		bool hold;
		rd_kafka_topic_partition_list_t *list;

		if (!l->assigned)
			continue;
		hold =
			l->n >= LANE_BUFFER || (l->tail && l->tail->m.earliest_ms > now + FETCH_RESUME_LEAD_MS);
		if (!hold && l->head)
		{
			dest_state *ds = dest_get(st, l->head->m.destination);

			hold = ds->paused || ds->pausing;
		}
		if (hold == l->fetch_paused)
			continue;
		list = rd_kafka_topic_partition_list_new(1);
		rd_kafka_topic_partition_list_add(list, l->topic, l->partition);
		if (hold)
			rd_kafka_pause_partitions(st->consumer, list);
		else
			rd_kafka_resume_partitions(st->consumer, list);
		rd_kafka_topic_partition_list_destroy(list);
		l->fetch_paused = hold;
	}
}

/* ---------------------------------------------------------------- Kafka plumbing */

static int
busy(const retry_state *st)
{
	return http_engine_pending(st->http, NULL) + handoff_pending(st->handoff);
}

/* How long a revoke waits for the attempts under way (see finish_attempts). */
#define REVOKE_DRAIN_MS 10000

/*
 * Before giving partitions up, lets the attempts and hand-offs under way finish (no new
 * attempt starts: dispatching runs in the loop, not here), so what they settle is
 * committed and the new owner neither attempts it again nor finds it in two steps. Queued
 * messages not yet due are dropped unsent by the revoke; the new owner reads them again.
 * Bounded: the group waits for us meanwhile. Not while shutting down (the stop drained).
 */
static void
finish_attempts(retry_state *st)
{
	int64_t deadline = now_ms() + REVOKE_DRAIN_MS;

	if (st->http == NULL || busy(st) == 0)
		return;
	log_info("event=revoke_draining attempts=%d", busy(st));
	while (busy(st) > 0 && now_ms() < deadline)
	{
		http_engine_poll(st->http, 10);
		handoff_poll(st->handoff);
	}
	if (busy(st) > 0)
		log_warn("event=revoke_drain_timeout attempts=%d msg=\"the new owner attempts these "
				 "again\"",
				 busy(st));
}

static void
on_rebalance(rd_kafka_t *rk, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t *parts,
			 void *opaque)
{
	retry_state *st = opaque;

	if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS)
	{
		kafka_take_assignment(rk, parts);
		for (int i = 0; i < parts->cnt; i++)
		{
			lane *l = lane_get(st, parts->elems[i].topic, parts->elems[i].partition);

			l->assigned = true;
			l->fetch_paused = false;
			partition_backlog_watch(st->backlogs, l->topic, l->partition, true);
		}
		st->assigned = true;
		return;
	}
	finish_attempts(st);
	tracker_revoke(st->tracker, rk, parts);
	for (int i = 0; i < parts->cnt; i++)
	{
		lane *l = lane_find(st, parts->elems[i].topic, parts->elems[i].partition);

		if (l)
		{
			l->assigned = false;
			drop_lane_messages(st, l);
			partition_backlog_watch(st->backlogs, l->topic, l->partition, false);
		}
	}
	log_info("event=revoked partitions=%d", parts->cnt);
	rd_kafka_assign(rk, NULL);
	st->assigned = false;
}

static void
register_metrics(retry_state *st)
{
	static const char *const dest[] = {"destination"};
	static const char *const dest_step[] = {"destination", "topic"};

	st->delivered = metric_counter("wal_retry_delivered_total",
								   "Retried copies delivered with a 2xx answer.", 2, dest_step);
	st->failed = metric_counter("wal_retry_failed_total", "Retry attempts that failed.", 3,
								(const char *const[]){"destination", "topic", "outcome"});
	st->handed_off = metric_counter("wal_retry_handed_off_total",
									"Copies handed to the next retry step or the DLQ.", 2,
									(const char *const[]){"destination", "to"});
	st->bad_messages = metric_counter(
		"wal_retry_bad_messages_total",
		"Retry messages that could not be scheduled (bad headers, unknown destination).", 0, NULL);
	st->probes = metric_counter("wal_probes_total", "Half-open probes this process made.", 2,
								(const char *const[]){"destination", "outcome"});
	st->paused_gauge =
		metric_gauge("wal_destination_paused",
					 "1 while the destination is paused on every retry step.", 1, dest);
	st->window_gauge = metric_gauge(
		"wal_retry_window", "Attempts allowed in flight (ramps up after a pause).", 1, dest);
	st->backlog_gauge =
		metric_gauge("wal_retry_backlog",
					 "Messages waiting in the destination's partition of a step.", 2, dest_step);
}

static bool
retry_ready(void *arg)
{
	return ((retry_state *) arg)->assigned;
}

static char *
retry_config_json(void *arg)
{
	return config_watch_json_for_peers(((retry_state *) arg)->watch);
}

static void
pause_all_fetching(retry_state *st)
{
	role_pause_fetching(st->consumer);
	for (int i = 0; i < st->n_lanes; i++)
		st->lanes[i]->fetch_paused = true;
}

/* The shared pause state (held as "retry:PID") and the offset tracker. */
static void
open_shared_state(retry_state *st)
{
	char holder[128];

	snprintf(holder, sizeof(holder), "retry:%d", (int) getpid());
	st->pauses = pause_state_new(st->opts, config_watch_current(st->watch), holder, true);
	st->stats = delivery_stats_start(st->opts->conninfo, st->opts->role);
	st->tracker = tracker_new();
}

/* The consumer of the step topics and the hand-off producer; false (logged) on failure. */
static bool
connect_kafka(retry_state *st)
{
	kafka_default defaults[] = {
		{"group.id", "wal_delivery.retry"},    {"enable.auto.commit", "false"},
		{"enable.auto.offset.store", "false"}, {"auto.offset.reset", "earliest"},
		{"client.id", "wal-worker-retry"},
	};
	role_kafka kafka = {defaults, (int) (sizeof(defaults) / sizeof(defaults[0])), on_rebalance,
						on_queued_handed_off, st};

	return role_connect_kafka(st->opts, st->watch, &kafka, &st->consumer, &st->handoff);
}

/* The step topics: the configuration's retry_topic_prefix followed by 1, 2 and 3. */
static void
subscribe_step_topics(retry_state *st)
{
	char names[RETRY_STEPS][512];
	char *topics[RETRY_STEPS];

	for (int step = 1; step <= RETRY_STEPS; step++)
	{
		snprintf(names[step - 1], sizeof(names[step - 1]), "%s%d",
				 config_watch_current(st->watch)->retry_topic_prefix, step);
		topics[step - 1] = names[step - 1];
	}
	role_subscribe(st->consumer, topics, RETRY_STEPS);
}

/*
 * On the first stop request: pause every fetch and give what is in flight ROLE_DRAIN_MS
 * to finish. True once nothing is in flight or that time is up.
 */
static bool
drained_after_stop(retry_state *st)
{
	if (role_drain_begins(&st->shutdown_deadline))
	{
		log_info("event=stopping in_flight=%d", busy(st));
		pause_all_fetching(st);
	}
	return role_drained(st->shutdown_deadline, busy(st));
}

/* One message (or event) from the step topics into its lane; true when there was one. */
static bool
take_message(retry_state *st)
{
	rd_kafka_message_t *rkm = rd_kafka_consumer_poll(st->consumer, busy(st) ? 0 : 20);

	if (rkm == NULL)
		return false;
	if (role_is_record(rkm))
		on_message(st, rkm);
	rd_kafka_message_destroy(rkm);
	return true;
}

/* A newly published config (messages of deleted destinations leave), then the pauses. */
static void
follow_control_plane(retry_state *st)
{
	if (config_watch_poll(st->watch))
		drop_deleted_destinations(st);
	follow_pauses(st);
}

/* Every due message its destination has room for, after the ramp; then the probes. */
static void
start_attempts(retry_state *st)
{
	ramp_up(st);
	dispatch_due(st);
	probe_paused(st);
}

/* Once a second each: commit up to the durable outcomes; report the step counters. */
static void
keep_books(retry_state *st)
{
	if (now_ms() >= st->next_commit_ms)
	{
		tracker_commit(st->tracker, st->consumer, false);
		st->next_commit_ms = now_ms() + COMMIT_INTERVAL_MS;
	}
	if (now_ms() >= st->next_report_ms)
	{
		report_stats(st);
		st->next_report_ms = now_ms() + REPORT_INTERVAL_MS;
	}
}

/* Abandons what did not finish (not committed, so it is read again), then commits. */
static void
shut_down(retry_state *st)
{
	http_engine_free(st->http);
	handoff_producer_free(st->handoff);
	st->http = NULL; /* the revoke that closing the consumer brings must not use them */
	st->handoff = NULL;
	tracker_commit(st->tracker, st->consumer, true);
	rd_kafka_consumer_close(st->consumer); /* its revoke still updates the backlog list */
	partition_backlog_stop(st->backlogs);
	rd_kafka_destroy(st->consumer);
	free_lanes_and_dests(st);
	tracker_free(st->tracker);
	pause_state_free(st->pauses);
	delivery_stats_stop(st->stats);
	if (st->admin)
		admin_server_stop(st->admin);
	config_watch_stop(st->watch);
	log_info("event=stopped");
}

int
run_retry(const worker_options *opts)
{
	retry_state st = {.opts = opts};

	stop_on_signals();
	register_metrics(&st);
	/* The config comes first: it names the brokers, the step topics and the destinations. */
	st.watch = config_watch_start(opts, &stop_requested);
	if (st.watch == NULL)
		return stop_requested ? 0 : 1;
	if (!role_start_admin(opts, &(admin_handlers){retry_ready, retry_config_json, &st}, &st.admin))
		return 1;
	open_shared_state(&st);
	if (!connect_kafka(&st))
		return 1;
	subscribe_step_topics(&st);
	st.backlogs = partition_backlog_start(st.consumer, 2000);
	/* Not a fixed 256: that capped destinations with a larger max_in_flight (bench/end_to_end). */
	st.http = http_engine_new(http_engine_affordable_in_flight());
	log_info("event=started time_scale=%g config_version=%" PRId64, opts->time_scale,
			 config_watch_current(st.watch)->version);

	while (!drained_after_stop(&st))
	{
		bool got_one = take_message(&st);

		sd_notify_loop();
		follow_control_plane(&st);
		/* Stopping: nothing new starts, and fetching stays paused. */
		if (!st.shutdown_deadline)
			start_attempts(&st);
		/* Wait on the transfers only when they are all there is: Kafka had nothing. */
		http_engine_poll(st.http, busy(&st) && !got_one ? 10 : 0);
		handoff_poll(st.handoff);
		keep_books(&st);
		if (!st.shutdown_deadline)
			adjust_fetching(&st);
	}

	shut_down(&st);
	return 0;
}
