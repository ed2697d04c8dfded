/*
 * reconcile.c: the background worker that makes Kafka match the control plane.
 *
 * A round reads the topics the configuration asks for (wal_delivery.desired_kafka_topics:
 * main topics, the retry steps, the DLQ), then, outside any transaction, creates the
 * missing ones, adds partitions where fewer exist, and sets the settings the system owns
 * (retention.ms, min.insync.replicas, max.message.bytes), keeping every other override a
 * topic has. It records each topic's outcome in wal_delivery.kafka_topics, which publishes
 * the config version workers follow once the retry steps and the DLQ exist; a main topic
 * Kafka cannot create holds only its own records. A round runs when the config version
 * moves past the published one, and every reconcile_interval anyway (a topic deleted
 * behind our back comes back).
 *
 * Words: "desired" is what the configuration asks for; "exists" means Kafka has the
 * topic (records can be shipped to it); "ready" means it has it with every setting.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/json.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "reconcile.h"
#include "reconcile_topics.h"
#include "settings.h"
#include "worker_spi.h"

/* How often the loop looks for a new config version. */
static const int reconcile_poll_ms = 1000;

/* What the loop remembers from one round to the next. */
typedef struct ReconcileState
{
	TimestampTz next_full_check; /* a round runs then even without a new version */
	int64 last_attempted_version;
	int64 last_matched_version;
	int failures; /* rounds in a row that left a topic not ready */
} ReconcileState;

static DesiredTopic *
read_desired_topics(int *count, int64 *version, bool *due)
{
	DesiredTopic *topics = NULL;
	MemoryContext caller = CurrentMemoryContext;

	*count = 0;
	*due = false;
	if (worker_xact_begin_in_extension("wal_delivery reconciler: reading config") &&
		SPI_execute("SELECT version, published_version FROM wal_delivery.config_version", true,
					1) == SPI_OK_SELECT &&
		SPI_processed == 1)
	{
		bool isnull;
		int64 published;

		*version =
			DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
		published =
			DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
		*due = *version > published;

		if (SPI_execute("SELECT topic, role, partitions, replication_factor, min_insync_replicas,"
						" retention_ms, max_message_bytes, managed"
						" FROM wal_delivery.desired_kafka_topics()"
						" ORDER BY topic",
						true, 0) == SPI_OK_SELECT)
		{
			MemoryContext spi = MemoryContextSwitchTo(caller);

			*count = (int) SPI_processed;
			topics = palloc0(sizeof(DesiredTopic) * Max(*count, 1));
			for (int i = 0; i < *count; i++)
			{
				HeapTuple tup = SPI_tuptable->vals[i];
				TupleDesc desc = SPI_tuptable->tupdesc;

				topics[i].name = SPI_getvalue(tup, desc, 1);
				topics[i].role = SPI_getvalue(tup, desc, 2);
				topics[i].partitions = DatumGetInt32(SPI_getbinval(tup, desc, 3, &isnull));
				topics[i].replication_factor = DatumGetInt16(SPI_getbinval(tup, desc, 4, &isnull));
				topics[i].min_insync_replicas = DatumGetInt16(SPI_getbinval(tup, desc, 5, &isnull));
				topics[i].retention_ms = DatumGetInt64(SPI_getbinval(tup, desc, 6, &isnull));
				topics[i].max_message_bytes = DatumGetInt32(SPI_getbinval(tup, desc, 7, &isnull));
				topics[i].managed = DatumGetBool(SPI_getbinval(tup, desc, 8, &isnull));
				topics[i].kafka_max_message_bytes = -1;
				topics[i].owned_values[0] = psprintf(INT64_FORMAT, topics[i].retention_ms);
				topics[i].owned_values[1] = psprintf("%d", topics[i].min_insync_replicas);
				topics[i].owned_values[2] = psprintf("%d", topics[i].max_message_bytes);
				topics[i].exists = -1;
			}
			MemoryContextSwitchTo(spi);
		}
	}
	else
		*version = -1;

	worker_xact_end();
	return topics;
}

static bool
record_outcome(DesiredTopic *topics, int count, int64 version)
{
	StringInfoData json;
	Oid types[2] = {INT8OID, JSONBOID};
	Datum values[2];
	bool published = false;

	initStringInfo(&json);
	appendStringInfoChar(&json, '[');
	for (int i = 0; i < count; i++)
	{
		DesiredTopic *t = &topics[i];

		if (i > 0)
			appendStringInfoChar(&json, ',');
		appendStringInfoString(&json, "{\"topic\":");
		escape_json(&json, t->name);
		appendStringInfo(&json,
						 ",\"role\":\"%s\",\"partitions\":%d,\"replication_factor\":%d,"
						 "\"min_insync_replicas\":%d,\"retention_ms\":" INT64_FORMAT
						 ",\"max_message_bytes\":%d,\"ready\":%s,\"permanent\":%s,"
						 "\"created\":%s,",
						 t->role, t->partitions, t->replication_factor, t->min_insync_replicas,
						 t->retention_ms, t->max_message_bytes, t->ready ? "true" : "false",
						 t->permanent ? "true" : "false", t->created ? "true" : "false");
		/* Unknown when Kafka did not answer: the database keeps what it knew. */
		if (t->exists < 0)
			appendStringInfoString(&json, "\"exists\":null,\"kafka_partitions\":null,");
		else
			appendStringInfo(&json, "\"exists\":%s,\"kafka_partitions\":%d,",
							 t->exists ? "true" : "false", t->exists ? t->kafka_partitions : 0);
		appendStringInfoString(&json, "\"error\":");
		if (t->error)
			escape_json(&json, t->error);
		else
			appendStringInfoString(&json, "null");
		appendStringInfoChar(&json, '}');
	}
	appendStringInfoChar(&json, ']');

	values[0] = Int64GetDatum(version);
	values[1] = DirectFunctionCall1(jsonb_in, CStringGetDatum(json.data));

	if (worker_xact_begin_in_extension("wal_delivery reconciler: recording") &&
		SPI_execute_with_args("SELECT wal_delivery.record_reconciliation($1, $2)", 2, types, values,
							  NULL, false, 1) == SPI_OK_SELECT)
	{
		bool isnull;

		published =
			DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	}
	worker_xact_end();
	return published;
}

/*
 * Records, in a transaction of its own, that the topics Kafka does not have are
 * wal_delivery's, before Kafka is asked to create them. Recorded only with the round's
 * outcome, a crash between Kafka creating a topic and that record left the topic looking
 * like another application's: left alone for good, its records waiting.
 */
static void
note_topics_to_create(DesiredTopic **missing, int n)
{
	Datum *names = palloc(sizeof(Datum) * n);
	Oid types[1] = {TEXTARRAYOID};
	Datum values[1];

	for (int i = 0; i < n; i++)
		names[i] = CStringGetTextDatum(missing[i]->name);
	values[0] = text_array(names, n);
	if (worker_xact_begin_in_extension("wal_delivery reconciler: noting topics to create"))
		spi_exec_or_fail("SELECT wal_delivery.note_topics_to_create($1)", 1, types, values);
	worker_xact_end();
}

/* SIGHUP: read the settings again; the Kafka settings may have changed, so reconnect. */
static void
reload_settings_if_asked(ReconcileState *st)
{
	if (!ConfigReloadPending)
		return;
	ConfigReloadPending = false;
	ProcessConfigFile(PGC_SIGHUP);
	reconcile_kafka_disconnect();
	st->next_full_check = 0;
}

/* A new version runs at once; the same one again only when its full check is due. */
static bool
round_due(const ReconcileState *st, int64 version, bool due)
{
	return version >= 0 && ((due && version != st->last_attempted_version) ||
							GetCurrentTimestamp() >= st->next_full_check);
}

/*
 * After a round: logs once when a failing streak starts (the status view has the details)
 * or when Kafka matches a new version, and sets the next full check: with a backoff while
 * topics fail, every reconcile_interval otherwise. Returns how long to wait.
 */
static int
note_round(ReconcileState *st, const DesiredTopic *topics, int count, int64 version, bool published)
{
	int not_ready = 0;
	int wait_ms = reconcile_poll_ms;

	for (int i = 0; i < count; i++)
		if (!topics[i].ready)
			not_ready++;
	if (not_ready > 0)
	{
		if (st->failures++ == 0)
			ereport(LOG, (errmsg("wal_delivery reconciler: %d of %d Kafka topics are not "
								 "ready; see wal_delivery.reconcile_status",
								 not_ready, count)));
		wait_ms = Min(1000 * (1 << Min(st->failures, 5)), reconcile_interval_ms);
		st->next_full_check = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), wait_ms);
		return wait_ms;
	}
	if (published && version != st->last_matched_version)
		ereport(LOG, (errmsg("wal_delivery reconciler: Kafka matches config version " INT64_FORMAT,
							 version)));
	st->last_matched_version = version;
	st->failures = 0;
	st->next_full_check = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), reconcile_interval_ms);
	return wait_ms;
}

/* Reads the desired topics and, when a round is due, applies and records them. */
static int
reconcile_once(ReconcileState *st)
{
	int64 version;
	bool due;
	int count;
	DesiredTopic *topics = read_desired_topics(&count, &version, &due);
	bool published;

	if (!round_due(st, version, due))
		return reconcile_poll_ms;
	st->last_attempted_version = version;
	apply_to_kafka(topics, count, note_topics_to_create);
	published = record_outcome(topics, count, version);
	return note_round(st, topics, count, version, published);
}

void
wal_delivery_reconcile_main(Datum main_arg)
{
	ReconcileState st = {0, -1, -1, 0};
	MemoryContext round_ctx;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	BackgroundWorkerUnblockSignals();
	worker_connect();
	round_ctx = AllocSetContextCreate(TopMemoryContext, "wal_delivery reconcile round",
									  ALLOCSET_DEFAULT_SIZES);
	ereport(LOG,
			(errmsg("wal_delivery reconciler started on database \"%s\"", wal_delivery_database)));

	while (!ShutdownRequestPending)
	{
		MemoryContext old;
		int wait_ms;

		reload_settings_if_asked(&st);
		old = MemoryContextSwitchTo(round_ctx);
		wait_ms = reconcile_once(&st);
		MemoryContextSwitchTo(old);
		MemoryContextReset(round_ctx);

		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, wait_ms,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
	reconcile_kafka_disconnect();
	proc_exit(1); /* restarted unless the whole server is stopping */
}
