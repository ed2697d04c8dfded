/*
 * log_writer.h: records into one generation of the outbox log (outbox_log_<gen>) with
 * heap and index inserts of their own, without a query (see log_writer.c).
 */
#ifndef LOG_WRITER_H
#define LOG_WRITER_H

#include "postgres.h"

#include "utils/jsonb.h"

/* One log record's columns, less those the writer fills (gen, lane, xid, created_at). */
typedef struct LogRecord
{
	int64 id;
	bool caller_key; /* idempotency_key is the caller's: the dedupe index holds it */
	text *topic;
	text *idempotency_key;
	text *message_key; /* NULL: none */
	text *content_type;
	Jsonb *headers; /* NULL: none */
	bytea *payload;
} LogRecord;

typedef struct LogWriter LogWriter;

/* Opens generation gen (0-2) for inserts, locked to the end of the transaction. */
LogWriter *log_writer_open(int gen);

/*
 * Inserts record, and wakes its lane's relay at commit; false when a record with the
 * same caller's key is already in the generation, committed or written earlier by this
 * transaction (nothing is written). A concurrent transaction writing the key is waited
 * for, as ON CONFLICT DO NOTHING does.
 */
bool log_writer_insert(LogWriter *writer, const LogRecord *record);

void log_writer_close(LogWriter *writer);

#endif
