/*
 * retry_delivery.c: one attempt of a held retry message and where its answer sends it:
 * done on success, the next step (step 3: the DLQ) on a transient failure, the DLQ on a
 * permanent one or when it cannot be retried at all. A failure that reaches the
 * destination's pause_after_failures trips the shared pause once its hand-off is
 * acknowledged; a probe's answer ends or keeps the pause (see retry.c).
 */
#include <inttypes.h>
#include <stdio.h>
#include <time.h>

#include "common/attempt_span.h"
#include "common/clock.h"
#include "common/delivery_request.h"
#include "common/log.h"
#include "common/webhook.h"
#include "retry/retry_state.h"

/* Its outcome is durable: the offset may move past it. */
static void
queued_done(retry_state *st, queued *q)
{
	tracker_copy_done(st->tracker, q->record);
	queued_free(q);
}

void
on_queued_handed_off(void *opaque, void *arg)
{
	retry_state *st = arg;
	queued *q = opaque;

	if (q->pause_after_handoff)
	{
		const destination_config *d =
			config_find_destination(config_watch_current(st->watch), q->m.destination);

		pause_state_pause(st->pauses, q->m.destination, q->m.step, q->error,
						  scaled(st, d ? d->probe_interval_ms : 120000));
	}
	queued_done(st, q);
}

static void
hand_off(retry_state *st, queued *q, handoff_target target, int attempts, long not_before_s)
{
	const control_plane_config *config = config_watch_current(st->watch);
	const destination_config *d =
		q->m.destination ? config_find_destination(config, q->m.destination) : NULL;
	const char *labels[] = {q->m.destination ? q->m.destination : "", handoff_target_name(target)};

	metric_add(st->handed_off, 1, labels);
	if (target == HANDOFF_DLQ)
		delivery_stats_count(st->stats, q->m.msg.source_topic, q->m.destination,
							 STAT_DEAD_LETTERED);
	log_message(LOG_INFO, &q->m.msg,
				"event=hand_off destination=%s from=retry.%d to=%s error=\"%s\"", labels[0],
				q->m.step, handoff_target_name(target), q->error);
	handoff_send(st->handoff, config, d, q->m.destination, &q->m.msg, target, attempts, q->error,
				 not_before_s, q);
}

static handoff_target
next_step(int step)
{
	return step >= RETRY_STEPS ? HANDOFF_DLQ : (handoff_target) (step + 1);
}

static void
finish_probe(retry_state *st, dest_state *ds, queued *q, delivery_outcome outcome,
			 const destination_config *d)
{
	const char *labels[] = {ds->name, delivery_outcome_name(outcome)};
	long probe_after = scaled(st, d ? d->probe_interval_ms : 120000);

	ds->probing = false;
	metric_add(st->probes, 1, labels);
	if (outcome == DELIVERY_SUCCESS)
	{
		pause_state_finish_probe(st->pauses, ds->name, PROBE_SUCCESS, NULL, probe_after);
		queued_done(st, q);
	}
	else if (outcome == DELIVERY_PERMANENT)
	{
		pause_state_finish_probe(st->pauses, ds->name, PROBE_PERMANENT, q->error, probe_after);
		hand_off(st, q, HANDOFF_DLQ, q->m.attempt + 1, -1);
	}
	else
	{
		/* Still down: the message stays first in line for the next probe. */
		pause_state_finish_probe(st->pauses, ds->name, PROBE_TRANSIENT, q->error, probe_after);
		if (q->lane->assigned)
			lane_push_head(q->lane, q);
		else
			queued_free(q);
	}
}

/* The attempt's span, for a record with a trace context; a probe's too. */
static void
record_attempt_span(const queued *q, const http_result *result, delivery_outcome outcome)
{
	const attempt_span a = {&q->attempt_trace.parent,
							&q->attempt_trace.attempt,
							q->m.msg.source_topic,
							q->m.destination,
							q->m.msg.idempotency_key,
							q->m.attempt + 1,
							q->m.step};

	if (q->attempt_trace.present)
		attempt_span_record(&a, result, outcome);
}

static void
on_http_done(void *opaque, const http_result *result)
{
	queued *q = opaque;
	retry_state *st = q->m.msg.owner;
	const destination_config *d =
		config_find_destination(config_watch_current(st->watch), q->m.destination);
	dest_state *ds = dest_get(st, q->m.destination);
	step_stats *ss = &ds->steps[q->m.step - 1];
	delivery_outcome outcome;

	ds->in_flight--;
	ss->in_flight--;
	if (result->aborted)
	{
		/* Stopping: not done, so its offset is not committed and it is read again. */
		queued_free(q);
		return;
	}
	outcome = classify_http_result(result->curl_code, result->http_status,
								   d ? (const char *const *) d->transient_statuses : NULL,
								   d ? d->n_transient_statuses : 0);
	record_attempt_span(q, result, outcome);
	snprintf(q->error, sizeof(q->error), "%s", result->error);
	if (outcome == DELIVERY_SUCCESS)
	{
		ss->consecutive_failures = 0;
		ss->delivered++;
		delivery_stats_count(st->stats, q->m.msg.source_topic, ds->name, STAT_DELIVERED);
		ss->last_success_at = wall_ms();
		metric_add(st->delivered, 1, (const char *const[]){ds->name, q->lane->topic});
	}
	else
	{
		ss->failed++;
		delivery_stats_count(st->stats, q->m.msg.source_topic, ds->name, STAT_FAILED);
		ss->last_error_at = wall_ms();
		snprintf(ss->last_error, sizeof(ss->last_error), "%s", q->error);
		metric_add(st->failed, 1,
				   (const char *const[]){ds->name, q->lane->topic, delivery_outcome_name(outcome)});
		/* A non-transient answer resets the step's count of consecutive failures. */
		ss->consecutive_failures = outcome == DELIVERY_TRANSIENT ? ss->consecutive_failures + 1 : 0;
	}
	if (q->probe)
	{
		finish_probe(st, ds, q, outcome, d);
		return;
	}
	if (outcome == DELIVERY_SUCCESS)
		queued_done(st, q);
	else if (outcome == DELIVERY_PERMANENT)
		hand_off(st, q, HANDOFF_DLQ, q->m.attempt + 1, -1);
	else
	{
		if (d && ss->consecutive_failures >= d->pause_after_failures && !ds->paused)
		{
			/* Hand this one on first; the pause follows its ack (on_handed_off). */
			ds->pausing = true;
			q->pause_after_handoff = true;
			log_message(LOG_WARN, &q->m.msg,
						"event=pause_tripped destination=%s step=%d consecutive_failures=%d "
						"error=\"%s\"",
						ds->name, q->m.step, ss->consecutive_failures, q->error);
		}
		hand_off(st, q, next_step(q->m.step), q->m.attempt + 1,
				 parse_retry_after(result->retry_after, time(NULL)));
	}
}

void
deliver_queued(retry_state *st, dest_state *ds, const destination_config *d, queued *q)
{
	const char *refusal = delivery_refusal(d, &q->m.msg);
	header_lines headers;
	http_request req;
	bool submitted;

	if (refusal != NULL)
	{
		/* No attempt could ever send it (e.g. it cannot be signed): the DLQ, with why. */
		snprintf(q->error, sizeof(q->error), "%s", refusal);
		hand_off(st, q, HANDOFF_DLQ, q->m.attempt, -1);
		return;
	}
	req = delivery_request(d, &q->m.msg, q->m.attempt + 1, &q->attempt_trace, &headers);
	if (ds->window < d->max_in_flight)
		req.max_in_flight = ds->window;
	q->m.msg.owner = st;
	ds->in_flight++;
	ds->steps[q->m.step - 1].in_flight++;
	submitted = http_engine_submit(st->http, &req, on_http_done, q);
	header_lines_release(&headers);
	if (!submitted)
	{
		ds->in_flight--;
		ds->steps[q->m.step - 1].in_flight--;
		snprintf(q->error, sizeof(q->error), "could not start the HTTP request");
		hand_off(st, q, next_step(q->m.step), q->m.attempt, -1);
	}
}

/* Messages that cannot be retried go to the DLQ with their reason, whatever the pause. */
void
send_bad_to_dlq(retry_state *st, queued *q)
{
	metric_add(st->bad_messages, 1, NULL);
	log_message(LOG_WARN, &q->m.msg,
				"event=bad_retry_message from=%s partition=%d offset=%" PRId64
				" reason=\"%s\" msg=\"sending it to the DLQ\"",
				q->lane->topic, q->lane->partition, q->offset, q->m.bad);
	snprintf(q->error, sizeof(q->error), "%s", q->m.bad);
	hand_off(st, q, HANDOFF_DLQ, q->m.attempt, -1);
}
