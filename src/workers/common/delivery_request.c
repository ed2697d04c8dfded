/*
 * delivery_request.c: see delivery_request.h.
 */
#include "delivery_request.h"

#include <stdio.h>
#include <time.h>

#include "log.h"
#include "webhook.h"

bool
record_identity(const handoff_message *m, char *out, size_t size)
{
	int n = snprintf(out, size, "%s:%s", m->source_topic, m->idempotency_key);

	return n > 0 && (size_t) n < size;
}

const char *
delivery_refusal(const destination_config *d, const handoff_message *m)
{
	char identity[RECORD_IDENTITY_SIZE];

	if (!record_identity(m, identity, sizeof(identity)))
		return "the record's topic and idempotency key are too long to identify it";
	if (d->signing_secret != NULL && !d->secret_unavailable && !webhook_id_is_signable(identity))
		return "cannot sign the copy: its idempotency key holds a control character or is too "
			   "long, and a destination with a secret never gets an unsigned copy";
	return NULL;
}

static void
add_request_headers(header_lines *h, const destination_config *d, const handoff_message *m,
					int attempt, const delivery_trace *trace)
{
	char identity[RECORD_IDENTITY_SIZE];
	const char *name;
	json_t *value;

	/* delivery_refusal has turned away what does not fit or cannot be signed. */
	if (!record_identity(m, identity, sizeof(identity)))
		h->failed = true;
	header_lines_add(h, "Content-Type",
					 m->content_type ? m->content_type : "application/octet-stream");
	header_lines_add(h, "Idempotency-Key", identity);
	header_lines_add(h, "X-Wal-Topic", m->source_topic);
	if (m->outbox_id)
		header_lines_add(h, "X-Wal-Outbox-Id", m->outbox_id);
	header_lines_add_long(h, "X-Wal-Attempt", attempt);
	json_object_foreach(d->headers, name, value)
	{
		/* The attempt's own trace context replaces a configured one: never two. */
		if (json_is_string(value) && !(trace->present && delivery_trace_header(name)))
			header_lines_add(h, name, json_string_value(value));
	}
	delivery_trace_add_headers(h, trace, m);
	if (d->signing_secret &&
		!webhook_add_header_lines(h, d->signing_secret, identity, (long) time(NULL), m->payload,
								  m->payload_len))
	{
		/* Never sent unsigned: a failed header set makes the request unsendable. */
		log_message(LOG_ERROR, m,
					"event=signing_failed destination=%s msg=\"not sent: a destination with a "
					"secret gets only signed copies\"",
					d->name);
		h->failed = true;
	}
}

http_request
delivery_request(const destination_config *d, const handoff_message *m, int attempt,
				 delivery_trace *trace, header_lines *headers)
{
	http_request req = {
		.destination = d->name,
		.max_in_flight = d->max_in_flight,
		.method = d->method,
		.url = d->endpoint,
		.body = m->payload,
		.body_len = m->payload_len,
		.timeout_ms = d->timeout_ms,
		.verify_tls = d->verify_tls,
	};

	header_lines_init(headers);
	delivery_trace_begin(m, trace);
	add_request_headers(headers, d, m, attempt, trace);
	req.headers = headers->text;
	if (headers->failed)
		req.url = NULL; /* never send without all its headers; submit refuses it */
	return req;
}
