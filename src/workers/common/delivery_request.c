/*
 * delivery_request.c: see delivery_request.h.
 */
#include "delivery_request.h"

#include <stdio.h>
#include <time.h>

#include "log.h"
#include "webhook.h"

static struct curl_slist *
request_headers(const destination_config *d, const handoff_message *m, int attempt)
{
	struct curl_slist *headers = NULL;
	char line[1024];
	const char *name;
	json_t *value;

	snprintf(line, sizeof(line), "Content-Type: %s",
			 m->content_type ? m->content_type : "application/octet-stream");
	headers = curl_slist_append(headers, line);
	snprintf(line, sizeof(line), "Idempotency-Key: %s", m->idempotency_key);
	headers = curl_slist_append(headers, line);
	snprintf(line, sizeof(line), "X-Wal-Topic: %s", m->source_topic);
	headers = curl_slist_append(headers, line);
	if (m->outbox_id)
	{
		snprintf(line, sizeof(line), "X-Wal-Outbox-Id: %s", m->outbox_id);
		headers = curl_slist_append(headers, line);
	}
	snprintf(line, sizeof(line), "X-Wal-Attempt: %d", attempt);
	headers = curl_slist_append(headers, line);
	json_object_foreach(d->headers, name, value)
	{
		if (!json_is_string(value))
			continue;
		snprintf(line, sizeof(line), "%s: %s", name, json_string_value(value));
		headers = curl_slist_append(headers, line);
	}
	if (d->signing_secret && !webhook_add_headers(&headers, d->signing_secret, m->idempotency_key,
												  (long) time(NULL), m->payload, m->payload_len))
		log_warn("event=signing_failed destination=%s key=%s msg=\"sending unsigned\"", d->name,
				 m->idempotency_key);
	return headers;
}

http_request
delivery_request(const destination_config *d, const handoff_message *m, int attempt)
{
	http_request req = {
		.destination = d->name,
		.max_in_flight = d->max_in_flight,
		.method = d->method,
		.url = d->endpoint,
		.headers = request_headers(d, m, attempt),
		.body = m->payload,
		.body_len = m->payload_len,
		.timeout_ms = d->timeout_ms,
		.verify_tls = d->verify_tls,
	};

	return req;
}
