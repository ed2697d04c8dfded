/*
 * ingest_metrics.c: see ingest_metrics.h.
 */
#include "ingest_metrics.h"

#include <stddef.h>

ingest_metrics ingest_m;

void
ingest_metrics_register(void)
{
	static const char *const status[] = {"status"};
	static const char *const path[] = {"path"};
	static const char *const reason[] = {"reason"};
	static const char *const code[] = {"code"};
	static const double seconds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
									 0.1,   0.25,   0.5,   1,    2.5,   5};

	ingest_m.requests = metric_counter("wal_ingest_requests_total",
									   "HTTP requests answered, by status.", 1, status);
	ingest_m.records = metric_counter(
		"wal_ingest_records_total",
		"Records made durable, by path: kafka (acknowledged with the topic's acks, 201) or "
		"outbox (committed, 202).",
		1, path);
	ingest_m.fallbacks = metric_counter(
		"wal_ingest_fallbacks_total",
		"Records of plain topics sent to the outbox instead of Kafka, by reason.", 1, reason);
	ingest_m.late_acks = metric_counter(
		"wal_ingest_late_kafka_acks_total",
		"Records Kafka acknowledged after the outbox had taken them (they exist twice).", 0, NULL);
	ingest_m.failed_records = metric_counter(
		"wal_ingest_failed_records_total",
		"Records answered with an error after validation, by code (outcome_unknown: a copy "
		"may still be in Kafka).",
		1, code);
	ingest_m.request_seconds =
		metric_histogram("wal_ingest_request_seconds",
						 "Time from a request's arrival to its answer, by the path its records "
						 "took (kafka, outbox, mixed, none).",
						 (int) (sizeof(seconds) / sizeof(seconds[0])), seconds, 1, path);
	ingest_m.kafka_up =
		metric_gauge("wal_ingest_kafka_up",
					 "1 while Kafka acknowledges, 0 while records go to the outbox.", 0, NULL);
	ingest_m.outbox_up =
		metric_gauge("wal_ingest_outbox_up", "1 while the outbox database answers.", 0, NULL);
	ingest_m.outbox_batches = metric_counter("wal_ingest_outbox_batches_total",
											 "Calls of ingest_enqueue_batch.", 0, NULL);
	ingest_m.outbox_batch_records = metric_counter("wal_ingest_outbox_batch_records_total",
												   "Records written by those calls.", 0, NULL);
	ingest_m.outbox_write_seconds = metric_histogram(
		"wal_ingest_outbox_write_seconds",
		"Time of each ingest_enqueue_batch call (a writer's turn at the database, commit "
		"included).",
		(int) (sizeof(seconds) / sizeof(seconds[0])), seconds, 0, NULL);
	ingest_m.producer_restarts = metric_counter(
		"wal_ingest_kafka_producer_restarts_total",
		"Kafka producers replaced, by reason: fatal_error (the idempotent producer failed "
		"fatally) or bootstrap_changed.",
		1, reason);
}
