/*
 * otlp_exporter.h: exporting the worker's spans over OTLP/HTTP (--otlp-endpoint), off by
 * default.
 *
 * A call site hands over a finished span with otlp_span_record(): it is copied into a
 * bounded queue and the caller goes on; nothing a collector does (down, slow, hung) ever
 * reaches the delivery path. One background thread sends the queue in batches (up to
 * OTLP_BATCH_SPANS spans, or whatever is there every second) as POST <endpoint>/v1/traces
 * with a JSON ExportTraceServiceRequest (src/shared/otlp_span.h). What cannot be sent is
 * dropped and counted, never retried: a span is worth less than the delivery it describes.
 *
 * Metrics (only while export is on): wal_otlp_spans_exported_total,
 * wal_otlp_spans_dropped_total{reason="queue_full"|"export_failed"|"shutdown"},
 * wal_otlp_export_requests_failed_total.
 */
#ifndef WAL_OTLP_EXPORTER_H
#define WAL_OTLP_EXPORTER_H

#include <stdbool.h>

#include "shared/otlp_span.h"

#define OTLP_QUEUE_SPANS 4096 /* spans waiting; a newer one is dropped when it is full */
#define OTLP_BATCH_SPANS 512  /* spans per request */

/*
 * Starts the export thread for endpoint (checked by the option parser), naming the
 * resource's service "wal-worker" with the role. Call once from main, before any other
 * thread starts (it calls curl_global_init). False, logged, when the thread cannot start.
 */
bool otlp_exporter_start(const char *endpoint, const char *role);

/* Whether spans are exported: call sites build no span when not. */
bool otlp_exporter_enabled(void);

/* Copies span into the queue, or drops and counts it when the queue is full. */
void otlp_span_record(const otlp_span *span);

/*
 * Sends what is queued, for at most a few seconds, then stops the thread; spans still
 * queued are dropped (reason "shutdown"). Nothing happens when export is off.
 */
void otlp_exporter_stop(void);

#endif
