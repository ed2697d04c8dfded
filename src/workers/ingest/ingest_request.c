/*
 * ingest_request.c: a request's records, its wait and its answer (see ingest_request.h).
 */
#include "ingest_request.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/clock.h"
#include "common/log.h"
#include "ingest/ingest_metrics.h"
#include "shared/record_contract.h"

/* How long a client is asked to wait before it sends again after a 503. */
#define RETRY_AFTER_SECONDS "1"

static atomic_size_t bodies_held; /* the body_cap of every request alive */

ingest_request *
ingest_request_new(struct MHD_Connection *connection)
{
	ingest_request *req = calloc(1, sizeof(*req));

	if (req == NULL)
		fatal("event=out_of_memory what=ingest_request");
	req->connection = connection;
	req->started_ms = now_ms();
	pthread_mutex_init(&req->lock, NULL);
	return req;
}

void
ingest_request_free(ingest_request *req)
{
	if (req == NULL)
		return;
	for (int i = 0; i < req->n_records; i++)
		ingest_record_release(req->records[i]);
	free(req->records);
	free(req->body);
	atomic_fetch_sub(&bodies_held, req->body_cap);
	ingest_catalog_release(req->catalog);
	pthread_mutex_destroy(&req->lock);
	free(req);
}

static void
fail_with(ingest_request *req, int status, const char *code, const char *field, const char *fmt,
		  va_list ap)
{
	if (req->error_status != 0)
		return;
	req->error_status = status;
	req->error_field = field;
	snprintf(req->error_code, sizeof(req->error_code), "%s", code);
	vsnprintf(req->error_message, sizeof(req->error_message), fmt, ap);
}

void
ingest_request_fail(ingest_request *req, int status, const char *code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fail_with(req, status, code, NULL, fmt, ap);
	va_end(ap);
}

void
ingest_request_fail_field(ingest_request *req, int status, const char *code, const char *field,
						  const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fail_with(req, status, code, field, fmt, ap);
	va_end(ap);
}

json_t *
json_text(const char *s)
{
	size_t len = strlen(s);
	char *shown;
	json_t *j;

	if (record_invalid_utf8_at(s, len) < 0)
		return json_stringn(s, len);
	/* record_quote shows every byte that is not UTF-8; drop the quotes it adds. */
	shown = malloc(len * 6 + 8);
	if (shown == NULL)
		fatal("event=out_of_memory what=json_text");
	record_quote(shown, len * 6 + 8, s, len, len);
	j = json_stringn(shown + 1, strlen(shown) - 2);
	free(shown);
	return j;
}

bool
ingest_request_grow_body(ingest_request *req, size_t more)
{
	size_t need = req->body_len + more + 1;
	size_t cap = req->body_cap ? req->body_cap : 4096;
	size_t added;
	char *grown;

	while (cap < need)
		cap *= 2;
	if (cap > req->body_limit + 1)
		cap = need > req->body_limit + 1 ? need : req->body_limit + 1;
	added = cap - req->body_cap;
	if (atomic_fetch_add(&bodies_held, added) + added > INGEST_BODIES_MAX_BYTES)
	{
		atomic_fetch_sub(&bodies_held, added);
		return false;
	}
	grown = realloc(req->body, cap);
	if (grown == NULL)
		fatal("event=out_of_memory what=request_body bytes=%zu", cap);
	req->body = grown;
	req->body_cap = cap;
	return true;
}

void
ingest_request_add_record(ingest_request *req, ingest_record *r)
{
	ingest_record **grown;

	if ((req->n_records & (req->n_records - 1)) == 0)
	{
		grown = realloc(req->records, sizeof(*grown) * (req->n_records ? req->n_records * 2 : 1));
		if (grown == NULL)
			fatal("event=out_of_memory what=ingest_request");
		req->records = grown;
	}
	r->request = req;
	r->index = req->n_records;
	req->records[req->n_records++] = r;
	req->outstanding++;
}

bool
ingest_request_wait(ingest_request *req)
{
	bool done;

	pthread_mutex_lock(&req->lock);
	req->handed_on = true;
	done = req->outstanding == 0;
	if (!done)
	{
		/* Under the lock, so the last settlement sees it and resumes. */
		MHD_suspend_connection(req->connection);
		req->suspended = true;
	}
	pthread_mutex_unlock(&req->lock);
	return done;
}

void
ingest_request_record_done(ingest_request *req)
{
	bool resume;

	pthread_mutex_lock(&req->lock);
	resume = --req->outstanding == 0 && req->suspended;
	if (resume)
		req->suspended = false;
	pthread_mutex_unlock(&req->lock);
	/*
	 * After the unlock: once resumed, the server's thread may answer and free req at any
	 * moment, so nothing here touches it afterwards. Until then it stays suspended, so req
	 * cannot go away between the unlock and the resume.
	 */
	if (resume)
		MHD_resume_connection(req->connection);
}

static enum MHD_Result
send_json(struct MHD_Connection *connection, int status, json_t *body, const char *ikey,
		  bool closing, const char *allow)
{
	char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
	size_t len;
	struct MHD_Response *response;
	enum MHD_Result result;
	char status_text[8];
	const char *labels[] = {status_text};

	json_decref(body);
	if (text == NULL)
	{
		/* Every string in an answer went through json_text, so only memory can fail. */
		log_error("event=answer_failed status=%d msg=\"cannot encode the answer\"", status);
		text = strdup("{\"error\":\"internal\",\"message\":\"the answer could not be encoded\"}");
		status = 500;
		if (text == NULL)
			return MHD_NO;
	}
	len = strlen(text);
	text[len] = '\0';
	response = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
	if (response == NULL)
	{
		free(text);
		return MHD_NO;
	}
	MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
	MHD_add_response_header(response, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	if (ikey != NULL)
		MHD_add_response_header(response, "Idempotency-Key", ikey);
	if (closing)
		MHD_add_response_header(response, MHD_HTTP_HEADER_CONNECTION, "close");
	if (allow != NULL)
		MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW, allow);
	/* 504 outcome_unknown: the client sends again too (ingest_kafka_outbox_failed). */
	if (status == MHD_HTTP_SERVICE_UNAVAILABLE || status == MHD_HTTP_GATEWAY_TIMEOUT)
		MHD_add_response_header(response, MHD_HTTP_HEADER_RETRY_AFTER, RETRY_AFTER_SECONDS);
	result = MHD_queue_response(connection, (unsigned int) status, response);
	MHD_destroy_response(response);
	snprintf(status_text, sizeof(status_text), "%d", status);
	metric_add(ingest_m.requests, 1, labels);
	return result;
}

static json_t *
error_json(const char *code, const char *field, const char *message)
{
	json_t *body = json_pack("{s:s, s:o}", "error", code, "message", json_text(message));

	if (body != NULL && field != NULL)
		json_object_set_new(body, "field", json_string(field));
	return body;
}

enum MHD_Result
ingest_send_error(struct MHD_Connection *connection, int status, const char *code,
				  const char *field, const char *message)
{
	return send_json(connection, status, error_json(code, field, message), NULL, false, NULL);
}

/* One record's part of the answer. */
static json_t *
record_json(const ingest_record *r)
{
	json_t *o = json_pack("{s:o, s:o}", "topic", json_text(r->topic), "idempotency_key",
						  json_text(r->idempotency_key));

	switch (r->outcome)
	{
		case OUTCOME_KAFKA:
			json_object_set_new(o, "path", json_string("kafka"));
			json_object_set_new(o, "partition", json_integer(r->partition));
			json_object_set_new(o, "offset", json_integer(r->offset));
			break;
		case OUTCOME_OUTBOX:
			json_object_set_new(o, "path", json_string("outbox"));
			json_object_set_new(o, "outbox_id", json_integer(r->outbox_id));
			break;
		default:
			json_object_set_new(o, "status", json_integer(r->http_status));
			json_object_set_new(o, "error", json_text(r->error_code));
			json_object_set_new(o, "message", json_text(r->error_message ? r->error_message : ""));
			break;
	}
	return o;
}

static void
observe_latency(const ingest_request *req, int n_kafka, int n_outbox)
{
	const char *path = n_kafka && n_outbox ? "mixed"
					   : n_kafka           ? "kafka"
					   : n_outbox          ? "outbox"
										   : "none";
	const char *labels[] = {path};

	metric_observe(ingest_m.request_seconds, (now_ms() - req->started_ms) / 1000.0, labels);
}

enum MHD_Result
ingest_request_answer(ingest_request *req)
{
	int n_kafka = 0, n_outbox = 0, status = 0;
	const ingest_record *failed = NULL;
	json_t *body;

	if (req->error_status != 0)
	{
		observe_latency(req, 0, 0);
		return send_json(req->connection, req->error_status,
						 error_json(req->error_code, req->error_field, req->error_message), NULL,
						 req->closing, req->allow);
	}
	for (int i = 0; i < req->n_records; i++)
	{
		const ingest_record *r = req->records[i];

		if (r->outcome == OUTCOME_KAFKA)
			n_kafka++;
		else if (r->outcome == OUTCOME_OUTBOX)
			n_outbox++;
		else if (failed == NULL)
			failed = r;
	}
	observe_latency(req, n_kafka, n_outbox);
	status = failed ? failed->http_status : n_outbox ? 202 : 201;
	if (!req->batch)
	{
		const ingest_record *r = req->records[0];

		body = record_json(r);
		json_object_del(body, "status"); /* it is the answer's */
		return send_json(req->connection, status, body, r->idempotency_key, false, NULL);
	}
	body = json_pack("{s:i, s:i, s:i, s:o}", "kafka", n_kafka, "outbox", n_outbox, "failed",
					 req->n_records - n_kafka - n_outbox, "records", json_array());
	for (int i = 0; i < req->n_records; i++)
		json_array_append_new(json_object_get(body, "records"), record_json(req->records[i]));
	if (failed)
	{
		json_object_set_new(body, "error", json_string(failed->error_code));
		json_object_set_new(body, "message",
							json_string("some records are not durable (see records); send them "
										"again with the same idempotency keys"));
	}
	return send_json(req->connection, status, body, NULL, false, NULL);
}
