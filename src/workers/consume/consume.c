/*
 * consume.c: `wal-worker consume`, delivering every record of the main topics to every
 * subscribed destination, at least once.
 *
 * A consumed record becomes one "copy" per destination it is for. A copy is done when
 * the destination answered 2xx, or when it was durably handed off (acks=all) to retry
 * step 1 (transient failure) or to the DLQ (permanent failure). Offsets are committed
 * only up to the low watermark of done records (offset_tracker), never automatically.
 *
 * Shared mode serves every destination not marked dedicated, in consumer group
 * "wal_delivery.shared"; `--destination NAME` serves one dedicated destination in group
 * "wal_delivery.dedicated.NAME", so a busy destination cannot slow the others.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <curl/curl.h>
#include <librdkafka/rdkafka.h>

#include "common/admin_server.h"
#include "common/clock.h"
#include "common/config_watch.h"
#include "common/kafka_conf.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/role_lifecycle.h"
#include "common/role_setup.h"
#include "common/sd_notify.h"
#include "common/stop_signal.h"
#include "consume/consume_state.h"
#include "roles.h"

#define MAX_OPEN_RECORDS 2000 /* take no more records while this many are open */
/* ... or while their payloads take this much: 2000 large records would not fit in memory. */
#define MAX_OPEN_PAYLOAD_BYTES (16 * 1024 * 1024)
#define COMMIT_INTERVAL_MS     1000
#define DEDUPE_MAX_ENTRIES     200000
#define POLL_BATCH             64 /* records taken per loop turn */
/* How long a revoke waits for the revoked partitions' open records (see finish_revoked). */
#define REVOKE_DRAIN_MS 10000

/* ---------------------------------------------------------------- which destinations */

/* The sorted set of topics the served destinations subscribe to. */
static int
compare_strings(const void *a, const void *b)
{
	return strcmp(*(char *const *) a, *(char *const *) b);
}

static char **
wanted_topics(const consumer_state *st, const control_plane_config *config, int *n)
{
	int cap = 8;
	char **topics = malloc(sizeof(char *) * cap);

	*n = 0;
	for (int i = 0; i < config->n_destinations; i++)
	{
		const destination_config *d = &config->destinations[i];

		if (!consumer_serves(st, d))
			continue;
		for (int t = 0; t < d->n_topics; t++)
		{
			bool seen = false;

			for (int k = 0; k < *n; k++)
				seen = seen || strcmp(topics[k], d->topics[t]) == 0;
			if (seen)
				continue;
			if (*n == cap)
				topics = realloc(topics, sizeof(char *) * (cap *= 2));
			topics[(*n)++] = strdup(d->topics[t]);
		}
	}
	qsort(topics, *n, sizeof(char *), compare_strings);
	return topics;
}

static void
free_strings(char **strings, int n)
{
	for (int i = 0; i < n; i++)
		free(strings[i]);
	free(strings);
}

/* Subscribes to the topics the current config asks for, when they changed. */
static void
follow_subscriptions(consumer_state *st)
{
	const control_plane_config *config = config_watch_current(st->watch);
	int n;
	char **topics = wanted_topics(st, config, &n);
	bool same = n == st->n_subscribed;
	rd_kafka_resp_err_t err;

	for (int i = 0; same && i < n; i++)
		same = strcmp(topics[i], st->subscribed[i]) == 0;
	if (same)
	{
		free_strings(topics, n);
		return;
	}
	if (n == 0)
	{
		rd_kafka_unsubscribe(st->consumer);
		log_info("event=unsubscribed msg=\"no served destination subscribes to any topic; "
				 "waiting for the config to change\"");
	}
	else
	{
		err = role_subscribe(st->consumer, topics, n);
		if (err)
			log_error("event=subscribe_failed error=\"%s\"", rd_kafka_err2str(err));
		else
			log_info("event=subscribed topics=%d first=%s config_version=%" PRId64, n, topics[0],
					 config->version);
	}
	free_strings(st->subscribed, st->n_subscribed);
	st->subscribed = topics;
	st->n_subscribed = n;
}

/* ---------------------------------------------------------------- Kafka plumbing */

/*
 * Before giving partitions up: takes back their copies still waiting in the HTTP engine
 * (never sent, so the next owner sending them is no duplicate), then lets the ones under
 * way finish (transfers and hand-offs move on; no new record is taken), so they are
 * committed and the next owner does not send them again: a rebalance by a member joining
 * or leaving cleanly then duplicates nothing, and it waits about one answer, not the whole
 * backlog. The group waits for us meanwhile (up to max.poll.interval.ms), so the wait is
 * bounded; what is still under way after REVOKE_DRAIN_MS is sent again by the next owner
 * (at least once). Not while shutting down: the engine is gone, the stop had its drain.
 */
static void
finish_revoked(consumer_state *st, const rd_kafka_topic_partition_list_t *parts)
{
	int64_t deadline = now_ms() + REVOKE_DRAIN_MS;
	int withdrawn;

	if (st->http == NULL || !tracker_has_open(st->tracker, parts))
		return;
	withdrawn = withdraw_copies_of(st, parts);
	log_info("event=revoke_draining open_records=%d withdrawn=%d",
			 tracker_open_records(st->tracker), withdrawn);
	while (tracker_has_open(st->tracker, parts) && now_ms() < deadline)
	{
		http_engine_poll(st->http, 10);
		handoff_poll(st->handoff);
		pause_state_poll(st->pauses);
	}
	if (tracker_has_open(st->tracker, parts))
		log_warn("event=revoke_drain_timeout open_records=%d msg=\"the new owner sends these "
				 "again\"",
				 tracker_open_records(st->tracker));
}

static void
on_rebalance(rd_kafka_t *rk, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t *parts,
			 void *opaque)
{
	consumer_state *st = opaque;

	if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS)
	{
		kafka_take_assignment(rk, parts);
		st->assigned = true;
		st->paused = false;
		return;
	}
	finish_revoked(st, parts);
	tracker_revoke(st->tracker, rk, parts);
	log_info("event=revoked partitions=%d", parts->cnt);
	rd_kafka_assign(rk, NULL);
	st->assigned = false;
}

/* Stopping: no more fetching; what is in flight finishes. */
static void
stop_fetching(consumer_state *st)
{
	if (st->assigned)
		role_pause_fetching(st->consumer);
	st->paused = true;
}

/* Lag per assigned partition: the end of the partition (as last fetched) minus our position. */
static void
update_lag(consumer_state *st)
{
	rd_kafka_topic_partition_list_t *assignment = NULL;

	if (rd_kafka_assignment(st->consumer, &assignment) != RD_KAFKA_RESP_ERR_NO_ERROR)
		return;
	rd_kafka_position(st->consumer, assignment);
	for (int i = 0; i < assignment->cnt; i++)
	{
		rd_kafka_topic_partition_t *tp = &assignment->elems[i];
		int64_t low, high;
		char partition[16];
		const char *labels[] = {tp->topic, partition};

		if (tp->offset < 0 ||
			rd_kafka_get_watermark_offsets(st->consumer, tp->topic, tp->partition, &low, &high) !=
				RD_KAFKA_RESP_ERR_NO_ERROR)
			continue;
		snprintf(partition, sizeof(partition), "%d", tp->partition);
		metric_set(st->lag, (double) (high > tp->offset ? high - tp->offset : 0), labels);
	}
	rd_kafka_topic_partition_list_destroy(assignment);
}

static void
update_gauges(consumer_state *st)
{
	const control_plane_config *config = config_watch_current(st->watch);

	update_lag(st);
	metric_set(st->open_records, tracker_open_records(st->tracker), NULL);
	metric_set(st->config_version, (double) config->published_version, NULL);
	for (int i = 0; i < config->n_destinations; i++)
	{
		const char *labels[] = {config->destinations[i].name};

		if (consumer_serves(st, &config->destinations[i]))
			metric_set(st->in_flight, http_engine_in_flight(st->http, labels[0]), labels);
	}
}

static bool
consumer_ready(void *arg)
{
	consumer_state *st = arg;

	return config_watch_current(st->watch) != NULL && st->assigned;
}

static char *
consumer_config_json(void *arg)
{
	return config_watch_json_for_peers(((consumer_state *) arg)->watch);
}

static void
register_metrics(consumer_state *st)
{
	static const char *const dest[] = {"destination"};
	static const char *const dest_class[] = {"destination", "to"};

	st->delivered =
		metric_counter("wal_delivered_total", "Copies delivered with a 2xx answer.", 1, dest);
	st->failures = metric_counter(
		"wal_handed_off_total", "Copies handed to a retry step or the DLQ after a failed attempt.",
		2, dest_class);
	st->in_flight = metric_gauge("wal_in_flight", "HTTP requests in flight.", 1, dest);
	st->open_records = metric_gauge("wal_open_records",
									"Consumed records not yet delivered or handed off.", 0, NULL);
	st->config_version = metric_gauge("wal_config_version",
									  "The published config version this worker follows.", 0, NULL);
	st->breaker_handoffs = metric_counter(
		"wal_breaker_open_handoffs_total",
		"Copies sent to retry step 1 without an attempt: the destination is paused.", 1, dest);
	st->lag = metric_gauge("wal_consumer_lag", "Records behind the partition's end.", 2,
						   (const char *const[]){"topic", "partition"});
}

/* ---------------------------------------------------------------- the role */

static bool
check_dedicated_destination(const worker_options *opts, const control_plane_config *config)
{
	const destination_config *d;

	if (opts->destination == NULL)
		return true;
	d = config_find_destination(config, opts->destination);
	if (d == NULL)
	{
		log_error("event=bad_destination destination=%s msg=\"no such destination in "
				  "wal_delivery.destinations\"",
				  opts->destination);
		return false;
	}
	if (!d->dedicated)
	{
		log_error("event=bad_destination destination=%s msg=\"not marked dedicated: shared "
				  "consumers serve it too; UPDATE wal_delivery.destinations SET dedicated = true\"",
				  opts->destination);
		return false;
	}
	return true;
}

/*
 * The consumer, in group "wal_delivery.shared" or "wal_delivery.dedicated.NAME", and the
 * hand-off producer; false (logged) when librdkafka refuses them.
 */
static bool
connect_kafka(consumer_state *st)
{
	char group[300];
	kafka_default defaults[] = {
		{"group.id", group},
		{"enable.auto.commit", "false"},
		{"enable.auto.offset.store", "false"},
		{"auto.offset.reset", "earliest"},
		{"client.id", "wal-worker-consume"},
	};
	role_kafka kafka = {defaults, (int) (sizeof(defaults) / sizeof(defaults[0])), on_rebalance,
						on_copy_handed_off, st};

	if (st->opts->destination)
		snprintf(group, sizeof(group), "wal_delivery.dedicated.%s", st->opts->destination);
	else
		snprintf(group, sizeof(group), "wal_delivery.shared");
	return role_connect_kafka(st->opts, st->watch, &kafka, &st->consumer, &st->handoff);
}

/*
 * From a librdkafka thread, when the consumer's queue gets records after being empty: ends
 * the loop's wait on the transfers, which otherwise held new records up to 20 ms while
 * requests were in flight (bench/end_to_end, destinations answering in 200 ms).
 */
static void
wake_on_records(rd_kafka_t *rk, void *arg)
{
	(void) rk;
	http_engine_wakeup(arg);
}

/* What the copies need: the HTTP engine, the dedupe set, the offset tracker, the pauses. */
static void
open_delivery_state(consumer_state *st)
{
	char holder[128];

	/* Not a fixed 256: that capped destinations with a larger max_in_flight (bench/end_to_end). */
	st->http = http_engine_new(http_engine_affordable_in_flight());
	http_engine_set_start_gate(st->http, consumer_may_start, st);
	st->records_queue = rd_kafka_queue_get_consumer(st->consumer);
	if (st->records_queue)
		rd_kafka_queue_cb_event_enable(st->records_queue, wake_on_records, st->http);
	st->dedupe =
		dedupe_new(DEDUPE_MAX_ENTRIES, config_watch_current(st->watch)->consumer_dedupe_ttl_ms);
	st->tracker = tracker_new();
	snprintf(holder, sizeof(holder), "consume:%d", (int) getpid());
	st->pauses = pause_state_new(st->opts, config_watch_current(st->watch), holder, false);
	st->stats = delivery_stats_start(st->opts->conninfo, st->opts->role);
}

/* Transfers running or queued and hand-offs not yet acknowledged: the loop must not sleep. */
static int
work_in_hand(consumer_state *st)
{
	return http_engine_in_flight(st->http, NULL) + http_engine_pending(st->http, NULL) +
		   handoff_pending(st->handoff);
}

/*
 * On the first stop request: stop fetching and give what is in flight ROLE_DRAIN_MS to
 * finish. True once every record is done or that time is up.
 */
static bool
drained_after_stop(consumer_state *st)
{
	if (role_drain_begins(&st->shutdown_deadline))
	{
		log_info("event=stopping open_records=%d", tracker_open_records(st->tracker));
		stop_fetching(st);
	}
	return role_drained(st->shutdown_deadline, tracker_open_records(st->tracker));
}

static bool
may_take_more(const consumer_state *st)
{
	return tracker_open_records(st->tracker) < MAX_OPEN_RECORDS &&
		   st->open_payload_bytes < MAX_OPEN_PAYLOAD_BYTES;
}

/*
 * Backpressure: with MAX_OPEN_RECORDS open (or MAX_OPEN_PAYLOAD_BYTES), take no more records
 * (librdkafka's prefetch is bounded: kafka_prefetch.c), but still poll once a second so rebalances
 * are served. Pausing the partitions instead would drop the prefetched records and fetch them again
 * on resume, which stalled delivery (bench/deliver). Otherwise up to POLL_BATCH records per turn,
 * so transfers move on once per batch. True when it took anything.
 */
static bool
take_records(consumer_state *st, int busy)
{
	bool saturated = !may_take_more(st);
	rd_kafka_message_t *rkm = NULL;
	bool got_any;

	/* The clock only matters while saturated: one read a turn, not two every turn. */
	if (!saturated || now_ms() >= st->next_forced_poll_ms)
	{
		rkm = rd_kafka_consumer_poll(st->consumer, busy ? 0 : 100);
		if (saturated)
			st->next_forced_poll_ms = now_ms() + 1000;
	}
	got_any = rkm != NULL;
	for (int n = 0; rkm; n++)
	{
		if (role_is_record(rkm))
			handle_record(st, rkm);
		rd_kafka_message_destroy(rkm);
		rkm = n + 1 < POLL_BATCH && may_take_more(st) ? rd_kafka_consumer_poll(st->consumer, 0)
													  : NULL;
	}
	return got_any;
}

/* Pauses set by the retry consumers, and a newly published config (dedupe TTL, topics). */
static void
follow_control_plane(consumer_state *st)
{
	pause_state_poll(st->pauses);
	if (config_watch_poll(st->watch))
	{
		dedupe_set_ttl(st->dedupe, config_watch_current(st->watch)->consumer_dedupe_ttl_ms);
		follow_subscriptions(st);
	}
}

/* Once a second: commit up to the low watermark of done records, then refresh the gauges. */
static void
commit_when_due(consumer_state *st)
{
	if (now_ms() < st->next_commit_ms)
		return;
	tracker_commit(st->tracker, st->consumer, false);
	update_gauges(st);
	st->next_commit_ms = now_ms() + COMMIT_INTERVAL_MS;
}

/* Abandons what did not finish (not committed, so it is consumed again), then commits. */
static void
shut_down(consumer_state *st)
{
	if (st->records_queue)
	{
		/* No wake-up may reach the engine once it is freed. */
		rd_kafka_queue_cb_event_enable(st->records_queue, NULL, NULL);
		rd_kafka_queue_destroy(st->records_queue);
	}
	http_engine_free(st->http);
	st->http = NULL; /* the revoke that closing the consumer brings must not use it */
	tracker_commit(st->tracker, st->consumer, true);
	role_close_consumer(st->consumer);
	handoff_producer_free(st->handoff);
	if (st->admin)
		admin_server_stop(st->admin);
	log_info("event=stopped open_records=%d", tracker_open_records(st->tracker));
	tracker_free(st->tracker);
	dedupe_free(st->dedupe);
	pause_state_free(st->pauses);
	delivery_stats_stop(st->stats);
	config_watch_stop(st->watch);
}

int
run_consume(const worker_options *opts)
{
	consumer_state st = {.opts = opts};

	stop_on_signals();
	register_metrics(&st);
	/* The config comes first: it names the brokers, the destinations and their topics. */
	st.watch = config_watch_start(opts, &stop_requested);
	if (st.watch == NULL)
		return stop_requested ? 0 : 1;
	if (!check_dedicated_destination(opts, config_watch_current(st.watch)))
		return 2;
	if (!role_start_admin(opts, &(admin_handlers){consumer_ready, consumer_config_json, &st},
						  &st.admin))
		return 1;
	if (!connect_kafka(&st))
		return 1;
	open_delivery_state(&st);
	follow_subscriptions(&st);
	log_info("event=started mode=%s config_version=%" PRId64,
			 opts->destination ? opts->destination : "shared",
			 config_watch_current(st.watch)->version);

	while (!drained_after_stop(&st))
	{
		int busy = work_in_hand(&st);
		bool got_any = take_records(&st, busy);

		sd_notify_loop();

		/* Wait on the transfers only when they are all there is: Kafka had nothing. */
		http_engine_poll(st.http, busy && !got_any ? 20 : 0);
		handoff_poll(st.handoff);
		follow_control_plane(&st);
		commit_when_due(&st);
	}

	shut_down(&st);
	return 0;
}
