/*
 * delivery_trace.h: the trace context of one delivery attempt.
 *
 * Every HTTP attempt to a destination (consume's first try, each retry step, the
 * half-open probe, a replay from the dead letters) is a span of its own in the record's
 * trace: the destination gets "traceparent: 00-<the record's trace id>-<a new span id>-
 * <the record's flags>" and the record's tracestate, and can join its logs to the
 * producer's trace. A record without a (valid) traceparent sends neither header.
 */
#ifndef WAL_DELIVERY_TRACE_H
#define WAL_DELIVERY_TRACE_H

#include <stdbool.h>

#include "handoff.h"
#include "header_lines.h"
#include "shared/trace_context.h"

typedef struct delivery_trace
{
	bool present;          /* the record has a trace context: the rest is set */
	trace_context parent;  /* the record's context (the span that enqueued it) */
	trace_context attempt; /* this attempt's span: parent's trace id and flags, a new span id */
} delivery_trace;

/* Starts the span of an attempt of m, with a span id from the kernel's random source. */
void delivery_trace_begin(const handoff_message *m, delivery_trace *out);

/* Adds the attempt's traceparent and the record's tracestate to h, when t is present. */
void delivery_trace_add_headers(header_lines *h, const delivery_trace *t, const handoff_message *m);

/*
 * Whether name is a header the attempt writes itself (traceparent, tracestate, any case):
 * a destination's configured headers of that name give way, so one is never sent twice.
 */
bool delivery_trace_header(const char *name);

#endif
