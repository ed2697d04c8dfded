/*
 * trace_context.h: W3C Trace Context (the traceparent and tracestate headers) as a record
 * carries it. One rule for the extension (wal_enqueue's headers, the session setting)
 * and wal-worker (the ingest request's header, each delivery attempt's header).
 *
 * traceparent is "VV-TTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTT-PPPPPPPPPPPPPPPP-FF": version,
 * trace id (32 lowercase hex, not all zero), parent span id (16 lowercase hex, not all
 * zero), flags (bit 0: sampled). Version ff is invalid; version 00 is exactly 55
 * characters; a later version may add fields after a '-' and is read as 00.
 */
#ifndef WAL_TRACE_CONTEXT_H
#define WAL_TRACE_CONTEXT_H

#include <stdbool.h>
#include <stddef.h>

/* The record header names the context travels under (header names are lowercase). */
#define TRACEPARENT_HEADER "traceparent"
#define TRACESTATE_HEADER  "tracestate"

#define TRACE_ID_HEX 32
#define SPAN_ID_HEX  16
/* A version 00 traceparent, without its terminating NUL. */
#define TRACEPARENT_LENGTH 55
/* The longest tracestate a record may carry (the W3C limit a vendor must propagate). */
#define TRACESTATE_MAX 512

typedef struct trace_context
{
	char trace_id[TRACE_ID_HEX + 1]; /* lowercase hex, NUL-terminated */
	char span_id[SPAN_ID_HEX + 1];
	unsigned char flags;
} trace_context;

/*
 * Reads a traceparent of len bytes (not NUL-terminated). On success fills *out and
 * returns NULL; otherwise returns what is wrong, for an error message or a log line.
 */
const char *trace_context_parse(const char *value, size_t len, trace_context *out);

/* NULL when value (len bytes) may be a tracestate, otherwise what is wrong with it. */
const char *tracestate_check(const char *value, size_t len);

/*
 * The context of a new span in parent's trace: the same trace id and flags, a span id
 * made from 8 random bytes the caller draws (from its own strong random source).
 * Random bytes that are all zero are changed so the span id is valid.
 */
void trace_context_child(const trace_context *parent, const unsigned char random8[8],
						 trace_context *child);

/* Writes the version 00 traceparent of tc into out (TRACEPARENT_LENGTH + 1 bytes). */
void trace_context_format(const trace_context *tc, char out[TRACEPARENT_LENGTH + 1]);

/* Whether the sampled flag is set: a span is exported only for a sampled trace. */
static inline bool
trace_context_sampled(const trace_context *tc)
{
	return (tc->flags & 0x01) != 0;
}

#endif
