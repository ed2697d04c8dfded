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
