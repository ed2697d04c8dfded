/*
 * attempt_span.c: a delivery attempt's span, from its answer (attempt_span.h).
 */
#include "common/attempt_span.h"

#include <time.h>

#include "common/otlp_exporter.h"

void
attempt_span_record(const attempt_span *a, const http_result *result, delivery_outcome outcome)
{
	otlp_span span;
	struct timespec now;
	uint64_t elapsed_ns = (uint64_t) (result->elapsed_ms > 0 ? result->elapsed_ms : 0) * 1000000u;

	if (!otlp_exporter_enabled() || !trace_context_sampled(a->record))
		return;
	otlp_span_start(&span, a->record, a->attempt->span_id, "wal_delivery deliver",
					OTLP_KIND_CLIENT);
	clock_gettime(CLOCK_REALTIME, &now);
	span.end_unix_nano = (uint64_t) now.tv_sec * 1000000000u + (uint64_t) now.tv_nsec;
	span.start_unix_nano = span.end_unix_nano - elapsed_ns;
	otlp_span_add_string(&span, "wal.topic", a->topic);
	otlp_span_add_string(&span, "wal.destination", a->destination);
	if (result->http_status != 0)
		otlp_span_add_int(&span, "http.response.status_code", result->http_status);
	otlp_span_add_int(&span, "wal.attempt", a->attempt_number);
	otlp_span_add_int(&span, "wal.retry_step", a->retry_step);
	otlp_span_add_string(&span, "wal.idempotency_key", a->idempotency_key);
	otlp_span_add_string(&span, "wal.outcome", delivery_outcome_name(outcome));
	otlp_span_set_status(&span, outcome == DELIVERY_SUCCESS ? OTLP_STATUS_OK : OTLP_STATUS_ERROR,
						 result->error);
	otlp_span_record(&span);
}
