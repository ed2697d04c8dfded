/*
 * enqueue_trace.h: the session's trace context (wal_delivery.traceparent and
 * .tracestate) into the records wal_enqueue* take, so an app that already traces its
 * transaction passes the context without changing its calls.
 */
#ifndef ENQUEUE_TRACE_H
#define ENQUEUE_TRACE_H

#include "postgres.h"

#include "utils/jsonb.h"

#include "settings.h"

/* Whether the session set a traceparent: the door reads this once per call. */
static inline bool
enqueue_trace_set(void)
{
	return wal_delivery_traceparent != NULL && wal_delivery_traceparent[0] != '\0';
}

/*
 * headers with the session's traceparent (and tracestate, when set) added, or headers
 * itself when it names a traceparent of its own (in any case) or is not a JSON object
 * (the record contract refuses that). NULL headers: an object of the two alone.
 */
Jsonb *enqueue_trace_headers(Jsonb *headers);

#endif
