/*
 * ingest_metrics.h: the ingest service's metrics, registered once at start.
 */
#ifndef WAL_INGEST_METRICS_H
#define WAL_INGEST_METRICS_H

#include "common/metrics.h"

typedef struct ingest_metrics
{
	metric *requests;        /* {status} */
	metric *records;         /* {path}: kafka, outbox */
	metric *fallbacks;       /* {reason} */
	metric *late_acks;       /* acknowledged by Kafka after the outbox took the record */
	metric *failed_records;  /* {code} */
	metric *request_seconds; /* histogram {path} */
	metric *kafka_up;
	metric *outbox_up;
	metric *outbox_batches;
	metric *outbox_batch_records;
	metric *outbox_write_seconds;
	metric *producer_restarts; /* {reason}: fatal_error, bootstrap_changed */
} ingest_metrics;

extern ingest_metrics ingest_m;

void ingest_metrics_register(void);

#endif
