/*
 * relay.c: the background workers that ship the outbox to Kafka: their loop and state.
 *
 * Each relay runs passes. A pass is one transaction that claims and ships a batch of the
 * row table (relay_rows.c) and the next batch of each lane of the log the relay owns
 * (relay_lanes.c), produces them, waits for every delivery report, and marks what Kafka
 * persisted; a crash at any point sends the batch again (at least once). Between passes
 * the relay waits: until a commit wakes it (relay_wakeup.c), for its idle interval, or for
 * its backoff while Kafka takes nothing. Relay 0 also runs other parts' periodic tasks
 * (maintenance.c).
 *
 * Words: "backoff" is how long the relay waits after a pass that shipped nothing because
 * Kafka took nothing; the relay's state (shipping, Kafka unreachable, ...) is logged once
 * per change, so an outage is one line, not one per pass.
 */
#include "postgres.h"

#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/guc.h"
#include "utils/timestamp.h"

#include "failing_topics.h"
#include "kafka_inflight.h"
#include "kafka_producer.h"
#include "maintenance.h"
#include "otlp_sender.h"
#include "relay.h"
#include "relay_lanes.h"
#include "relay_rows.h"
#include "worker_spi.h"
#include "relay_wakeup.h"
#include "settings.h"

typedef enum
{
	RELAY_SHIPPING,
	RELAY_KAFKA_DOWN,
	RELAY_NOT_CONFIGURED,
	RELAY_NO_EXTENSION,
	RELAY_KAFKA_REFUSING
} RelayState;

static RelayState relay_state = RELAY_SHIPPING;

/*
 * Whether the next pass reads everything (the row table's claim and every lane the relay
 * owns) rather than only what the commits that woke it marked, and when a busy relay,
 * woken by commits all the time, reads everything anyway: rows also become ready with
 * time (a retry's backoff ends), which no commit marks.
 */
static bool read_all_next = true;
static TimestampTz next_full_pass = 0;

/* When the last pass ended: a commit that comes sooner than relay_linger after it waits. */
static TimestampTz last_pass_end = 0;

/* Logs only when the state changes, so an outage is one line, not one per pass. */
static void
enter_state(RelayState state, const char *detail)
{
	static const char *const names[] = {"shipping", "Kafka unreachable", "not configured",
										"extension not installed", "Kafka does not take records"};

	if (state == relay_state)
		return;
	ereport(LOG, (errmsg("wal_delivery relay: %s", names[state]),
				  detail ? errdetail_internal("%s", detail) : 0));
	relay_state = state;
}

/*
 * What the next pass reads, as marks (relay_wakeup.h): everything, or what the commits
 * since the last pass wrote. Taken before the pass's snapshot, so those commits are in it.
 */
static uint32
marks_to_read(int slot)
{
	uint32 marks = relay_wakeup_take_marks(slot);
	TimestampTz now = GetCurrentTimestamp();

	if (!read_all_next && now < next_full_pass)
		return marks;
	read_all_next = false;
	next_full_pass = TimestampTzPlusMilliseconds(now, relay_idle_interval_ms);
	return ~0u;
}

/*
 * One pass: the row table's claim, then the log's lanes, in one transaction. A pass that
 * has nothing to read (a wake-up for another relay's lanes, a signal) is skipped.
 */
static void
run_pass(int slot, PassResult *result)
{
	uint32 marks = marks_to_read(slot);

	memset(result, 0, sizeof(*result));
	if (marks == 0)
		return;
	failing_topics_new_pass();
	if (!worker_xact_begin_in_extension("wal_delivery relay: claiming"))
		result->extension_missing = true;
	else
	{
		if (marks & RELAY_MARK_ROWS)
			ship_claimed_rows(result);
		ship_log(slot, marks, result);
	}
	worker_xact_end();
	/* Frees the pass's deliveries, except those in flight (kafka_inflight.h). */
	kafka_inflight_pass_done();
	last_pass_end = GetCurrentTimestamp();
	/* What is left to do (a full batch, records Kafka did not take) no commit will mark. */
	read_all_next = result->more_waiting || result->deferred > 0 || any_failing_topics();
}

static bool
ensure_producers(void)
{
	char errbuf[512];

	if (kafka_producers_exist())
		return true;
	if (kafka_bootstrap_servers == NULL || kafka_bootstrap_servers[0] == '\0')
	{
		enter_state(RELAY_NOT_CONFIGURED,
					"Set wal_delivery.kafka_bootstrap_servers and reload the configuration.");
		return false;
	}
	if (!kafka_producers_create(kafka_bootstrap_servers, kafka_properties,
								relay_delivery_timeout_ms, errbuf, sizeof(errbuf)))
	{
		enter_state(RELAY_NOT_CONFIGURED, errbuf);
		return false;
	}
	return true;
}

/* Span export follows wal_delivery.otlp_endpoint; reports keep their details only for it. */
static void
configure_spans(void)
{
	otlp_sender_configure(otlp_endpoint);
	kafka_report_details = otlp_sender_enabled;
}

/* SIGHUP: read the settings again. */
static void
reload_settings_if_asked(void)
{
	if (!ConfigReloadPending)
		return;
	ConfigReloadPending = false;
	ProcessConfigFile(PGC_SIGHUP);
	configure_spans();
	/* Kafka settings may have changed: build the producers again. */
	kafka_producers_destroy(relay_shutdown_flush_ms);
	read_all_next = true;
}

/*
 * What a pass says about Kafka: logs the state it shows (once per change, with the
 * reason), moves the backoff, and returns how long to wait before the next pass (idle_ms
 * when nothing says otherwise). Only a pass that stored something says "shipping".
 */
static int
wait_after_pass(const PassResult *pass, int *backoff_ms, int idle_ms)
{
	int topic_retry_ms = ms_until_next_topic_retry();

	if (pass->extension_missing)
	{
		enter_state(RELAY_NO_EXTENSION, "Run CREATE EXTENSION wal_delivery.");
		return idle_ms;
	}
	if (pass->deferred > 0 && pass->stored == 0)
	{
		/* Said once: timeouts and refusals take turns while brokers are down. */
		if (relay_state != RELAY_KAFKA_DOWN && relay_state != RELAY_KAFKA_REFUSING)
			enter_state(
				pass->kafka_down ? RELAY_KAFKA_DOWN : RELAY_KAFKA_REFUSING,
				psprintf("%s; the records wait in the outbox and are tried again.", pass->reason));
		*backoff_ms = *backoff_ms ? Min(*backoff_ms * 2, relay_max_backoff_ms) : 1000;
		return *backoff_ms;
	}
	if (pass->stored > 0)
	{
		enter_state(RELAY_SHIPPING, NULL);
		*backoff_ms = 0;
	}
	if (pass->more_waiting)
		return 0;
	if (topic_retry_ms >= 0 && topic_retry_ms < idle_ms)
		return topic_retry_ms;
	return idle_ms;
}

/*
 * One pass, unless there are no producers or, while backing off, Kafka does not answer.
 * Returns how long to wait before the next one.
 */
static int
ship_once(int slot, PassResult *pass, int *backoff_ms, int idle_ms)
{
	char fatal[512];

	if (!ensure_producers())
		return idle_ms;
	if (*backoff_ms > 0 && !kafka_reachable(Min(*backoff_ms, 5000)))
	{
		enter_state(RELAY_KAFKA_DOWN, "Records wait in the outbox until Kafka answers.");
		*backoff_ms = Min(*backoff_ms * 2, relay_max_backoff_ms);
		return *backoff_ms;
	}
	run_pass(slot, pass);
	if (kafka_producers_failed(fatal, sizeof(fatal)))
	{
		/* Unmarked rows are sent again by the new producers (at least once). */
		ereport(LOG, (errmsg("wal_delivery relay: librdkafka fatal error, creating new producers"),
					  errdetail_internal("%s", fatal)));
		kafka_producers_destroy(0);
	}
	return wait_after_pass(pass, backoff_ms, idle_ms);
}

/* Relay 0's periodic tasks, every maintenance_interval; not while the extension is missing. */
static void
maintain_when_due(int slot, const PassResult *pass, TimestampTz *next_maintenance)
{
	if (slot == 0 && GetCurrentTimestamp() >= *next_maintenance && !pass->extension_missing)
	{
		run_maintenance();
		*next_maintenance =
			TimestampTzPlusMilliseconds(GetCurrentTimestamp(), maintenance_interval_ms);
	}
}

/*
 * Sleeps up to wait_ms; a commit's wal_enqueue (relay_wakeup) or a signal ends it early.
 * A wait that ran out (the idle interval, a backoff, a failing topic's retry time) is
 * followed by a pass that reads everything. While spans wait to be exported the sleep is
 * cut into slices that drive the export (otlp_sender.h), so a request goes on while the
 * relay is idle; only the whole wait running out counts as running out.
 */
static bool
wait_for_work(int wait_ms)
{
	TimestampTz end = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), wait_ms);
	bool woken = false;

	while (wait_ms > 0)
	{
		int export_ms = otlp_sender_drive();
		int slice = export_ms >= 0 && export_ms < wait_ms ? Max(export_ms, 1) : wait_ms;
		int rc = WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, slice,
						   PG_WAIT_EXTENSION);

		ResetLatch(MyLatch);
		if (rc & WL_LATCH_SET)
		{
			woken = true;
			break;
		}
		wait_ms = (int) Max(0, (end - GetCurrentTimestamp()) / 1000);
		if (wait_ms == 0)
			read_all_next = true;
		CHECK_FOR_INTERRUPTS();
		if (ShutdownRequestPending || ConfigReloadPending)
			break;
	}
	otlp_sender_drive();
	CHECK_FOR_INTERRUPTS();
	return woken;
}

/*
 * Coalescing: a relay woken by a commit less than relay_linger after its last pass ended
 * waits out the rest of that time, so the commits that come meanwhile share its next pass
 * and produce request instead of each paying for its own. Commits that come often get
 * passes at most every relay_linger plus a pass's length; a commit after a quiet spell
 * ships at once. It does not listen meanwhile: the commits that come leave only their
 * marks, which the pass takes, so none of them waits any longer.
 */
static void
linger_after_wakeup(void)
{
	TimestampTz until = TimestampTzPlusMilliseconds(last_pass_end, relay_linger_ms);

	for (;;)
	{
		long ms = (long) ((until - GetCurrentTimestamp()) / 1000);

		if (ms <= 0 || ShutdownRequestPending || ConfigReloadPending)
			break;
		(void) WaitLatch(MyLatch, WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, ms, PG_WAIT_EXTENSION);
		CHECK_FOR_INTERRUPTS();
	}
	/* A latch set before listening stopped: its commit's mark is the coming pass's. */
	ResetLatch(MyLatch);
}

/*
 * The log is never analyzed (autovacuum is off on it), and a stale estimate must not turn
 * a lane's batch into a scan and sort of the whole log: the relay's queries walk indexes
 * whatever the statistics say.
 *
 * And no JIT. A plan that keeps a disabled node (a seq scan of a small table such as
 * topics or outbox_generations, a sort) costs 1e10 more per node, far above every
 * jit_*_above_cost, so each such statement was compiled, inlined and optimized by LLVM on
 * every execution, and relay 0's maintenance, which runs several, held up shipping for
 * that long every maintenance_interval: the log outbox's latency tail (bench/relay_latency).
 * The relay's statements are all short; none gains from JIT.
 */
static void
set_planner_options(void)
{
	SetConfigOption("enable_seqscan", "off", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("enable_bitmapscan", "off", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("enable_sort", "off", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("jit", "off", PGC_SUSET, PGC_S_OVERRIDE);
}

void
wal_delivery_relay_main(Datum main_arg)
{
	int slot = DatumGetInt32(main_arg);
	int backoff_ms = 0;
	TimestampTz next_maintenance = 0;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	BackgroundWorkerUnblockSignals();
	worker_connect();
	relay_wakeup_register_latch(slot, MyLatch);
	set_planner_options();
	configure_spans();
	ereport(LOG, (errmsg("wal_delivery relay %d started on database \"%s\"", slot,
						 wal_delivery_database)));

	while (!ShutdownRequestPending)
	{
		PassResult pass = {0};
		/* Read before a reload: a new idle interval applies from the next turn. */
		int idle_ms = relay_idle_interval_ms;
		int wait_ms;
		bool listening;
		bool woken;

		reload_settings_if_asked();
		wait_ms = ship_once(slot, &pass, &backoff_ms, idle_ms);
		maintain_when_due(slot, &pass, &next_maintenance);
		/*
		 * A relay that cannot ship (no Kafka settings, no extension) is not woken by
		 * commits: a reload or the idle interval ends its wait. One that can listens only
		 * while it waits: the commits made during its pass and linger left their marks
		 * (relay_wakeup_marks_pending), so it goes on without sleeping, and those commits
		 * paid no latch set, no spinlock and no signal (bench/enqueue --shipping). Not
		 * while backing off: marks a pass that did not run left would cut every backoff
		 * short; there a commit made while it listens wakes it, as before.
		 */
		listening = kafka_producers_exist() && !pass.extension_missing;
		relay_wakeup_listen(slot, listening);
		woken = wait_ms > 0 && listening && backoff_ms == 0 && relay_wakeup_marks_pending(slot);
		if (!woken)
			woken = wait_for_work(wait_ms);
		relay_wakeup_listen(slot, false);
		if (woken && relay_linger_ms > 0)
			linger_after_wakeup();
	}

	kafka_producers_destroy(relay_shutdown_flush_ms);
	otlp_sender_discard();
	ereport(LOG, (errmsg("wal_delivery relay %d stopped", slot)));
	/* Exit code 1: if this was pg_terminate_backend or DROP DATABASE (FORCE), come back. */
	proc_exit(1);
}
