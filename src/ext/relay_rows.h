/*
 * relay_rows.h: what one relay pass ships, and the row table's part of it (relay_rows.c).
 *
 * The log's lanes (relay_lanes.c) ship their batches with the same ClaimedRows: read,
 * produced, sorted by their delivery reports.
 */
#ifndef RELAY_ROWS_H
#define RELAY_ROWS_H

#include "postgres.h"

#include "executor/spi.h"

#include "kafka_producer.h"

/* What a pass did, for the relay's state and its next wait. */
typedef struct PassResult
{
	int claimed;
	int stored;
	int deferred; /* Kafka did not take them: tried again later */
	int waiting;  /* their topic is not in Kafka: they wait for it */
	int unshippable;
	int in_flight; /* sent by a pass, no report yet: not sent again (also deferred) */
	bool extension_missing;
	bool kafka_down;   /* the first deferred row's error says Kafka did not answer */
	char *reason;      /* why the first deferred row was not stored */
	bool more_waiting; /* a batch was full: go again at once */
} PassResult;

/*
 * The columns a pass reads of each record it ships, from the row table's claim or a
 * lane of the log (aliased c), with the topic's row (t) and its Kafka state (k). The
 * lane's batch adds the record's xid after them.
 */
#define SHIPPED_RECORD_COLUMNS                                                                     \
	"c.id, c.topic, c.idempotency_key, c.message_key, c.headers::text, c.content_type,"            \
	" c.payload, to_char(c.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),"   \
	" t.acks, coalesce(k.in_kafka, false), k.error"
#define SHIPPED_RECORD_JOINS                                                                       \
	" LEFT JOIN wal_delivery.topics t ON t.name = c.topic"                                         \
	" LEFT JOIN wal_delivery.kafka_topics k ON k.topic = c.topic AND k.role = 'main'"

/* Their numbers (SPI's, from 1). */
enum
{
	SHIPPED_ID = 1,
	SHIPPED_TOPIC,
	SHIPPED_IDEMPOTENCY_KEY,
	SHIPPED_MESSAGE_KEY,
	SHIPPED_HEADERS,
	SHIPPED_CONTENT_TYPE,
	SHIPPED_PAYLOAD,
	SHIPPED_CREATED_AT,
	SHIPPED_ACKS,
	SHIPPED_IN_KAFKA,
	SHIPPED_KAFKA_ERROR,
	SHIPPED_COLUMNS = SHIPPED_KAFKA_ERROR
};

/* Why a record read is not produced in this pass. */
typedef enum
{
	ROW_PRODUCED,
	ROW_TOPIC_DELETED, /* no longer in wal_delivery.topics: dead */
	ROW_TOPIC_MISSING, /* not in Kafka (yet): it waits until the reconciler creates it */
	ROW_IN_FLIGHT      /* an earlier pass sent it and has no report yet (kafka_inflight.h) */
} RowFate;

/* The records one statement read (SPI_tuptable), and what became of each on the way. */
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

/* Claims a batch of the row table, ships it and marks it, inside the pass transaction. */
void ship_claimed_rows(PassResult *result);

/* Takes the last statement's rows (SPI_tuptable) and produces every one that may be. */
void read_and_produce_rows(ClaimedRows *rows);

/* Waits for the delivery report of everything produced (shorter when stopping). */
void wait_for_delivery_reports(void);

/* After the wait: the rows in flight whose report came meanwhile take it as theirs. */
void take_late_reports(ClaimedRows *rows);

/* Whether row i is in flight: sent, no report yet (this pass's or an earlier one's). */
bool row_in_flight(const ClaimedRows *rows, int i);

/* Why a pass leaves records in flight, for the log. */
#define IN_FLIGHT_REASON "no acknowledgement yet; librdkafka keeps retrying the first attempt"

/*
 * Sorts each row by its fate and delivery report (dead rows are marked at once), then
 * writes the others with one statement per kind.
 */
void sort_claimed_rows(ClaimedRows *rows, PassResult *result);
void write_sorted_rows(const ClaimedRows *rows, const PassResult *result);

/* Whether Kafka persisted row i; its topic. */
bool row_persisted(const ClaimedRows *rows, int i);
char *row_topic(const ClaimedRows *rows, int i);

/* Kafka will never take the record / no broker answered. */
bool is_unshippable(rd_kafka_resp_err_t err);
bool is_kafka_down(rd_kafka_resp_err_t err);

/* Why Kafka did not take a record, for the log and the row's last error. */
const char *not_taken_reason(rd_kafka_resp_err_t err);

#endif
