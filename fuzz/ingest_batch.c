/*
 * ingest_batch.c (fuzz target): the NDJSON batch parser of the ingest service,
 * ingest_parse_batch (src/workers/ingest/ingest_parse.c), on a request built in memory:
 * no connection, no network.
 *
 * Input: the request body, optionally after a first line "limit:<digits>" that sets the
 * topic's record limit (default 4096, so that sizes over the limit are reachable).
 *
 * Invariants: the request is either refused (400 or 413, the matching error code, a
 * message that can be put in the JSON answer, no record kept) or holds 1 to 10000
 * records, each of which the record contract accepts again, with the topic, a payload,
 * a content type, an idempotency key of 1 to 200 bytes without
 * NUL or control characters, header names in lower case and no more than 64 headers.
 */
#define _GNU_SOURCE
#include <jansson.h>

#include "fuzz_util.h"
#include "ingest/ingest_parse.h"
#include "ingest/ingest_record.h"
#include "ingest/ingest_request.h"
#include "shared/record_contract.h"

#define DEFAULT_LIMIT 4096

static void
check_record(const ingest_request *req, const ingest_record *r, int i)
{
	record_problem p;

	FUZZ_CHECK(r->request == req && r->index == i);
	FUZZ_CHECK(r->topic != NULL && strcmp(r->topic, req->topic->name) == 0);
	FUZZ_CHECK(r->payload != NULL);
	FUZZ_CHECK(r->content_type != NULL && r->content_type_len >= 1 &&
			   r->content_type_len <= RECORD_MAX_CONTENT_TYPE &&
			   strlen(r->content_type) == r->content_type_len);
	FUZZ_CHECK(r->idempotency_key != NULL && r->idempotency_key_len >= 1 &&
			   r->idempotency_key_len <= RECORD_MAX_IDEMPOTENCY_KEY);
	/* The code after the check reads keys and values as C strings. */
	FUZZ_CHECK(strlen(r->idempotency_key) == r->idempotency_key_len);
	FUZZ_CHECK(fuzz_is_clean_text(r->idempotency_key, r->idempotency_key_len));
	FUZZ_CHECK(r->message_key == NULL ||
			   (r->message_key_len >= 1 && strlen(r->message_key) == r->message_key_len &&
				fuzz_utf8_invalid_at(r->message_key, r->message_key_len) < 0));
	FUZZ_CHECK(r->n_headers >= 0 && r->n_headers <= RECORD_MAX_HEADERS);
	FUZZ_CHECK(r->n_headers == r->n_headers_given);
	for (int h = 0; h < r->n_headers; h++)
	{
		const char *name = r->header_names[h];

		FUZZ_CHECK(strlen(name) == r->header_name_lens[h]);
		FUZZ_CHECK(record_is_http_token(name, r->header_name_lens[h]));
		for (size_t c = 0; c < r->header_name_lens[h]; c++)
			FUZZ_CHECK(!(name[c] >= 'A' && name[c] <= 'Z'));
		FUZZ_CHECK(strlen(r->header_values[h]) == r->header_value_lens[h]);
		FUZZ_CHECK(fuzz_is_clean_text(r->header_values[h], r->header_value_lens[h]));
	}
	FUZZ_CHECK(ingest_record_check(r, req->topic->record_limit, &p));
}

static void
check_refusal(const ingest_request *req)
{
	json_t *message, *answer;
	char *text;

	FUZZ_CHECK(req->n_records == 0);
	FUZZ_CHECK(req->error_status == 400 || req->error_status == 413);
	FUZZ_CHECK(strcmp(req->error_code, req->error_status == 413 ? "too_large" : "bad_record") == 0);
	FUZZ_CHECK(fuzz_terminated(req->error_message, sizeof(req->error_message)));
	FUZZ_CHECK(req->error_message[0] != '\0');
	/* The answer is built from it whatever its bytes (ingest_send_error). */
	message = json_text(req->error_message);
	FUZZ_CHECK(message != NULL);
	answer = json_pack("{s:s, s:o}", "error", req->error_code, "message", message);
	FUZZ_CHECK(answer != NULL);
	if (req->error_field)
		FUZZ_CHECK(json_object_set_new(answer, "field", json_string(req->error_field)) == 0);
	text = json_dumps(answer, JSON_COMPACT);
	FUZZ_CHECK(text != NULL);
	free(text);
	json_decref(answer);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	ingest_topic topic = {.name = "orders.created", .acks = -1, .record_limit = DEFAULT_LIMIT};
	ingest_request *req = ingest_request_new(NULL);
	const char *body = (const char *) data;
	size_t body_len = size;
	bool ok;

	if (size > 6 && memcmp(data, "limit:", 6) == 0)
	{
		const char *nl = memchr(data, '\n', size);
		long limit = 0;

		for (const char *c = body + 6; nl && c < nl && *c >= '0' && *c <= '9' && limit < 100000000;
			 c++)
			limit = limit * 10 + (*c - '0');
		if (nl)
		{
			topic.record_limit = (int) limit;
			body = nl + 1;
			body_len = size - (size_t) (body - (const char *) data);
		}
	}
	req->batch = true;
	req->topic = &topic;
	/* The body as ingest_http collects it: its bytes and a NUL after them, nothing more
	 * (ASan sees a read past that). */
	req->body = malloc(body_len + 1);
	memcpy(req->body, body, body_len);
	req->body[body_len] = '\0';
	req->body_len = body_len;
	req->body_cap = body_len + 1;

	ok = ingest_parse_batch(req);
	FUZZ_CHECK(ok == (req->error_status == 0));
	if (ok)
	{
		FUZZ_CHECK(req->n_records >= 1 && req->n_records <= INGEST_BATCH_MAX_RECORDS);
		for (int i = 0; i < req->n_records; i++)
			check_record(req, req->records[i], i);
	}
	else
		check_refusal(req);
	ingest_request_free(req);
	return 0;
}
