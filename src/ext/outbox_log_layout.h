/*
 * outbox_log_layout.h: the shape of the log outbox (wal_delivery.outbox_log,
 * sql/src/outbox.sql) as the C code knows it, written once.
 *
 * log_writer.c inserts into it column by column and checks on every open that the
 * table still has these columns; enqueue_lookup.c looks keys up in its generations;
 * the relay reads it lane by lane. When outbox.sql changes the table, this file changes
 * with it, and log_writer_open refuses a table of another shape.
 */
#ifndef OUTBOX_LOG_LAYOUT_H
#define OUTBOX_LOG_LAYOUT_H

/* The generations (partitions by gen) that rotate_outbox_log cycles through. */
#define LOG_GENERATIONS 3
#define LOG_GENERATION_TABLES                                                                      \
	{                                                                                              \
		"outbox_log_0", "outbox_log_1", "outbox_log_2"                                             \
	}

/*
 * The lanes: each lane has its cursor (relay_cursors) and is shipped by one relay. Runs of
 * LOG_LANE_RUN consecutive ids share a lane, so the few records a pass finds at a steady
 * rate are mostly in one lane: one cursor to read and move per pass, not one per record
 * (each move is a row update, WAL included). The runs take the lanes in turn, so relays
 * side by side share the load. SQL has the same rule as wal_delivery.log_lane(id).
 */
#define LOG_LANES       8
#define LOG_LANE_RUN    64
#define log_lane_of(id) ((int) (((id) / LOG_LANE_RUN) % LOG_LANES))

/*
 * A log record's place in the relay's order, as one bigint: its lane in the top byte, its
 * transaction's xid8 below (an xid8 needs 2^56 transactions to reach the lane's bits), so
 * (log_order, id) sorts as (lane, xid, id) did. The index is on (log_order, id): 16 B of
 * key against 24 for (lane, xid, id) with its padding, so more entries a page and fewer
 * splits (docs/design.md). SQL has it as wal_delivery.log_order(lane, xid).
 */
#define LOG_ORDER_XID_BITS      56
#define log_order_of(lane, xid) ((int64) (((uint64) (lane) << LOG_ORDER_XID_BITS) | (uint64) (xid)))

/* outbox_log's columns in table order. */
typedef enum LogColumn
{
	LOG_COL_GEN,
	LOG_COL_LANE,
	LOG_COL_CALLER_KEY,
	LOG_COL_XID,
	LOG_COL_ID,
	LOG_COL_CREATED_AT,
	LOG_COL_ENQUEUED_BY,
	LOG_COL_ENQUEUED_BY_SESSION,
	LOG_COL_TOPIC,
	LOG_COL_IDEMPOTENCY_KEY,
	LOG_COL_MESSAGE_KEY,
	LOG_COL_CONTENT_TYPE,
	LOG_COL_HEADERS,
	LOG_COL_PAYLOAD,
	LOG_COLUMNS
} LogColumn;

/* Their names, in the same order. */
#define LOG_COLUMN_NAMES                                                                           \
	{                                                                                              \
		"gen", "lane", "caller_key", "xid", "id", "created_at", "enqueued_by",                     \
			"enqueued_by_session", "topic", "idempotency_key", "message_key", "content_type",      \
			"headers", "payload"                                                                   \
	}

#endif
