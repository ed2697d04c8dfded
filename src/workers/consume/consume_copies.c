/*
 * consume_copies.c: a consumed record's copies, one per destination it is for, from the
 * attempt to done: delivered (2xx), or handed off to retry step 1 or the DLQ and
 * acknowledged there. The record's offset may be committed once all its copies are done.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/attempt_span.h"
#include "common/clock.h"
#include "common/delivery_request.h"
#include "common/log.h"
#include "common/webhook.h"
#include "consume/consume_state.h"

/* Destinations per record whose lists handle_record keeps on the stack. */
#define STACK_TARGETS 32

typedef struct shared_record shared_record;

/* One destination's copy of a record; lives inside its shared_record. */
typedef struct record_copy
{
	tracked_record *record;
	const char *destination; /* in the shared record's allocation */
	dedupe_pair dedupe;
	shared_record *shared;
	/* The span of the copy's attempt (delivery_request): on_http_done has its answer. */
	delivery_trace attempt_trace;
} record_copy;

/*
 * A consumed record, shared by its copies and freed with the last one. One allocation
 * holds it, its copies and their destination names (copies are done in any order).
 */
struct shared_record
{
	handoff_message msg; /* kept for a retry or DLQ hand-off; msg.owner is the consumer */
	int copies_left;
	record_copy copies[];
};

bool
consumer_serves(const consumer_state *st, const destination_config *d)
{
	if (st->opts->destination != NULL)
		return strcmp(d->name, st->opts->destination) == 0;
	return !d->dedicated;
}

static void
copy_free(record_copy *copy)
{
	shared_record *shared = copy->shared;

	if (--shared->copies_left == 0)
	{
		((consumer_state *) shared->msg.owner)->open_payload_bytes -= shared->msg.payload_len;
		handoff_message_clear(&shared->msg);
		free(shared);
	}
}

static void
copy_done(consumer_state *st, record_copy *copy)
{
	tracker_copy_done(st->tracker, copy->record);
	copy_free(copy);
}

/* handoff.c calls this once the retry or DLQ write is acknowledged (acks=all). */
void
on_copy_handed_off(void *opaque, void *arg)
{
	copy_done((consumer_state *) arg, (record_copy *) opaque);
}

static void
hand_off(consumer_state *st, record_copy *copy, handoff_target target, const char *error,
		 long not_before_s)
{
	const destination_config *d =
		config_find_destination(config_watch_current(st->watch), copy->destination);
	const char *labels[] = {copy->destination, handoff_target_name(target)};

	metric_add(st->failures, 1, labels);
	if (target == HANDOFF_DLQ)
		delivery_stats_count(st->stats, copy->shared->msg.source_topic, copy->destination,
							 STAT_DEAD_LETTERED);
	log_message(LOG_INFO, &copy->shared->msg, "event=hand_off destination=%s to=%s error=\"%s\"",
				copy->destination, handoff_target_name(target), error);
	handoff_send(st->handoff, config_watch_current(st->watch), d, copy->destination,
				 &copy->shared->msg, target, 1, error, not_before_s, copy);
}

/*
 * Breaker open: no attempt while the destination is paused; its probe runs in the retry
 * consumers. The copy queues in step 1 and the offset moves on.
 */
static void
hand_off_breaker_open(consumer_state *st, record_copy *copy)
{
	const char *labels[] = {copy->destination};

	metric_add(st->breaker_handoffs, 1, labels);
	hand_off(st, copy, HANDOFF_RETRY_STEP_1, "breaker open: destination paused", -1);
}

bool
consumer_may_start(void *arg, const char *destination)
{
	return !pause_state_is_paused(((consumer_state *) arg)->pauses, destination);
}

/* The attempt's span, for a record with a trace context (consume's is attempt 1, step 0). */
static void
record_attempt_span(const record_copy *copy, const http_result *result, delivery_outcome outcome)
{
	const attempt_span a = {&copy->attempt_trace.parent,
							&copy->attempt_trace.attempt,
							copy->shared->msg.source_topic,
							copy->destination,
							copy->shared->msg.idempotency_key,
							1,
							0};

	if (copy->attempt_trace.present)
		attempt_span_record(&a, result, outcome);
}

static void
on_http_done(void *opaque, const http_result *result)
{
	record_copy *copy = opaque;
	consumer_state *st = copy->shared->msg.owner;
	const destination_config *d =
		config_find_destination(config_watch_current(st->watch), copy->destination);
	delivery_outcome outcome;
	char error[256];

	if (result->aborted)
	{
		/* Stopping: the copy stays open, so its offset is not committed. */
		copy_free(copy);
		return;
	}
	if (result->withdrawn)
	{
		/* Its partition is being revoked: never sent, left to the next owner. */
		tracker_copy_withdrawn(st->tracker, copy->record);
		copy_free(copy);
		return;
	}
	if (result->held)
	{
		/* Queued before the pause began, held at its start: the breaker is open. */
		hand_off_breaker_open(st, copy);
		return;
	}
	outcome = classify_http_result(result->curl_code, result->http_status,
								   d ? (const char *const *) d->transient_statuses : NULL,
								   d ? d->n_transient_statuses : 0);
	record_attempt_span(copy, result, outcome);
	if (outcome == DELIVERY_SUCCESS)
	{
		const char *labels[] = {copy->destination};

		metric_add(st->delivered, 1, labels);
		delivery_stats_count(st->stats, copy->shared->msg.source_topic, copy->destination,
							 STAT_DELIVERED);
		dedupe_remember_pair(st->dedupe, copy->dedupe, now_ms());
		log_message(LOG_DEBUG, &copy->shared->msg,
					"event=delivered destination=%s status=%ld ms=%ld", copy->destination,
					result->http_status, result->elapsed_ms);
		copy_done(st, copy);
		return;
	}
	delivery_stats_count(st->stats, copy->shared->msg.source_topic, copy->destination, STAT_FAILED);
	snprintf(error, sizeof(error), "%s", result->error);
	hand_off(st, copy, outcome == DELIVERY_TRANSIENT ? HANDOFF_RETRY_STEP_1 : HANDOFF_DLQ, error,
			 outcome == DELIVERY_TRANSIENT ? parse_retry_after(result->retry_after, time(NULL))
										   : -1);
}

static void
deliver_copy(consumer_state *st, record_copy *copy, const destination_config *d)
{
	http_request req;
	header_lines headers;
	bool submitted;
	const char *refusal;

	if (pause_state_is_paused(st->pauses, d->name))
	{
		hand_off_breaker_open(st, copy);
		return;
	}
	refusal = delivery_refusal(d, &copy->shared->msg);
	if (refusal != NULL)
	{
		/* No attempt can ever send it: a dead letter with the reason, never dropped. */
		hand_off(st, copy, HANDOFF_DLQ, refusal, -1);
		return;
	}
	if (d->secret_unavailable)
	{
		/* Config from a peer has no secrets: never send unsigned, keep the copy for later. */
		hand_off(st, copy, HANDOFF_RETRY_STEP_1,
				 "signing secret unavailable: config came from a peer", -1);
		return;
	}
	req = delivery_request(d, &copy->shared->msg, 1, &copy->attempt_trace, &headers);
	req.body_borrowed = true; /* the shared record outlives the request */
	submitted = http_engine_submit(st->http, &req, on_http_done, copy);
	header_lines_release(&headers);
	if (!submitted)
		hand_off(st, copy, HANDOFF_RETRY_STEP_1, "could not start the HTTP request", -1);
}

static bool
keep_unless_revoked(void *arg, void *opaque)
{
	return !tracker_record_in(((record_copy *) opaque)->record, arg);
}

int
withdraw_copies_of(consumer_state *st, const rd_kafka_topic_partition_list_t *parts)
{
	return http_engine_withdraw(st->http, keep_unless_revoked, (void *) parts);
}

/* The served destinations subscribed to topic, at most config->n_destinations of them. */
static int
find_targets(consumer_state *st, const control_plane_config *config, const char *topic,
			 dedupe_key_hash key, int64_t now, const destination_config **targets,
			 dedupe_pair *pairs, size_t *names_len)
{
	int n = 0;

	*names_len = 0;
	for (int i = 0; i < config->n_destinations; i++)
	{
		const destination_config *d = &config->destinations[i];

		if (!consumer_serves(st, d) || !destination_subscribes(d, topic))
			continue;
		pairs[n] = dedupe_hash_pair(key, d->name);
		if (dedupe_seen_pair(st->dedupe, pairs[n], now))
			continue;
		*names_len += strlen(d->name) + 1;
		targets[n++] = d;
	}
	return n;
}

static void
free_targets(bool on_stack, const destination_config **targets, dedupe_pair *pairs)
{
	if (on_stack)
		return;
	free(targets);
	free(pairs);
}

void
handle_record(consumer_state *st, rd_kafka_message_t *rkm)
{
	const control_plane_config *config = config_watch_current(st->watch);
	const char *topic = rd_kafka_topic_name(rkm->rkt);
	/*
	 * As many as the config has: no fixed limit on a topic's fan-out. Up to
	 * STACK_TARGETS on the stack, the common case, so a record costs no malloc here.
	 */
	int max_targets = config->n_destinations > 0 ? config->n_destinations : 1;
	const destination_config *stack_targets[STACK_TARGETS];
	dedupe_pair stack_pairs[STACK_TARGETS];
	bool on_stack = max_targets <= STACK_TARGETS;
	const destination_config **targets =
		on_stack ? stack_targets : malloc(sizeof(*targets) * max_targets);
	dedupe_pair *pairs = on_stack ? stack_pairs : malloc(sizeof(*pairs) * max_targets);
	int n_targets;
	size_t names_len;
	tracked_record *record;
	handoff_message msg;
	shared_record *shared;
	char *names;

	if (targets == NULL || pairs == NULL)
	{
		log_error("event=out_of_memory msg=\"cannot keep a consumed record\"");
		abort();
	}
	handoff_message_from_kafka(&msg, rkm, false);
	n_targets = find_targets(st, config, topic, dedupe_hash_record(topic, msg.idempotency_key),
							 now_ms(), targets, pairs, &names_len);
	record = tracker_open(st->tracker, topic, rkm->partition, rkm->offset, n_targets);
	if (n_targets == 0)
	{
		handoff_message_clear(&msg);
		free_targets(on_stack, targets, pairs);
		return;
	}
	shared = malloc(sizeof(*shared) + sizeof(record_copy) * n_targets + names_len);
	if (shared == NULL)
	{
		log_error("event=out_of_memory msg=\"cannot keep a consumed record\"");
		abort();
	}
	shared->msg = msg;
	shared->msg.owner = st;
	st->open_payload_bytes += msg.payload_len;
	/* All copies hold it before any can finish (a hand-off may complete at once). */
	shared->copies_left = n_targets;
	names = (char *) &shared->copies[n_targets];
	for (int i = 0; i < n_targets; i++)
	{
		size_t len = strlen(targets[i]->name) + 1;

		shared->copies[i] = (record_copy){
			.record = record,
			.destination = memcpy(names, targets[i]->name, len),
			.dedupe = pairs[i],
			.shared = shared,
		};
		names += len;
	}
	for (int i = 0; i < n_targets; i++)
		deliver_copy(st, &shared->copies[i], targets[i]);
	free_targets(on_stack, targets, pairs);
}
