/*
 * ingest_kafka.c: the direct path (see ingest_kafka.h).
 *
 * One thread serves both producers' delivery reports and walks the deadline list: records
 * in the order they were produced, so their deadlines are in order too, and only the head
 * is ever due.
 *
 * The same thread replaces a producer that can no longer produce: the idempotent producer
 * after a fatal error (rd_kafka_fatal_error: every produce fails from then on), and both
 * when the control plane's bootstrap servers change. Meanwhile Kafka counts as down, so
 * records go to the outbox. The old producer's messages get their delivery reports before
 * it is destroyed: those Kafka stored settle 201, the others fall back to the outbox, so
 * no record answered 2xx depends on a producer that is gone. Submitters hold
 * producers_lock (read) while they produce; the swap takes it for writing.
 */
#include "ingest_kafka.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "common/clock.h"
#include "common/fatal_error_hook.h"
#include "common/kafka_conf.h"
#include "common/log.h"
#include "ingest/ingest_metrics.h"
#include "ingest/ingest_outbox.h"

#define PROBE_INTERVAL_MS 500
#define POLL_MS           5
#define REPLACE_RETRY_MS  1000 /* after a producer could not be made */

/* The relay's limit: the broker, which knows each topic's limit, judges every record. */
#define MESSAGE_MAX_BYTES "101048576"

static rd_kafka_t *producer_all;    /* acks=all, idempotent */
static rd_kafka_t *producer_leader; /* acks=1 */
static pthread_rwlock_t producers_lock = PTHREAD_RWLOCK_INITIALIZER;
static const worker_options *options;
static int deadline;
static atomic_bool fatal_seen;  /* the idempotent producer failed fatally: replace it */
static int64_t next_replace_ms; /* poller's: no new producer tried before then */

/* The bootstrap servers the producers use (poller's) and the configuration's latest. */
static char *bootstrap_used;
static struct
{
	pthread_mutex_t lock;
	char *servers;
	bool changed;
} bootstrap_wanted = {PTHREAD_MUTEX_INITIALIZER, NULL, false};
static pthread_t poller;
static atomic_bool stopping;
static atomic_bool kafka_down;
static _Atomic int64_t next_probe_ms;

static struct
{
	pthread_mutex_t lock;
	ingest_record *head;
	ingest_record *tail;
} inflight = {PTHREAD_MUTEX_INITIALIZER, NULL, NULL};

bool
ingest_kafka_up(void)
{
	return !atomic_load(&kafka_down);
}

static void
set_down(const char *why)
{
	if (!atomic_exchange(&kafka_down, true))
	{
		metric_set(ingest_m.kafka_up, 0, NULL);
		log_warn("event=kafka_down reason=\"%s\" msg=\"records go to the outbox; one probe "
				 "record every %d ms tries Kafka again\"",
				 why, PROBE_INTERVAL_MS);
	}
	atomic_store(&next_probe_ms, now_ms() + PROBE_INTERVAL_MS);
}

static void
set_up(void)
{
	if (atomic_exchange(&kafka_down, false))
	{
		metric_set(ingest_m.kafka_up, 1, NULL);
		log_info("event=kafka_up msg=\"records go to Kafka again\"");
	}
}

/* Hands a record Kafka did not take to the outbox, if nobody settled it yet. */
static void
fall_back(ingest_record *r, const char *reason)
{
	int expected = ROUTE_KAFKA;

	if (atomic_compare_exchange_strong(&r->route, &expected, ROUTE_OUTBOX))
		ingest_outbox_submit(r, reason);
}

/* Errors that belong to one record, not to Kafka's health. */
static bool
is_record_error(rd_kafka_resp_err_t err)
{
	return err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE ||
		   err == RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE || err == RD_KAFKA_RESP_ERR_INVALID_RECORD ||
		   err == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC ||
		   err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART;
}

static int
report_of(const rd_kafka_message_t *m)
{
	if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR)
		return KAFKA_REPORT_STORED;
	return rd_kafka_message_status(m) == RD_KAFKA_MSG_STATUS_NOT_PERSISTED
			   ? KAFKA_REPORT_NOT_STORED
			   : KAFKA_REPORT_MAYBE_STORED;
}

static void
settle_stored(ingest_record *r, int32_t partition, int64_t offset)
{
	const char *labels[] = {"kafka"};

	metric_add(ingest_m.records, 1, labels);
	ingest_record_settle_kafka(r, partition, offset);
}

void
ingest_kafka_outbox_failed(ingest_record *r, int status, const char *code, const char *message)
{
	int report = atomic_load(&r->kafka_report);

	if (!r->kafka_copy || report == KAFKA_REPORT_NOT_STORED)
	{
		const char *labels[] = {code};

		metric_add(ingest_m.failed_records, 1, labels);
		ingest_record_settle_failed(r, status, code, message);
		return;
	}
	if (report == KAFKA_REPORT_STORED)
	{
		/* The report came while the outbox had the record: Kafka's answer stands. */
		atomic_store(&r->route, ROUTE_SETTLED);
		settle_stored(r, r->partition, r->offset);
		return;
	}
	{
		const char *labels[] = {"outcome_unknown"};
		char why[1024];

		snprintf(why, sizeof(why),
				 "Kafka has not said whether it stored the record and the outbox could not take "
				 "it (%s); it may or may not be durable: send it again with the same "
				 "Idempotency-Key (a copy stored twice has one key, which destinations dedupe)",
				 message);
		metric_add(ingest_m.failed_records, 1, labels);
		ingest_record_settle_failed(r, 504, "outcome_unknown", why);
	}
}

static void
on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
	ingest_record *r = m->_private;
	int expected = ROUTE_KAFKA;
	int report = report_of(m);

	(void) rk;
	(void) opaque;
	/*
	 * The report is published first (the place with it), so that an outbox writer that
	 * fails the record from here on answers by it (ingest_kafka_outbox_failed).
	 */
	if (report == KAFKA_REPORT_STORED)
	{
		r->partition = m->partition;
		r->offset = m->offset;
	}
	atomic_store(&r->kafka_report, report);
	if (report == KAFKA_REPORT_STORED)
	{
		set_up();
		if (atomic_compare_exchange_strong(&r->route, &expected, ROUTE_SETTLED))
			settle_stored(r, m->partition, m->offset);
		else
			metric_add(ingest_m.late_acks, 1, NULL); /* the outbox has it too */
	}
	else
	{
		if (!is_record_error(m->err))
			set_down(rd_kafka_err2str(m->err));
		fall_back(r, rd_kafka_err2name(m->err));
	}
	ingest_record_release(r); /* librdkafka's reference */
}

static void
on_error(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	(void) opaque;
	if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN)
		set_down("all brokers down");
	if (err == RD_KAFKA_RESP_ERR__FATAL) /* only idempotence raises one: producer_all */
	{
		atomic_store(&fatal_seen, true);
		set_down("the idempotent producer failed fatally");
	}
	log_warn("event=kafka_error client=%s code=%s error=\"%s\"", rd_kafka_name(rk),
			 rd_kafka_err2name((rd_kafka_resp_err_t) err), reason);
}

static rd_kafka_t *
make_producer(const worker_options *opts, const char *bootstrap, bool idempotent, char *errbuf,
			  size_t errbuf_size)
{
	char timeout[32];
	kafka_default defaults[] = {
		{"client.id", idempotent ? "wal_delivery_ingest" : "wal_delivery_ingest_acks1"},
		{"enable.idempotence", idempotent ? "true" : "false"},
		{"acks", idempotent ? "all" : "1"},
		{"message.max.bytes", MESSAGE_MAX_BYTES},
		{"linger.ms", "2"},
		/* Topics are the reconciler's to make: a record never creates one by its name. */
		{"allow.auto.create.topics", "false"},
		/*
		 * Past the deadline the outbox has the record; Kafka may still deliver its copy
		 * (a duplicate) until this runs out, then the copy is dropped.
		 */
		{"message.timeout.ms", timeout},
	};
	rd_kafka_conf_t *conf;
	rd_kafka_t *rk;

	snprintf(timeout, sizeof(timeout), "%d", deadline * 5 > 10000 ? deadline * 5 : 10000);
	conf = kafka_conf_build(defaults, sizeof(defaults) / sizeof(defaults[0]), bootstrap, opts,
							errbuf, errbuf_size);
	if (conf == NULL)
		return NULL;
	rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
	rd_kafka_conf_set_error_cb(conf, on_error);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errbuf, errbuf_size);
	if (rk == NULL)
		rd_kafka_conf_destroy(conf); /* rd_kafka_new frees it only on success */
	return rk;
}

static void
inflight_push(ingest_record *r)
{
	ingest_record_ref(r);
	r->next_inflight = NULL;
	pthread_mutex_lock(&inflight.lock);
	if (inflight.tail)
		inflight.tail->next_inflight = r;
	else
		inflight.head = r;
	inflight.tail = r;
	pthread_mutex_unlock(&inflight.lock);
}

/* Drops settled records from the head; falls back the ones whose deadline passed. */
static void
sweep_deadlines(void)
{
	int64_t now = now_ms();

	for (;;)
	{
		ingest_record *r;
		bool due;

		pthread_mutex_lock(&inflight.lock);
		r = inflight.head;
		if (r == NULL)
		{
			pthread_mutex_unlock(&inflight.lock);
			return;
		}
		due = r->deadline_ms <= now;
		if (!due && atomic_load(&r->route) == ROUTE_KAFKA)
		{
			pthread_mutex_unlock(&inflight.lock);
			return;
		}
		inflight.head = r->next_inflight;
		if (inflight.head == NULL)
			inflight.tail = NULL;
		pthread_mutex_unlock(&inflight.lock);
		if (atomic_load(&r->route) == ROUTE_KAFKA)
		{
			set_down("no acknowledgement within the deadline");
			fall_back(r, "deadline");
		}
		ingest_record_release(r); /* the list's reference */
	}
}

/*
 * Lets the old producer report every message (stored: 201; failed or purged: the outbox),
 * then destroys it. Messages a fatal error left can never be stored: they are purged at
 * once; otherwise the old producer has the deadline to finish them.
 */
static void
retire_producer(rd_kafka_t *old, bool fatal)
{
	if (!fatal)
		rd_kafka_flush(old, deadline);
	rd_kafka_purge(old, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
	rd_kafka_flush(old, 2000);
	rd_kafka_destroy(old);
}

/* Replaces *slot with a new producer; false (the old one kept) when it cannot be made. */
static bool
replace_producer(rd_kafka_t **slot, bool idempotent, const char *bootstrap, bool fatal,
				 const char *reason)
{
	char errbuf[512];
	rd_kafka_t *fresh = make_producer(options, bootstrap, idempotent, errbuf, sizeof(errbuf));
	rd_kafka_t *old;
	const char *labels[] = {reason};

	if (fresh == NULL)
	{
		log_error("event=kafka_producer_recreate_failed reason=%s error=\"%s\" retry_ms=%d", reason,
				  errbuf, REPLACE_RETRY_MS);
		next_replace_ms = now_ms() + REPLACE_RETRY_MS;
		return false;
	}
	pthread_rwlock_wrlock(&producers_lock);
	old = *slot;
	*slot = fresh;
	pthread_rwlock_unlock(&producers_lock);
	retire_producer(old, fatal);
	metric_add(ingest_m.producer_restarts, 1, labels);
	log_info("event=kafka_producer_recreated client=%s reason=%s", rd_kafka_name(fresh), reason);
	return true;
}

static void
replace_after_fatal_error(void)
{
	char why[512];
	rd_kafka_resp_err_t err = rd_kafka_fatal_error(producer_all, why, sizeof(why));

	log_error("event=kafka_producer_fatal code=%s error=\"%s\" msg=\"records go to the outbox "
			  "until a new producer is made\"",
			  rd_kafka_err2name(err), why);
	set_down("the idempotent producer failed fatally");
	if (replace_producer(&producer_all, true, bootstrap_used, true, "fatal_error"))
		atomic_store(&fatal_seen, false);
}

static void
follow_bootstrap(void)
{
	char *servers = NULL;
	bool changed;

	if (now_ms() < next_replace_ms)
		return;
	pthread_mutex_lock(&bootstrap_wanted.lock);
	changed = bootstrap_wanted.changed;
	if (changed)
		servers = bootstrap_wanted.servers ? strdup(bootstrap_wanted.servers) : NULL;
	bootstrap_wanted.changed = false;
	pthread_mutex_unlock(&bootstrap_wanted.lock);
	if (!changed)
		return;
	log_info("event=kafka_bootstrap_changed servers=\"%s\"", servers ? servers : "");
	if (replace_producer(&producer_all, true, servers, false, "bootstrap_changed") &&
		replace_producer(&producer_leader, false, servers, false, "bootstrap_changed"))
	{
		free(bootstrap_used);
		bootstrap_used = servers;
		atomic_store(&fatal_seen, false); /* a fatal error of the old producer is gone too */
		return;
	}
	/* Tried again later, unless the configuration changed again meanwhile. */
	free(servers);
	pthread_mutex_lock(&bootstrap_wanted.lock);
	bootstrap_wanted.changed = true;
	pthread_mutex_unlock(&bootstrap_wanted.lock);
}

static void *
poller_main(void *arg)
{
	(void) arg;
	while (!atomic_load(&stopping))
	{
		rd_kafka_poll(producer_all, POLL_MS);
		rd_kafka_poll(producer_leader, 0);
		sweep_deadlines();
		fatal_error_hook_poll(producer_all);
		follow_bootstrap();
		if (atomic_load(&fatal_seen) && now_ms() >= next_replace_ms)
			replace_after_fatal_error();
	}
	return NULL;
}

void
ingest_kafka_set_bootstrap(const char *servers)
{
	pthread_mutex_lock(&bootstrap_wanted.lock);
	if ((servers == NULL) != (bootstrap_wanted.servers == NULL) ||
		(servers && strcmp(servers, bootstrap_wanted.servers) != 0))
	{
		free(bootstrap_wanted.servers);
		bootstrap_wanted.servers = servers ? strdup(servers) : NULL;
		bootstrap_wanted.changed = true;
	}
	pthread_mutex_unlock(&bootstrap_wanted.lock);
}

/* While Kafka is down, one record per interval is let through to find out. */
static bool
take_probe_slot(void)
{
	int64_t due = atomic_load(&next_probe_ms);
	int64_t now = now_ms();

	return now >= due &&
		   atomic_compare_exchange_strong(&next_probe_ms, &due, now + PROBE_INTERVAL_MS);
}

void
ingest_kafka_submit(ingest_record *r)
{
	rd_kafka_headers_t *hdrs;
	rd_kafka_resp_err_t err;

#ifdef INGEST_BENCH_HTTP_CEILING
	/*
	 * bench/ingest builds a second binary with this defined: every record is answered 201
	 * at once and nothing is produced, which measures the HTTP server alone (its ceiling).
	 * Never defined in the real build.
	 */
	atomic_store(&r->route, ROUTE_SETTLED);
	ingest_record_settle_kafka(r, 0, 0);
	return;
#endif
	if (atomic_load(&kafka_down) && !take_probe_slot())
	{
		atomic_store(&r->route, ROUTE_OUTBOX);
		ingest_outbox_submit(r, "kafka_down");
		return;
	}
	hdrs = rd_kafka_headers_new(5 + r->n_headers);
	rd_kafka_header_add(hdrs, "idempotency-key", -1, r->idempotency_key, -1);
	rd_kafka_header_add(hdrs, "source-topic", -1, r->topic, -1);
	rd_kafka_header_add(hdrs, "content-type", -1, r->content_type, -1);
	rd_kafka_header_add(hdrs, "created-at", -1, r->created_at, -1);
	for (int i = 0; i < r->n_headers; i++)
		rd_kafka_header_add(hdrs, r->header_names[i], -1, r->header_values[i], -1);

	r->deadline_ms = now_ms() + deadline;
	r->kafka_copy = true;
	ingest_record_ref(r); /* librdkafka's, dropped in on_delivery */
	inflight_push(r);
	pthread_rwlock_rdlock(&producers_lock);
	err = rd_kafka_producev(
		r->acks == 1 ? producer_leader : producer_all, RD_KAFKA_V_TOPIC(r->topic),
		RD_KAFKA_V_VALUE(r->payload, r->payload_len),
		RD_KAFKA_V_KEY(r->message_key, r->message_key ? strlen(r->message_key) : 0),
		RD_KAFKA_V_HEADERS(hdrs), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_OPAQUE(r),
		RD_KAFKA_V_END);
	pthread_rwlock_unlock(&producers_lock);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		rd_kafka_headers_destroy(hdrs); /* not taken over on failure */
		r->kafka_copy = false;          /* and no report will come */
		if (err == RD_KAFKA_RESP_ERR__FATAL)
		{
			atomic_store(&fatal_seen, true);
			set_down("the idempotent producer failed fatally");
		}
		fall_back(r, err == RD_KAFKA_RESP_ERR__QUEUE_FULL ? "queue_full" : rd_kafka_err2name(err));
		ingest_record_release(r); /* librdkafka never took it */
	}
}

bool
ingest_kafka_start(const worker_options *opts, const char *bootstrap, int deadline_ms, char *errbuf,
				   size_t errbuf_size)
{
	deadline = deadline_ms;
	options = opts;
	bootstrap_used = bootstrap ? strdup(bootstrap) : NULL;
	ingest_kafka_set_bootstrap(bootstrap);
	pthread_mutex_lock(&bootstrap_wanted.lock);
	bootstrap_wanted.changed = false; /* the producers below use it */
	pthread_mutex_unlock(&bootstrap_wanted.lock);
	producer_all = make_producer(opts, bootstrap, true, errbuf, errbuf_size);
	if (producer_all == NULL)
		return false;
	producer_leader = make_producer(opts, bootstrap, false, errbuf, errbuf_size);
	if (producer_leader == NULL)
	{
		rd_kafka_destroy(producer_all);
		return false;
	}
	metric_set(ingest_m.kafka_up, 1, NULL);
	if (pthread_create(&poller, NULL, poller_main, NULL) != 0)
		fatal("event=thread_failed what=kafka_poller");
	return true;
}

void
ingest_kafka_stop(void)
{
	int64_t until = now_ms() + deadline;

	/* Every record settles by its deadline at the latest; the poller still runs for it. */
	while (now_ms() < until)
	{
		pthread_mutex_lock(&inflight.lock);
		bool empty = inflight.head == NULL;
		pthread_mutex_unlock(&inflight.lock);
		if (empty)
			break;
		usleep(10 * 1000);
	}
	atomic_store(&stopping, true);
	pthread_join(poller, NULL);
	sweep_deadlines();
	rd_kafka_purge(producer_all, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
	rd_kafka_purge(producer_leader, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
	rd_kafka_flush(producer_all, 2000);
	rd_kafka_flush(producer_leader, 2000);
	rd_kafka_destroy(producer_all);
	rd_kafka_destroy(producer_leader);
}
