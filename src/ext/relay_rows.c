/*
 * relay_rows.c: the row table's part of a relay pass, and the handling of delivery
 * reports that the log's lanes share.
 *
 * The claim takes a batch of ready rows (SKIP LOCKED, so relays side by side never share
 * a row); each is produced with its headers, and once every delivery report is in, in
 * the same transaction, exactly the rows whose report says persisted are marked stored.
 * Anything else stays unshipped: rows of a topic Kafka does not have wait (written once)
 * until the reconciler creates it; rows Kafka did not take are tried again later, without
 * being rewritten, while their topic is passed over (failing_topics.c); a row Kafka can
 * never take (too large) is dead. A crash at any point leaves the claimed rows unmarked,
 * so they are sent again.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "pgstat.h"
#include "postmaster/interrupt.h"
#include "utils/builtins.h"

#include "failing_topics.h"
#include "kafka_inflight.h"
#include "otlp_sender.h"
#include "relay_rows.h"
#include "relay_spans.h"
#include "worker_spi.h"
#include "settings.h"

static const char claim_sql[] =
	"SELECT " SHIPPED_RECORD_COLUMNS
	"  FROM wal_delivery.claim_ready_to_ship($1, $2) c" SHIPPED_RECORD_JOINS;

/*
 * Kafka will never take these: the record itself is refused (too large, or arguments
 * librdkafka rejects). Everything else about a topic (authorization, replicas, leaders)
 * can be fixed in the cluster, so its records wait.
 */
bool
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
bool
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

const char *
not_taken_reason(rd_kafka_resp_err_t err)
{
	return err != RD_KAFKA_RESP_ERR_NO_ERROR ? rd_kafka_err2str(err)
											 : "Kafka reported the record as possibly persisted";
}

char *
row_topic(const ClaimedRows *rows, int i)
{
	return SPI_getvalue(rows->tt->vals[i], rows->tt->tupdesc, SHIPPED_TOPIC);
}

bool
row_persisted(const ClaimedRows *rows, int i)
{
	const KafkaDelivery *d = &rows->deliveries[i];

	return rows->fate[i] == ROW_PRODUCED && d->err == RD_KAFKA_RESP_ERR_NO_ERROR &&
		   d->status == RD_KAFKA_MSG_STATUS_PERSISTED;
}

static void
init_claimed_rows(ClaimedRows *rows)
{
	int n = (int) SPI_processed;

	rows->n = n;
	rows->tt = SPI_tuptable;
	rows->deliveries = kafka_deliveries_alloc(n);
	rows->stored = palloc(sizeof(int64) * Max(n, 1));
	rows->noted = palloc(sizeof(int64) * Max(n, 1));
	rows->fate = palloc0(sizeof(RowFate) * Max(n, 1));
	rows->noted_reasons = palloc(sizeof(Datum) * Max(n, 1));
	rows->n_noted = 0;
	rows->waiting = palloc(sizeof(int64) * Max(n, 1));
	rows->waiting_topic = rows->waiting_reason = NULL;
}

/* Reads row i into rec and its delivery's outbox id; says whether to produce it. */
static RowFate
read_claimed_row(ClaimedRows *rows, int i, KafkaRecord *rec)
{
	HeapTuple tup = rows->tt->vals[i];
	TupleDesc desc = rows->tt->tupdesc;
	bool isnull;
	bytea *payload;

	rows->deliveries[i].outbox_id = DatumGetInt64(SPI_getbinval(tup, desc, SHIPPED_ID, &isnull));
	rec->topic = SPI_getvalue(tup, desc, SHIPPED_TOPIC);
	rec->idempotency_key = SPI_getvalue(tup, desc, SHIPPED_IDEMPOTENCY_KEY);
	rec->key = SPI_getvalue(tup, desc, SHIPPED_MESSAGE_KEY);
	rec->headers_json = SPI_getvalue(tup, desc, SHIPPED_HEADERS);
	rec->content_type = SPI_getvalue(tup, desc, SHIPPED_CONTENT_TYPE);
	payload = DatumGetByteaPP(SPI_getbinval(tup, desc, SHIPPED_PAYLOAD, &isnull));
	rec->value = VARDATA_ANY(payload);
	rec->value_len = VARSIZE_ANY_EXHDR(payload);
	rec->created_at = SPI_getvalue(tup, desc, SHIPPED_CREATED_AT);
	rec->acks = DatumGetInt16(SPI_getbinval(tup, desc, SHIPPED_ACKS, &isnull));
	if (isnull)
	{
		/* The topic was deleted (forced) after this row was enqueued. */
		return ROW_TOPIC_DELETED;
	}
	/* Produce only to topics Kafka has, never to ones a produce would auto-create. */
	if (!DatumGetBool(SPI_getbinval(tup, desc, SHIPPED_IN_KAFKA, &isnull)))
		return ROW_TOPIC_MISSING;
	return ROW_PRODUCED;
}

bool
row_in_flight(const ClaimedRows *rows, int i)
{
	return rows->fate[i] == ROW_IN_FLIGHT ||
		   (rows->fate[i] == ROW_PRODUCED && !rows->deliveries[i].reported);
}

/*
 * One librdkafka refuses at once counts as reported. A record an earlier pass sent is not
 * produced again until its report came (then that report is this pass's).
 */
void
read_and_produce_rows(ClaimedRows *rows)
{
	init_claimed_rows(rows);
	for (int i = 0; i < rows->n; i++)
	{
		KafkaRecord rec;
		rd_kafka_resp_err_t err;

		rows->fate[i] = read_claimed_row(rows, i, &rec);
		if (rows->fate[i] != ROW_PRODUCED)
			continue;
		switch (kafka_inflight_take(rows->deliveries[i].outbox_id, &rows->deliveries[i]))
		{
			case INFLIGHT_WAITING:
				rows->fate[i] = ROW_IN_FLIGHT;
				continue;
			case INFLIGHT_REPORTED:
				continue;
			case INFLIGHT_NONE:
				break;
		}
		err = kafka_produce(&rec, &rows->deliveries[i]);
		if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			rows->deliveries[i].reported = true;
			rows->deliveries[i].err = err;
			rows->deliveries[i].status = RD_KAFKA_MSG_STATUS_NOT_PERSISTED;
		}
	}
}

void
wait_for_delivery_reports(void)
{
	int wait_ms;

	pgstat_report_activity(STATE_RUNNING, "wal_delivery relay: waiting for Kafka");
	/*
	 * The acks=1 producer reports every message within message.timeout.ms (the delivery
	 * timeout); the idempotent one's outlive a pass that waited that long and are handed
	 * off (kafka_inflight.h). Stopping shortens the wait.
	 */
	wait_ms = ShutdownRequestPending ? relay_shutdown_flush_ms : relay_delivery_timeout_ms + 5000;
	kafka_wait_for_deliveries(wait_ms, relay_shutdown_flush_ms);
}

void
take_late_reports(ClaimedRows *rows)
{
	for (int i = 0; i < rows->n; i++)
		if (rows->fate[i] == ROW_IN_FLIGHT &&
			kafka_inflight_take(rows->deliveries[i].outbox_id, &rows->deliveries[i]) ==
				INFLIGHT_REPORTED)
			rows->fate[i] = ROW_PRODUCED;
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
	const char *topic = row_topic(rows, i);
	bool in_flight = row_in_flight(rows, i);
	const char *why = in_flight ? IN_FLIGHT_REASON : not_taken_reason(d->err);

	if (in_flight)
		result->in_flight++;
	if (topic_failing_streak_starts(topic))
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
		result->kafka_down = in_flight || is_kafka_down(d->err);
	}
}

void
sort_claimed_rows(ClaimedRows *rows, PassResult *result)
{
	for (int i = 0; i < rows->n; i++)
	{
		KafkaDelivery *d = &rows->deliveries[i];

		if (rows->fate[i] == ROW_TOPIC_MISSING)
		{
			if (rows->waiting_topic == NULL)
			{
				rows->waiting_topic = row_topic(rows, i);
				rows->waiting_reason =
					SPI_getvalue(rows->tt->vals[i], rows->tt->tupdesc, SHIPPED_KAFKA_ERROR);
			}
			rows->waiting[result->waiting++] = d->outbox_id;
		}
		else if (row_in_flight(rows, i))
		{
			/*
			 * Its first attempt may still be acknowledged: deferred like a refusal (its
			 * topic passed over, the reason noted once), but a later pass takes its report
			 * instead of producing it again.
			 */
			defer_row(rows, i, result);
		}
		else if (rows->fate[i] == ROW_TOPIC_DELETED)
		{
			mark_unshippable(d->outbox_id, "topic no longer exists in wal_delivery.topics");
			result->unshippable++;
		}
		else if (d->err == RD_KAFKA_RESP_ERR_NO_ERROR && d->status == RD_KAFKA_MSG_STATUS_PERSISTED)
		{
			topic_shipped(row_topic(rows, i));
			rows->stored[result->stored++] = d->outbox_id;
			if (otlp_sender_enabled)
				relay_span_for_row(rows, i);
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
void
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
						   text_array(rows->noted_reasons, rows->n_noted)};

		spi_exec_or_fail("SELECT wal_delivery.note_shipping_failures($1, $2)", 2, types, values);
	}
}

/*
 * The claim passes over the failing topics whose retry time has not come. Every row needs
 * its report before anything is marked: only persisted means stored.
 */
void
ship_claimed_rows(PassResult *result)
{
	Oid types[2] = {INT4OID, TEXTARRAYOID};
	Datum values[2];
	char nulls[2] = {' ', ' '};
	bool no_skip;
	ClaimedRows rows;
	static SPIPlanPtr claim_plan = NULL;

	/* Rows in flight are claimed (and skipped) on top of a batch, never instead of one. */
	int limit = relay_batch_size + kafka_inflight_count();

	values[0] = Int32GetDatum(limit);
	values[1] = topics_to_pass_over(&no_skip);
	nulls[1] = no_skip ? 'n' : ' ';
	spi_exec_kept(&claim_plan, claim_sql, 2, types, values, nulls);
	if (SPI_processed == 0)
		return;
	read_and_produce_rows(&rows);
	result->claimed = rows.n;
	wait_for_delivery_reports();
	take_late_reports(&rows);
	sort_claimed_rows(&rows, result);
	write_sorted_rows(&rows, result);
	if (result->claimed == limit)
		result->more_waiting = true;
}
