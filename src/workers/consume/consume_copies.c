/*
 * consume_copies.c: a consumed record's copies, one per destination it is for, from the
 * attempt to done: delivered (2xx), or handed off to retry step 1 or the DLQ and
 * acknowledged there. The record's offset may be committed once all its copies are done.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/delivery_request.h"
#include "common/log.h"
#include "common/webhook.h"
#include "consume/consume_state.h"

typedef struct shared_record shared_record;

/* One destination's copy of a record; lives inside its shared_record. */
typedef struct record_copy
{
	tracked_record *record;
	const char *destination; /* in the shared record's allocation */
	dedupe_pair dedupe;
	shared_record *shared;
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
	log_info("event=hand_off destination=%s topic=%s key=%s to=%s error=\"%s\"", copy->destination,
			 copy->shared->msg.source_topic, copy->shared->msg.idempotency_key,
			 handoff_target_name(target), error);
	handoff_send(st->handoff, config_watch_current(st->watch), d, copy->destination,
				 &copy->shared->msg, target, 1, error, not_before_s, copy);
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
	outcome = classify_http_result(result->curl_code, result->http_status,
								   d ? (const char *const *) d->transient_statuses : NULL,
								   d ? d->n_transient_statuses : 0);
	if (outcome == DELIVERY_SUCCESS)
	{
		const char *labels[] = {copy->destination};

		metric_add(st->delivered, 1, labels);
		dedupe_remember_pair(st->dedupe, copy->dedupe, now_ms());
		log_debug("event=delivered destination=%s topic=%s key=%s status=%ld ms=%ld",
				  copy->destination, copy->shared->msg.source_topic,
				  copy->shared->msg.idempotency_key, result->http_status, result->elapsed_ms);
		copy_done(st, copy);
		return;
	}
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

	if (pause_state_is_paused(st->pauses, d->name))
	{
		/* Breaker open: no attempt while the destination is paused; its probe runs in
		 * the retry consumers. The copy queues in step 1 and the offset moves on. */
		const char *labels[] = {d->name};

		metric_add(st->breaker_handoffs, 1, labels);
		hand_off(st, copy, HANDOFF_RETRY_STEP_1, "breaker open: destination paused", -1);
		return;
	}
	if (d->secret_unavailable)
	{
		/* Config from a peer has no secrets: never send unsigned, keep the copy for later. */
		hand_off(st, copy, HANDOFF_RETRY_STEP_1,
				 "signing secret unavailable: config came from a peer", -1);
		return;
	}
	req = delivery_request(d, &copy->shared->msg, 1, &headers);
	req.body_borrowed = true; /* the shared record outlives the request */
	submitted = http_engine_submit(st->http, &req, on_http_done, copy);
	header_lines_release(&headers);
	if (!submitted)
		hand_off(st, copy, HANDOFF_RETRY_STEP_1, "could not start the HTTP request", -1);
}

void
handle_record(consumer_state *st, rd_kafka_message_t *rkm)
{
	const control_plane_config *config = config_watch_current(st->watch);
	const char *topic = rd_kafka_topic_name(rkm->rkt);
	const destination_config *targets[256];
	dedupe_pair pairs[256];
	int n_targets = 0;
	size_t names_len = 0;
	int64_t now = now_ms();
	tracked_record *record;
	handoff_message msg;
	dedupe_key_hash key;
	shared_record *shared;
	char *names;

	handoff_message_from_kafka(&msg, rkm, false);
	key = dedupe_hash_key(msg.idempotency_key);
	for (int i = 0; i < config->n_destinations && n_targets < 256; i++)
	{
		const destination_config *d = &config->destinations[i];

		if (!consumer_serves(st, d) || !destination_subscribes(d, topic))
			continue;
		pairs[n_targets] = dedupe_hash_pair(key, d->name);
		if (dedupe_seen_pair(st->dedupe, pairs[n_targets], now))
			continue;
		names_len += strlen(d->name) + 1;
		targets[n_targets++] = d;
	}
	record = tracker_open(st->tracker, topic, rkm->partition, rkm->offset, n_targets);
	if (n_targets == 0)
	{
		handoff_message_clear(&msg);
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
}
