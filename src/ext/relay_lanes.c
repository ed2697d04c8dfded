/*
 * relay_lanes.c: the log's part of a relay pass: its lanes and their cursors.
 *
 * The log (outbox_log) is written in lanes (outbox_log_layout.h); each lane has a cursor
 * in relay_cursors and is shipped by one relay. A pass reads, for each lane it owns, the
 * next batch after the lane's cursor, produces it, and once every report is in moves the
 * cursor in the same transaction, once per batch, never per record. A log record that was
 * not persisted is held: copied once into the row table, so the cursor moves on (unless
 * Kafka did not answer at all, when the cursor stays and the batch is read again), and
 * goes on there row by row (relay_rows.c). A crash before the commit leaves the cursors
 * unmoved, so the batch is sent again.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"

#include "outbox_log_layout.h"
#include "relay_lanes.h"
#include "worker_spi.h"
#include "relay_wakeup.h"
#include "settings.h"

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
 * snapshot and not in done_snap. The ordered subquery walks the log's order index,
 * (log_order(lane, xid), id), from the cursor to the window's xmax in the lane, so a batch
 * costs the same however long the log is; the relay's planner settings
 * (wal_delivery_relay_main) keep any other plan away whatever the statistics say.
 */
#define LOG_ORDER "wal_delivery.log_order(l.lane, l.xid)"
static const char lane_batch_sql[] =
	"SELECT " SHIPPED_RECORD_COLUMNS ", c.xid::text"
	"  FROM (SELECT l.* FROM wal_delivery.outbox_log l"
	"         WHERE (" LOG_ORDER ", l.id) > (wal_delivery.log_order($1, $4), $5)"
	"           AND " LOG_ORDER " < wal_delivery.log_order($1, pg_snapshot_xmax($2))"
	"           AND pg_visible_in_snapshot(l.xid, $2)"
	"           AND NOT pg_visible_in_snapshot(l.xid, $3)"
	"         ORDER BY " LOG_ORDER ", l.id LIMIT $6) c" SHIPPED_RECORD_JOINS;

#define LANE_XID_COLUMN (SHIPPED_COLUMNS + 1)

static char *
row_xid(const ClaimedRows *rows, int i)
{
	return SPI_getvalue(rows->tt->vals[i], rows->tt->tupdesc, LANE_XID_COLUMN);
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
	read_and_produce_rows(&b->rows);
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

			bool in_flight = row_in_flight(rows, i);

			if ((rows->fate[i] != ROW_PRODUCED && !in_flight) || row_persisted(rows, i) ||
				is_unshippable(err))
				return false;
			if (reason == NULL)
			{
				reason = psprintf("%s (topic \"%s\")",
								  in_flight ? IN_FLIGHT_REASON : not_taken_reason(err),
								  row_topic(rows, i));
				kafka_down = in_flight || is_kafka_down(err);
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

		values[3] = CStringGetTextDatum(row_xid(rows, rows->n - 1));
		values[4] = SPI_getbinval(last, rows->tt->tupdesc, SHIPPED_ID, &isnull);
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
		if (row_persisted(rows, i))
			continue;
		held[n_held] = rows->deliveries[i].outbox_id;
		held_xids[n_held++] = CStringGetTextDatum(row_xid(rows, i));
	}
	if (n_held > 0)
	{
		Oid types[2] = {INT8ARRAYOID, TEXTARRAYOID};
		Datum values[2] = {int8_array(held, n_held), text_array(held_xids, n_held)};

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
	result->in_flight += lane.in_flight;
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
 * Reads and produces each lane's batch, waits once for all reports, then holds
 * what Kafka did not take and moves the cursors. Stored therefore means: the cursor moved
 * past it in a committed transaction, after Kafka's acknowledgement.
 */
void
ship_log(int slot, uint32 marks, PassResult *result)
{
	LaneBatch lanes[LOG_LANES];
	int n_lanes = 0;
	bool read_any = false;

	for (int lane = 0; lane < LOG_LANES; lane++)
	{
		if (relay_slot_of_lane(lane) != slot || (marks & RELAY_MARK_LANE(lane)) == 0)
			continue;
		memset(&lanes[n_lanes], 0, sizeof(LaneBatch));
		lanes[n_lanes].lane = lane;
		lanes[n_lanes].limit = relay_batch_size;
		read_lane(&lanes[n_lanes]);
		read_any |= lanes[n_lanes].rows.n > 0;
		n_lanes++;
	}
	relay_count_pass(n_lanes);
	if (read_any)
	{
		wait_for_delivery_reports();
		for (int l = 0; l < n_lanes; l++)
			take_late_reports(&lanes[l].rows);
		if (lanes_wait(lanes, n_lanes, result))
			return;
	}
	/* A fresh window with nothing in it costs no write. */
	for (int l = 0; l < n_lanes; l++)
		finish_lane(&lanes[l], result);
}
