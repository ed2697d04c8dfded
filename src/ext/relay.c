/*
 * relay.c: the background workers that ship the outbox to Kafka.
 *
 * A pass reads, for each lane of the log it owns, the next batch after the lane's cursor,
 * and claims a batch of ready rows of the row table (SKIP LOCKED, so relays side by side
 * never share a row); it produces each with its headers, waits for every delivery report,
 * and in the same transaction moves each lane's cursor (once per batch, never per record)
 * and marks stored exactly the claimed rows whose report says persisted. A log record
 * that was not persisted is held: copied once into the row table, so the cursor moves on
 * (unless Kafka did not answer at all, when the cursor stays and the batch is read again),
 * and goes on there row by row. Anything else stays unshipped: rows of a topic Kafka does
 * not have wait (written once) until the reconciler creates it; rows Kafka did not take
 * are tried again later, without being rewritten, while their topic is passed over; a row
 * Kafka can never take (too large) is dead. A crash at any point leaves the claimed rows
 * unmarked and the cursors unmoved, so they are sent again.
 *
 * Words: a "pass" is one claim-produce-mark transaction; "backoff" is how long the relay
 * waits after a pass that shipped nothing because Kafka took nothing; a "failing topic"
 * is one whose records Kafka did not take, passed over by the claim until its own retry
 * time. Relay 0 also runs the maintenance (lease expiry, purge of finished rows).
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "kafka_producer.h"
#include "relay.h"
#include "relay_wakeup.h"
#include "wal_delivery.h"

/* Settings (see define_relay_settings). */
char *wal_delivery_database = NULL;
int wal_delivery_relay_workers = 1;
char *kafka_bootstrap_servers = NULL;
char *kafka_properties = NULL;
static int relay_batch_size = 500;
static int relay_idle_interval_ms = 1000;
static int relay_delivery_timeout_ms = 30000;
static int relay_max_backoff_ms = 60000;
static int relay_shutdown_flush_ms = 5000;
static int maintenance_interval_ms = 10000;

typedef enum
{
	RELAY_SHIPPING,
	RELAY_KAFKA_DOWN,
	RELAY_NOT_CONFIGURED,
	RELAY_NO_EXTENSION,
	RELAY_KAFKA_REFUSING
} RelayState;

typedef struct PassResult
{
	int claimed;
	int stored;
	int deferred; /* Kafka did not take them: tried again later */
	int waiting;  /* their topic is not in Kafka: they wait for it */
	int unshippable;
	bool extension_missing;
	bool kafka_down;   /* the first deferred row's error says Kafka did not answer */
	char *reason;      /* why the first deferred row was not stored */
	bool more_waiting; /* a batch was full: go again at once */
} PassResult;

static RelayState relay_state = RELAY_SHIPPING;

/*
 * A topic whose records Kafka did not take: the claim passes over its rows until
 * retry_at, its delay doubling up to relay_max_backoff while it keeps failing, so a
 * failing topic neither holds up the others nor has its rows rewritten on every try.
 */
typedef struct FailingTopic
{
	char name[256];
	int delay_ms;
	TimestampTz retry_at;
	uint64 failed_in_pass;
	uint64 first_failed_in_pass; /* the pass that started its failing streak */
} FailingTopic;

#define MAX_FAILING_TOPICS 256
static FailingTopic failing_topics[MAX_FAILING_TOPICS];
static int n_failing_topics = 0;
static uint64 pass_number = 0;

void
define_relay_settings(void)
{
	DefineCustomStringVariable("wal_delivery.database", "Database the relay workers connect to.",
							   "The database where CREATE EXTENSION wal_delivery ran.",
							   &wal_delivery_database, "postgres", PGC_POSTMASTER, 0, NULL, NULL,
							   NULL);
	DefineCustomIntVariable("wal_delivery.relay_workers", "Number of relay background workers.",
							"0 disables the relay.", &wal_delivery_relay_workers, 1, 0,
							MAX_RELAY_WORKERS, PGC_POSTMASTER, 0, NULL, NULL, NULL);
	DefineCustomStringVariable("wal_delivery.kafka_bootstrap_servers",
							   "Kafka bootstrap servers (host:port,...) for the relay.", NULL,
							   &kafka_bootstrap_servers, "", PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomStringVariable(
		"wal_delivery.kafka_properties",
		"librdkafka properties for the relay, passed unchanged: name=value;name=value.",
		"For security, SASL, TLS, compression, linger and the like, e.g. "
		"'security.protocol=ssl;compression.type=lz4'.",
		&kafka_properties, "", PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("wal_delivery.relay_batch_size", "Rows one relay pass claims.", NULL,
							&relay_batch_size, 500, 1, 100000, PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("wal_delivery.relay_idle_interval",
							"How long an idle relay sleeps when no commit wakes it.", NULL,
							&relay_idle_interval_ms, 1000, 10, 600000, PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);
	DefineCustomIntVariable("wal_delivery.relay_delivery_timeout",
							"How long a record may wait for Kafka's acknowledgement in one pass "
							"(librdkafka message.timeout.ms).",
							NULL, &relay_delivery_timeout_ms, 30000, 1000, 3600000, PGC_SIGHUP,
							GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomIntVariable(
		"wal_delivery.relay_max_backoff", "Longest wait between passes while Kafka fails.", NULL,
		&relay_max_backoff_ms, 60000, 100, 3600000, PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomIntVariable("wal_delivery.relay_shutdown_flush",
							"How long a stopping relay waits for outstanding acknowledgements.",
							NULL, &relay_shutdown_flush_ms, 5000, 0, 60000, PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);
	DefineCustomIntVariable("wal_delivery.maintenance_interval",
							"How often relay 0 expires processing leases and purges finished rows.",
							NULL, &maintenance_interval_ms, 10000, 100, 3600000, PGC_SIGHUP,
							GUC_UNIT_MS, NULL, NULL, NULL);
}

void
register_relay_workers(void)
{
	for (int i = 0; i < wal_delivery_relay_workers; i++)
	{
		char name[BGW_MAXLEN];

		snprintf(name, sizeof(name), "wal_delivery relay %d", i);
		register_wal_delivery_worker("wal_delivery_relay_main", name, "wal_delivery relay", i);
	}
}

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

static Datum
int8_array(int64 *values, int n)
{
	Datum *elems = palloc(sizeof(Datum) * Max(n, 1));

	for (int i = 0; i < n; i++)
		elems[i] = Int64GetDatum(values[i]);
	return PointerGetDatum(
		construct_array(elems, n, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
}

static void
spi_exec_or_fail(const char *sql, int nargs, Oid *types, Datum *values)
{
	int rc = SPI_execute_with_args(sql, nargs, types, values, NULL, false, 0);

	if (rc < 0)
		elog(ERROR, "wal_delivery relay: SPI failed (%d) on: %s", rc, sql);
}

/*
 * Runs one of the statements every pass runs through a plan kept for the session (*plan,
 * prepared on first use): planning them on every pass (the claim, and per lane its cursor,
 * its batch and the cursor's move) was most of an idle relay's CPU, since each commit
 * wakes a pass. The plan cache re-plans by itself after DDL on what they read (a TRUNCATE
 * of a generation, the extension dropped and created again). nulls as SPI_execute_plan's.
 */
static void
spi_exec_kept(SPIPlanPtr *plan, const char *sql, int nargs, Oid *types, Datum *values,
			  const char *nulls)
{
	int rc;

	if (*plan == NULL)
	{
		SPIPlanPtr p = SPI_prepare(sql, nargs, types);

		if (p == NULL)
			elog(ERROR, "wal_delivery relay: could not prepare (%s): %s",
				 SPI_result_code_string(SPI_result), sql);
		if (SPI_keepplan(p) != 0)
			elog(ERROR, "wal_delivery relay: could not keep the plan of: %s", sql);
		*plan = p;
	}
	rc = SPI_execute_plan(*plan, values, nulls, false, 0);
	if (rc < 0)
		elog(ERROR, "wal_delivery relay: SPI failed (%d) on: %s", rc, sql);
}

/*
 * Kafka will never take these: the record itself is refused (too large, or arguments
 * librdkafka rejects). Everything else about a topic (authorization, replicas, leaders)
 * can be fixed in the cluster, so its records wait.
 */
static bool
is_unshippable(rd_kafka_resp_err_t err)
{
	switch (err)
	{
		case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
		case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
		case RD_KAFKA_RESP_ERR__INVALID_ARG:
			return true;
		default:
			return false;
	}
}

/* Errors that say no broker answered, as opposed to a broker refusing. */
static bool
is_kafka_down(rd_kafka_resp_err_t err)
{
	switch (err)
	{
		case RD_KAFKA_RESP_ERR__MSG_TIMED_OUT:
		case RD_KAFKA_RESP_ERR__TIMED_OUT:
		case RD_KAFKA_RESP_ERR__TRANSPORT:
		case RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN:
		case RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT:
			return true;
		default:
			return false;
	}
}

/* ------------------------------------------------------------ failing topics */

static FailingTopic *
find_failing_topic(const char *name)
{
	for (int i = 0; i < n_failing_topics; i++)
		if (strcmp(failing_topics[i].name, name) == 0)
			return &failing_topics[i];
	return NULL;
}

/*
 * Kafka did not take a record of this topic: pass over it a while, longer after each
 * pass in which it failed again.
 */
static void
topic_failed(const char *name)
{
	FailingTopic *t = find_failing_topic(name);

	if (t == NULL)
	{
		if (n_failing_topics == MAX_FAILING_TOPICS || strlen(name) >= sizeof(t->name))
			return; /* not remembered: its rows are simply claimed again */
		t = &failing_topics[n_failing_topics++];
		strlcpy(t->name, name, sizeof(t->name));
		t->delay_ms = 0;
		t->failed_in_pass = 0;
		t->first_failed_in_pass = pass_number;
	}
	if (t->failed_in_pass == pass_number)
		return;
	t->failed_in_pass = pass_number;
	t->delay_ms = t->delay_ms ? Min(t->delay_ms * 2, relay_max_backoff_ms) : 1000;
	t->retry_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), t->delay_ms);
}

/* Kafka took a record of this topic: it is no longer failing, unless another failed. */
static void
topic_shipped(const char *name)
{
	FailingTopic *t = find_failing_topic(name);

	if (t != NULL && t->failed_in_pass != pass_number)
		*t = failing_topics[--n_failing_topics];
}

/* The failing topics whose retry time has not come: a text[] for the claim, or NULL. */
static Datum
topics_to_pass_over(bool *isnull)
{
	Datum *names = palloc(sizeof(Datum) * Max(n_failing_topics, 1));
	TimestampTz now = GetCurrentTimestamp();
	int n = 0;

	for (int i = 0; i < n_failing_topics; i++)
		if (failing_topics[i].retry_at > now)
			names[n++] = CStringGetTextDatum(failing_topics[i].name);
	*isnull = n == 0;
	return n == 0 ? (Datum) 0
				  : PointerGetDatum(construct_array(names, n, TEXTOID, -1, false, TYPALIGN_INT));
}

/* Milliseconds until a failing topic may be tried again; -1 when none waits. */
static int
ms_until_next_topic_retry(void)
{
	TimestampTz now = GetCurrentTimestamp();
	int best = -1;

	for (int i = 0; i < n_failing_topics; i++)
	{
		long secs;
		int usecs;
		int ms;

		TimestampDifference(now, failing_topics[i].retry_at, &secs, &usecs);
		ms = (int) Min(secs * 1000 + usecs / 1000 + 1, INT_MAX);
		if (best < 0 || ms < best)
			best = ms;
	}
	return best;
}

/* ------------------------------------------------------------ a pass */

static const char claim_sql[] =
	"SELECT c.id, c.topic, c.idempotency_key, c.message_key, c.headers::text, c.content_type,"
	"       c.payload, to_char(c.created_at AT TIME ZONE 'UTC', "
	"                          'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), t.acks,"
	"       coalesce(k.in_kafka, false), k.error"
	"  FROM wal_delivery.claim_ready_to_ship($1, $2) c"
	"  LEFT JOIN wal_delivery.topics t ON t.name = c.topic"
	"  LEFT JOIN wal_delivery.kafka_topics k ON k.topic = c.topic AND k.role = 'main'";

/* Why a claimed row is not produced in this pass. */
typedef enum
{
	ROW_PRODUCED,
	ROW_TOPIC_DELETED, /* no longer in wal_delivery.topics: dead */
	ROW_TOPIC_MISSING  /* not in Kafka (yet): it waits until the reconciler creates it */
} RowFate;

/* The rows one pass claimed (SPI_tuptable), and what became of each on the way. */
typedef struct ClaimedRows
{
	int n;
	SPITupleTable *tt;
	KafkaDelivery *deliveries;
	RowFate *fate;
	int64 *stored; /* persisted: mark stored */
	int64 *noted;  /* not persisted, first in its topic's failing streak: note why */
	Datum *noted_reasons;
	int n_noted;
	int64 *waiting;            /* topic not in Kafka: wait for it */
	const char *waiting_topic; /* the first waiting row's, and why */
	const char *waiting_reason;
} ClaimedRows;

static void
init_claimed_rows(ClaimedRows *rows)
{
	int n = (int) SPI_processed;

	rows->n = n;
	rows->tt = SPI_tuptable;
	rows->deliveries = palloc0(sizeof(KafkaDelivery) * Max(n, 1));
	rows->stored = palloc(sizeof(int64) * Max(n, 1));
	rows->noted = palloc(sizeof(int64) * Max(n, 1));
	rows->fate = palloc0(sizeof(RowFate) * Max(n, 1));
	rows->noted_reasons = palloc(sizeof(Datum) * Max(n, 1));
	rows->n_noted = 0;
	rows->waiting = palloc(sizeof(int64) * Max(n, 1));
	rows->waiting_topic = rows->waiting_reason = NULL;
}

/* Reads claimed row i into rec and its delivery's outbox id; says whether to produce it. */
static RowFate
read_claimed_row(ClaimedRows *rows, int i, KafkaRecord *rec)
{
	HeapTuple tup = rows->tt->vals[i];
	TupleDesc desc = rows->tt->tupdesc;
	bool isnull;
	bytea *payload;

	rows->deliveries[i].outbox_id = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
	rec->topic = SPI_getvalue(tup, desc, 2);
	rec->idempotency_key = SPI_getvalue(tup, desc, 3);
	rec->key = SPI_getvalue(tup, desc, 4);
	rec->headers_json = SPI_getvalue(tup, desc, 5);
	rec->content_type = SPI_getvalue(tup, desc, 6);
	payload = DatumGetByteaPP(SPI_getbinval(tup, desc, 7, &isnull));
	rec->value = VARDATA_ANY(payload);
	rec->value_len = VARSIZE_ANY_EXHDR(payload);
	rec->created_at = SPI_getvalue(tup, desc, 8);
	rec->acks = DatumGetInt16(SPI_getbinval(tup, desc, 9, &isnull));
	if (isnull)
	{
		/* The topic was deleted (forced) after this row was enqueued. */
		return ROW_TOPIC_DELETED;
	}
	/* Produce only to topics Kafka has, never to ones a produce would auto-create. */
	if (!DatumGetBool(SPI_getbinval(tup, desc, 10, &isnull)))
		return ROW_TOPIC_MISSING;
	return ROW_PRODUCED;
}

/* Produces every row that may be; one librdkafka refuses at once counts as reported. */
static void
produce_claimed_rows(ClaimedRows *rows)
{
	for (int i = 0; i < rows->n; i++)
	{
		KafkaRecord rec;
		rd_kafka_resp_err_t err;

		rows->fate[i] = read_claimed_row(rows, i, &rec);
		if (rows->fate[i] != ROW_PRODUCED)
			continue;
		err = kafka_produce(&rec, &rows->deliveries[i]);
		if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			rows->deliveries[i].reported = true;
			rows->deliveries[i].err = err;
			rows->deliveries[i].status = RD_KAFKA_MSG_STATUS_NOT_PERSISTED;
		}
	}
}

static void
wait_for_delivery_reports(void)
{
	int wait_ms;

	pgstat_report_activity(STATE_RUNNING, "wal_delivery relay: waiting for Kafka");
	/* librdkafka reports every message within message.timeout.ms; stopping shortens it. */
	wait_ms = ShutdownRequestPending ? relay_shutdown_flush_ms : relay_delivery_timeout_ms + 5000;
	kafka_wait_for_deliveries(wait_ms, relay_shutdown_flush_ms);
}

static void
mark_unshippable(int64 outbox_id, const char *reason)
{
	Oid types[2] = {INT8OID, TEXTOID};
	Datum values[2] = {Int64GetDatum(outbox_id), CStringGetTextDatum(reason)};

	spi_exec_or_fail("SELECT wal_delivery.mark_unshippable($1, $2)", 2, types, values);
}

/*
 * A row Kafka did not take this time: its topic is passed over for a while. Only the
 * rows of the pass that starts a topic's failing streak get the reason written: a write
 * moves a row behind its equals in the claim's order, so writing on every try would reach
 * row after row of a long backlog.
 */
static void
defer_row(ClaimedRows *rows, int i, PassResult *result)
{
	KafkaDelivery *d = &rows->deliveries[i];
	const char *topic = SPI_getvalue(rows->tt->vals[i], rows->tt->tupdesc, 2);
	const char *why = d->err != RD_KAFKA_RESP_ERR_NO_ERROR
						  ? rd_kafka_err2str(d->err)
						  : "Kafka reported the record as possibly persisted";
	FailingTopic *t = find_failing_topic(topic);

	if (t == NULL || t->first_failed_in_pass == pass_number)
	{
		rows->noted_reasons[rows->n_noted] =
			CStringGetTextDatum(psprintf("Kafka did not take the record: %s", why));
		rows->noted[rows->n_noted++] = d->outbox_id;
	}
	topic_failed(topic);
	result->deferred++;
	if (result->reason == NULL)
	{
		result->reason = psprintf("%s (topic \"%s\")", why, topic);
		result->kafka_down = is_kafka_down(d->err);
	}
}

/*
 * Sorts each row by its fate and delivery report: dead rows are marked unshippable here,
 * row by row; the others are collected for write_sorted_rows.
 */
static void
sort_claimed_rows(ClaimedRows *rows, PassResult *result)
{
	for (int i = 0; i < rows->n; i++)
	{
		KafkaDelivery *d = &rows->deliveries[i];

		if (rows->fate[i] == ROW_TOPIC_MISSING)
		{
			if (rows->waiting_topic == NULL)
			{
				rows->waiting_topic = SPI_getvalue(rows->tt->vals[i], rows->tt->tupdesc, 2);
				rows->waiting_reason = SPI_getvalue(rows->tt->vals[i], rows->tt->tupdesc, 11);
			}
			rows->waiting[result->waiting++] = d->outbox_id;
		}
		else if (rows->fate[i] == ROW_TOPIC_DELETED)
		{
			mark_unshippable(d->outbox_id, "topic no longer exists in wal_delivery.topics");
			result->unshippable++;
		}
		else if (d->err == RD_KAFKA_RESP_ERR_NO_ERROR && d->status == RD_KAFKA_MSG_STATUS_PERSISTED)
		{
			topic_shipped(SPI_getvalue(rows->tt->vals[i], rows->tt->tupdesc, 2));
			rows->stored[result->stored++] = d->outbox_id;
		}
		else if (is_unshippable(d->err))
		{
			mark_unshippable(d->outbox_id,
							 psprintf("Kafka refused the record: %s", rd_kafka_err2str(d->err)));
			result->unshippable++;
		}
		else
			defer_row(rows, i, result);
	}
}

/* Logs once per topic and reason that records wait for their topic to be in Kafka. */
static void
log_waiting_topic(const char *topic, const char *reason)
{
	static char last[512] = "";
	char *now = psprintf("%s: %s", topic, reason ? reason : "");

	if (strncmp(last, now, sizeof(last) - 1) == 0)
		return;
	strlcpy(last, now, sizeof(last));
	ereport(LOG, (errmsg("wal_delivery relay: records of topic \"%s\" wait in the outbox until "
						 "Kafka has the topic",
						 topic),
				  errdetail_internal("%s", reason ? reason
												  : "The reconciler has not created it yet; see "
													"wal_delivery.reconcile_status.")));
}

/*
 * One statement per kind: waiting (once, until the topic exists), stored, and the
 * reason of the deferred that start a failing streak (their place in line is kept).
 */
static void
write_sorted_rows(const ClaimedRows *rows, const PassResult *result)
{
	if (result->waiting > 0)
	{
		Oid types[1] = {INT8ARRAYOID};
		Datum values[1] = {int8_array(rows->waiting, result->waiting)};

		spi_exec_or_fail("SELECT wal_delivery.wait_for_topic($1)", 1, types, values);
		log_waiting_topic(rows->waiting_topic, rows->waiting_reason);
	}
	if (result->stored > 0)
	{
		Oid types[1] = {INT8ARRAYOID};
		Datum values[1] = {int8_array(rows->stored, result->stored)};

		spi_exec_or_fail("SELECT wal_delivery.mark_stored($1)", 1, types, values);
	}
	if (rows->n_noted > 0)
	{
		Oid types[2] = {INT8ARRAYOID, TEXTARRAYOID};
		Datum values[2] = {int8_array(rows->noted, rows->n_noted),
						   PointerGetDatum(construct_array(rows->noted_reasons, rows->n_noted,
														   TEXTOID, -1, false, TYPALIGN_INT))};

		spi_exec_or_fail("SELECT wal_delivery.note_shipping_failures($1, $2)", 2, types, values);
	}
}

/*
 * Produces every claimed row and sorts the outcomes; runs inside the pass transaction, so
 * the rows are marked in the same transaction that claimed them.
 */
static void
ship_claimed_rows(PassResult *result)
{
	ClaimedRows rows;

	init_claimed_rows(&rows);
	result->claimed = rows.n;
	produce_claimed_rows(&rows);
	/* Every row needs its report before anything is marked: only persisted means stored. */
	wait_for_delivery_reports();
	sort_claimed_rows(&rows, result);
	write_sorted_rows(&rows, result);
}

/* ------------------------------------------------------------ the log */

#define LOG_LANES 8

/*
 * One lane's batch: the window (snapshot) being shipped, whether this pass opened it
 * (then it is not in the cursor yet), and the records read after the cursor in that
 * window, in (xid, id) order.
 */
typedef struct LaneBatch
{
	int lane;
	bool fresh_window;
	char *window; /* pg_snapshot, as text */
	int limit;
	ClaimedRows rows;
} LaneBatch;

static const char lane_cursor_sql[] =
	"SELECT coalesce(win_snap, pg_current_snapshot())::text, win_snap IS NULL,"
	"       done_snap, coalesce(pos_xid, pg_snapshot_xmin(done_snap)),"
	"       coalesce(pos_id, 0), coalesce(win_snap, pg_current_snapshot())"
	"  FROM wal_delivery.relay_cursors WHERE lane = $1";

/*
 * The next records of a lane after its cursor in the window: committed in the window's
 * snapshot and not in done_snap. The ordered subquery walks the (lane, xid, id) index from
 * the cursor, so a batch costs the same however long the log is; the relay's planner
 * settings (wal_delivery_relay_main) keep any other plan away whatever the statistics say.
 * Columns as claim_sql's, then the record's xid.
 */
static const char lane_batch_sql[] =
	"SELECT c.id, c.topic, c.idempotency_key, c.message_key, c.headers::text, c.content_type,"
	"       c.payload, to_char(c.created_at AT TIME ZONE 'UTC', "
	"                          'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), t.acks,"
	"       coalesce(k.in_kafka, false), k.error, c.xid::text"
	"  FROM (SELECT l.* FROM wal_delivery.outbox_log l"
	"         WHERE l.lane = $1 AND (l.xid, l.id) > ($4, $5)"
	"           AND l.xid < pg_snapshot_xmax($2)"
	"           AND pg_visible_in_snapshot(l.xid, $2)"
	"           AND NOT pg_visible_in_snapshot(l.xid, $3)"
	"         ORDER BY l.lane, l.xid, l.id LIMIT $6) c"
	"  LEFT JOIN wal_delivery.topics t ON t.name = c.topic"
	"  LEFT JOIN wal_delivery.kafka_topics k ON k.topic = c.topic AND k.role = 'main'";

#define LANE_XID_COLUMN 12

/* Whether this relay ships lane: lanes are dealt out to the relay workers by number. */
static bool
owns_lane(int slot, int lane)
{
	return relay_slot_of_lane(lane) == slot;
}

/* Reads a lane's cursor and its next batch, and produces the batch. */
static void
read_lane(LaneBatch *b)
{
	Oid ctypes[1] = {INT2OID};
	Datum cvalues[1] = {Int16GetDatum(b->lane)};
	/* The snapshots and the position go in binary: parsed once, not once per row read. */
	Oid types[6] = {INT2OID, PG_SNAPSHOTOID, PG_SNAPSHOTOID, XID8OID, INT8OID, INT4OID};
	Datum values[6];
	SPITupleTable *cur;
	bool isnull;

	static SPIPlanPtr cursor_plan = NULL;
	static SPIPlanPtr batch_plan = NULL;

	spi_exec_kept(&cursor_plan, lane_cursor_sql, 1, ctypes, cvalues, NULL);
	if (SPI_processed != 1)
		elog(ERROR, "wal_delivery relay: lane %d has no cursor", b->lane);
	cur = SPI_tuptable;
	b->window = SPI_getvalue(cur->vals[0], cur->tupdesc, 1);
	b->fresh_window = DatumGetBool(SPI_getbinval(cur->vals[0], cur->tupdesc, 2, &isnull));
	values[0] = Int16GetDatum(b->lane);
	values[1] = SPI_getbinval(cur->vals[0], cur->tupdesc, 6, &isnull);
	values[2] = SPI_getbinval(cur->vals[0], cur->tupdesc, 3, &isnull);
	values[3] = SPI_getbinval(cur->vals[0], cur->tupdesc, 4, &isnull);
	values[4] = SPI_getbinval(cur->vals[0], cur->tupdesc, 5, &isnull);
	values[5] = Int32GetDatum(b->limit);
	spi_exec_kept(&batch_plan, lane_batch_sql, 6, types, values, NULL);
	init_claimed_rows(&b->rows);
	produce_claimed_rows(&b->rows);
}

static bool
persisted(const ClaimedRows *rows, int i)
{
	const KafkaDelivery *d = &rows->deliveries[i];

	return rows->fate[i] == ROW_PRODUCED && d->err == RD_KAFKA_RESP_ERR_NO_ERROR &&
		   d->status == RD_KAFKA_MSG_STATUS_PERSISTED;
}

/*
 * Whether the cursors stay where they are this pass: Kafka took nothing of the pass (no
 * log record persisted, no claimed row stored), and every log record it did not take may
 * be taken later as it is (Kafka did not answer, or a broker refused it for now). Then
 * nothing is blocked by those records, and the batch is read again after the backoff
 * instead of being copied into the row table: an outage costs no write per record. When
 * Kafka took something, the records it did not take are held (copied once), so a failing
 * topic never stops its lane for the others; a record whose topic is not in Kafka, was
 * deleted, or is too large is held at once (it waits, or dies, row by row).
 */
static bool
lanes_wait(LaneBatch *lanes, int n_lanes, PassResult *result)
{
	int waiting = 0;
	char *reason = NULL;
	bool kafka_down = false;

	if (result->stored > 0)
		return false;
	for (int l = 0; l < n_lanes; l++)
		for (int i = 0; i < lanes[l].rows.n; i++)
		{
			const ClaimedRows *rows = &lanes[l].rows;
			rd_kafka_resp_err_t err = rows->deliveries[i].err;

			if (rows->fate[i] != ROW_PRODUCED || persisted(rows, i) || is_unshippable(err))
				return false;
			if (reason == NULL)
			{
				reason = psprintf("%s (topic \"%s\")",
								  err != RD_KAFKA_RESP_ERR_NO_ERROR
									  ? rd_kafka_err2str(err)
									  : "Kafka reported the record as possibly persisted",
								  SPI_getvalue(rows->tt->vals[i], rows->tt->tupdesc, 2));
				kafka_down = is_kafka_down(err);
			}
			waiting++;
		}
	result->deferred += waiting;
	if (result->reason == NULL)
	{
		result->reason = reason;
		result->kafka_down = kafka_down;
	}
	return true;
}

/* Moves a lane's cursor past its batch: one small update per batch. */
static void
advance_cursor(const LaneBatch *b)
{
	const ClaimedRows *rows = &b->rows;
	Oid types[5] = {INT2OID, TEXTOID, BOOLOID, TEXTOID, INT8OID};
	Datum values[5] = {0};
	char nulls[5] = {' ', ' ', ' ', 'n', 'n'};
	bool window_done = rows->n < b->limit;
	static SPIPlanPtr plan = NULL;

	values[0] = Int16GetDatum(b->lane);
	values[1] = CStringGetTextDatum(b->window);
	values[2] = BoolGetDatum(window_done);
	if (!window_done)
	{
		HeapTuple last = rows->tt->vals[rows->n - 1];
		bool isnull;

		values[3] = CStringGetTextDatum(SPI_getvalue(last, rows->tt->tupdesc, LANE_XID_COLUMN));
		values[4] = SPI_getbinval(last, rows->tt->tupdesc, 1, &isnull);
		nulls[3] = nulls[4] = ' ';
	}
	spi_exec_kept(&plan,
				  "SELECT wal_delivery.advance_relay_cursor($1, $2::pg_snapshot, $3, $4::xid8, $5)",
				  5, types, values, nulls);
}

/*
 * After the reports: holds every record of the batch that was not persisted (copied into
 * the row table, where the claim's row-by-row handling takes over), then moves the cursor
 * past the batch, or to the window's end when the batch was its last.
 */
static void
finish_lane(LaneBatch *b, PassResult *result)
{
	ClaimedRows *rows = &b->rows;
	int64 *held = palloc(sizeof(int64) * Max(rows->n, 1));
	Datum *held_xids = palloc(sizeof(Datum) * Max(rows->n, 1));
	int n_held = 0;
	PassResult lane = {0};

	for (int i = 0; i < rows->n; i++)
	{
		if (persisted(rows, i))
			continue;
		held[n_held] = rows->deliveries[i].outbox_id;
		held_xids[n_held++] = CStringGetTextDatum(
			SPI_getvalue(rows->tt->vals[i], rows->tt->tupdesc, LANE_XID_COLUMN));
	}
	if (n_held > 0)
	{
		Oid types[2] = {INT8ARRAYOID, TEXTARRAYOID};
		Datum values[2] = {
			int8_array(held, n_held),
			PointerGetDatum(construct_array(held_xids, n_held, TEXTOID, -1, false, TYPALIGN_INT))};

		spi_exec_or_fail("SELECT wal_delivery.hold_log_records($1, $2::xid8[])", 2, types, values);
	}
	/*
	 * The held rows now take the claim's path (waiting for their topic, dead, or passed
	 * over with their reason), row by row; the persisted ones are stored by the cursor,
	 * not by mark_stored.
	 */
	sort_claimed_rows(rows, &lane);
	lane.stored = 0;
	write_sorted_rows(rows, &lane);
	result->stored += rows->n - n_held;
	result->deferred += lane.deferred;
	result->waiting += lane.waiting;
	result->unshippable += lane.unshippable;
	if (result->reason == NULL && lane.reason != NULL)
	{
		result->reason = lane.reason;
		result->kafka_down = lane.kafka_down;
	}
	if (rows->n > 0 || !b->fresh_window)
		advance_cursor(b);
	if (rows->n == b->limit)
		result->more_waiting = true;
}

/*
 * The log part of a pass, inside the pass transaction: read and produce every owned
 * lane's batch, wait once for all reports, then hold what Kafka did not take and move the
 * cursors. Stored therefore means: the cursor moved past it in a committed transaction,
 * after Kafka's acknowledgement; a crash before the commit sends the batch again.
 */
static void
ship_log(int slot, PassResult *result)
{
	LaneBatch lanes[LOG_LANES];
	int n_lanes = 0;
	bool read_any = false;

	for (int lane = 0; lane < LOG_LANES; lane++)
	{
		if (!owns_lane(slot, lane))
			continue;
		memset(&lanes[n_lanes], 0, sizeof(LaneBatch));
		lanes[n_lanes].lane = lane;
		lanes[n_lanes].limit = relay_batch_size;
		read_lane(&lanes[n_lanes]);
		read_any |= lanes[n_lanes].rows.n > 0;
		n_lanes++;
	}
	if (read_any)
	{
		wait_for_delivery_reports();
		if (lanes_wait(lanes, n_lanes, result))
			return;
	}
	/* A fresh window with nothing in it costs no write. */
	for (int l = 0; l < n_lanes; l++)
		finish_lane(&lanes[l], result);
}

static void
run_pass(int slot, PassResult *result)
{
	Oid types[2] = {INT4OID, TEXTARRAYOID};
	Datum values[2];
	char nulls[2] = {' ', ' '};
	bool no_skip;
	static SPIPlanPtr claim_plan = NULL;

	memset(result, 0, sizeof(*result));
	pass_number++;
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "wal_delivery relay: claiming");

	if (!OidIsValid(get_extension_oid("wal_delivery", true)))
		result->extension_missing = true;
	else
	{
		values[0] = Int32GetDatum(relay_batch_size);
		values[1] = topics_to_pass_over(&no_skip);
		nulls[1] = no_skip ? 'n' : ' ';
		spi_exec_kept(&claim_plan, claim_sql, 2, types, values, nulls);
		if (SPI_processed > 0)
			ship_claimed_rows(result);
		if (result->claimed == relay_batch_size)
			result->more_waiting = true;
		ship_log(slot, result);
	}

	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
}

/* Relay 0's housekeeping, each step in its own short transaction. */
static void
run_maintenance(void)
{
	static const char *const steps[] = {
		"SELECT wal_delivery.expire_processing_leases()",
		"SELECT wal_delivery.purge_finished_rows(1000)",
		"SELECT wal_delivery.rotate_outbox_log()",
	};

	for (int i = 0; i < (int) lengthof(steps); i++)
	{
		int64 affected;

		do
		{
			SetCurrentStatementStartTimestamp();
			StartTransactionCommand();
			SPI_connect();
			PushActiveSnapshot(GetTransactionSnapshot());
			pgstat_report_activity(STATE_RUNNING, steps[i]);
			affected = 0;
			if (OidIsValid(get_extension_oid("wal_delivery", true)))
			{
				bool isnull;

				spi_exec_or_fail(steps[i], 0, NULL, NULL);
				affected = DatumGetInt32(
					SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
			}
			SPI_finish();
			PopActiveSnapshot();
			CommitTransactionCommand();
		} while (i == 1 && affected == 1000 && !ShutdownRequestPending);
	}
	pgstat_report_activity(STATE_IDLE, NULL);
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

/* SIGHUP: read the settings again. */
static void
reload_settings_if_asked(void)
{
	if (!ConfigReloadPending)
		return;
	ConfigReloadPending = false;
	ProcessConfigFile(PGC_SIGHUP);
	/* Kafka settings may have changed: build the producers again. */
	kafka_producers_destroy(relay_shutdown_flush_ms);
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

/* Relay 0's housekeeping, every maintenance_interval; not while the extension is missing. */
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

/* Sleeps up to wait_ms; a commit's wal_enqueue (relay_wakeup) or a signal ends it early. */
static void
wait_for_work(int wait_ms)
{
	if (wait_ms > 0)
	{
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, wait_ms,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
	CHECK_FOR_INTERRUPTS();
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
	BackgroundWorkerInitializeConnection(wal_delivery_database, NULL, 0);
	relay_wakeup_register_latch(slot, MyLatch);
	/*
	 * The log is never analyzed (autovacuum is off on it), and a stale estimate must not
	 * turn a lane's batch into a scan and sort of the whole log: the relay's queries walk
	 * indexes whatever the statistics say.
	 */
	SetConfigOption("enable_seqscan", "off", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("enable_bitmapscan", "off", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("enable_sort", "off", PGC_SUSET, PGC_S_OVERRIDE);
	/*
	 * And no JIT. A plan that keeps a disabled node (a seq scan of a small table such as
	 * topics or outbox_generations, a sort) costs 1e10 more per node, far above every
	 * jit_*_above_cost, so each such statement was compiled, inlined and optimized by LLVM
	 * on every execution: 100-900 ms a statement. Relay 0's maintenance runs several, so
	 * it stopped shipping for 0.3-1.5 s every maintenance_interval, and the records
	 * committed meanwhile waited: that was the log outbox's latency tail
	 * (bench/relay_latency). The relay's statements are all short; none gains from JIT.
	 */
	SetConfigOption("jit", "off", PGC_SUSET, PGC_S_OVERRIDE);
	ereport(LOG, (errmsg("wal_delivery relay %d started on database \"%s\"", slot,
						 wal_delivery_database)));

	while (!ShutdownRequestPending)
	{
		PassResult pass = {0};
		/* Read before a reload: a new idle interval applies from the next turn. */
		int idle_ms = relay_idle_interval_ms;
		int wait_ms;

		reload_settings_if_asked();
		wait_ms = ship_once(slot, &pass, &backoff_ms, idle_ms);
		maintain_when_due(slot, &pass, &next_maintenance);
		/*
		 * A relay that cannot ship (no Kafka settings, no extension) is not woken by
		 * commits: a reload or the idle interval ends its wait. Listening again before
		 * the next pass: a commit it did not wake is visible to that pass.
		 */
		relay_wakeup_listen(slot, kafka_producers_exist() && !pass.extension_missing);
		wait_for_work(wait_ms);
		relay_wakeup_listen(slot, true);
	}

	kafka_producers_destroy(relay_shutdown_flush_ms);
	ereport(LOG, (errmsg("wal_delivery relay %d stopped", slot)));
	/* Exit code 1: if this was pg_terminate_backend or DROP DATABASE (FORCE), come back. */
	proc_exit(1);
}
