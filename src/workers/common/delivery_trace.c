/*
 * delivery_trace.c: an attempt's span in the record's trace (see delivery_trace.h).
 */
#include "delivery_trace.h"

#include <string.h>
#include <strings.h>

#include "random_bytes.h"

void
delivery_trace_begin(const handoff_message *m, delivery_trace *out)
{
	unsigned char random8[8];

	memset(out, 0, sizeof(*out));
	if (!m->has_trace)
		return;
	random_bytes(random8, sizeof(random8));
	out->present = true;
	out->parent = m->trace;
	trace_context_child(&m->trace, random8, &out->attempt);
}

void
delivery_trace_add_headers(header_lines *h, const delivery_trace *t, const handoff_message *m)
{
	char traceparent[TRACEPARENT_LENGTH + 1];

	if (!t->present)
		return;
	trace_context_format(&t->attempt, traceparent);
	header_lines_add(h, "traceparent", traceparent);
	/* The record's own, as the doors checked it: at most 512 printable ASCII characters. */
	if (m->tracestate != NULL && m->tracestate[0] != '\0' &&
		tracestate_check(m->tracestate, strlen(m->tracestate)) == NULL)
		header_lines_add(h, "tracestate", m->tracestate);
}

bool
delivery_trace_header(const char *name)
{
	return strcasecmp(name, TRACEPARENT_HEADER) == 0 || strcasecmp(name, TRACESTATE_HEADER) == 0;
}
