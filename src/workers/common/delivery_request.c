/*
 * delivery_request.c: see delivery_request.h.
 */
#include "delivery_request.h"

#include <time.h>

#include "log.h"
#include "webhook.h"

static void
add_request_headers(header_lines *h, const destination_config *d, const handoff_message *m,
					int attempt)
{
	const char *name;
	json_t *value;

	header_lines_add(h, "Content-Type",
					 m->content_type ? m->content_type : "application/octet-stream");
	header_lines_add(h, "Idempotency-Key", m->idempotency_key);
	header_lines_add(h, "X-Wal-Topic", m->source_topic);
	if (m->outbox_id)
		header_lines_add(h, "X-Wal-Outbox-Id", m->outbox_id);
	header_lines_add_long(h, "X-Wal-Attempt", attempt);
	json_object_foreach(d->headers, name, value)
	{
		if (json_is_string(value))
			header_lines_add(h, name, json_string_value(value));
	}
	if (d->signing_secret &&
		!webhook_add_header_lines(h, d->signing_secret, m->idempotency_key, (long) time(NULL),
								  m->payload, m->payload_len))
		log_warn("event=signing_failed destination=%s key=%s msg=\"sending unsigned\"", d->name,
				 m->idempotency_key);
}

http_request
delivery_request(const destination_config *d, const handoff_message *m, int attempt,
				 header_lines *headers)
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
	add_request_headers(headers, d, m, attempt);
	req.headers = headers->text;
	if (headers->failed)
		req.url = NULL; /* out of memory: never send without its headers; submit refuses it */
	return req;
}
