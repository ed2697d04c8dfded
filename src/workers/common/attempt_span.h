/*
 * attempt_span.h: the span of one delivery attempt ("wal_delivery deliver", kind CLIENT),
 * handed to the exporter (otlp_exporter.h) by whatever handles the attempt's answer
 * (consume, retry, the half-open probe).
 *
 * The span is the attempt's own (its span id is the one the destination got in its
 * traceparent), a child of the record's span, and covers the request from its start to
 * its answer or failure. Only for a sampled trace, and only while export is on.
 */
#ifndef WAL_ATTEMPT_SPAN_H
#define WAL_ATTEMPT_SPAN_H

#include "http_delivery.h"
#include "shared/trace_context.h"
#include "webhook.h"

typedef struct attempt_span
{
	const trace_context *record;  /* the record's context: the span's parent */
	const trace_context *attempt; /* the attempt's: its span id */
	const char *topic;            /* the record's source topic */
	const char *destination;
	const char *idempotency_key;
	int attempt_number; /* 1 for consume's; a retry step's count the ones before it */
	int retry_step;     /* 0 for consume, 1 to 3 for the retry steps */
} attempt_span;

/* Records the attempt's span with its answer and outcome; nothing when export is off. */
void attempt_span_record(const attempt_span *a, const http_result *result,
						 delivery_outcome outcome);

#endif
