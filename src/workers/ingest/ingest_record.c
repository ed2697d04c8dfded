/*
 * ingest_record.c: a record's rules, identity and settlement (see ingest_record.h).
 */
#include "ingest_record.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>

#include "common/log.h"
#include "common/random_bytes.h"
#include "ingest/ingest_request.h"

static void *
must(void *p)
{
	if (p == NULL)
		fatal("event=out_of_memory what=ingest_record");
	return p;
}

ingest_record *
ingest_record_new(void)
{
	ingest_record *r = must(calloc(1, sizeof(*r)));
	struct timeval tv;
	struct tm tm;

	atomic_init(&r->refs, 1);
	atomic_init(&r->route, ROUTE_KAFKA);
	r->partition = -1;
	r->offset = -1;
	r->outbox_id = -1;
	/* The relay's created-at format: UTC with microseconds. */
	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	snprintf(r->created_at, sizeof(r->created_at), "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ",
			 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
			 (long) tv.tv_usec);
	return r;
}

void
ingest_record_ref(ingest_record *r)
{
	atomic_fetch_add(&r->refs, 1);
}

void
ingest_record_release(ingest_record *r)
{
	if (r == NULL || atomic_fetch_sub(&r->refs, 1) != 1)
		return;
	free(r->topic);
	free(r->payload);
	free(r->content_type);
	free(r->idempotency_key);
	free(r->message_key);
	for (int i = 0; i < r->n_headers; i++)
	{
		free(r->header_names[i]);
		free(r->header_values[i]);
	}
	free(r->error_message);
	free(r);
}

void
ingest_record_generate_key(ingest_record *r)
{
	unsigned char b[16];
	char *key = must(malloc(37));

	random_bytes(b, sizeof(b));
	b[6] = (unsigned char) ((b[6] & 0x0f) | 0x40);
	b[8] = (unsigned char) ((b[8] & 0x3f) | 0x80);
	snprintf(key, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
			 b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
			 b[14], b[15]);
	free(r->idempotency_key);
	r->idempotency_key = key;
	r->idempotency_key_len = 36;
	r->key_generated = true;
}

/* A copy of len bytes, NUL-terminated after them (the bytes may hold NULs of their own). */
static char *
copy_bytes(const char *s, size_t len)
{
	char *copy = must(malloc(len + 1));

	memcpy(copy, s, len);
	copy[len] = '\0';
	return copy;
}

void
ingest_record_set_key(ingest_record *r, const char *key, size_t len)
{
	free(r->idempotency_key);
	r->idempotency_key = copy_bytes(key, len);
	r->idempotency_key_len = len;
	r->key_generated = false;
}

void
ingest_record_set_message_key(ingest_record *r, const char *key, size_t len)
{
	free(r->message_key);
	r->message_key = copy_bytes(key, len);
	r->message_key_len = len;
}

void
ingest_record_set_content_type(ingest_record *r, const char *type, size_t len)
{
	free(r->content_type);
	r->content_type = copy_bytes(type, len);
	r->content_type_len = len;
}

void
ingest_record_add_header(ingest_record *r, const char *name, size_t name_len, const char *value,
						 size_t value_len)
{
	char *lower;

	if (r->n_headers_given++ >= RECORD_MAX_HEADERS)
		return;
	lower = copy_bytes(name, name_len);
	for (size_t i = 0; i < name_len; i++)
		lower[i] = (char) tolower((unsigned char) lower[i]);
	r->header_names[r->n_headers] = lower;
	r->header_values[r->n_headers] = copy_bytes(value, value_len);
	r->header_value_lens[r->n_headers] = value_len;
	r->header_name_lens[r->n_headers] = name_len;
	r->n_headers++;
}

bool
ingest_record_check(const ingest_record *r, int64_t record_limit, record_problem *problem)
{
	record_header headers[RECORD_MAX_HEADERS];
	record_fields f = {
		.topic = {r->topic, strlen(r->topic)},
		.payload = {r->payload ? r->payload : "", r->payload_len},
		.idempotency_key = {r->idempotency_key, r->idempotency_key_len},
		.message_key = {r->message_key, r->message_key_len},
		.content_type = {r->content_type, r->content_type_len},
		.headers = headers,
		.n_headers = r->n_headers_given,
	};

	for (int i = 0; i < r->n_headers; i++)
	{
		headers[i].name = (record_bytes){r->header_names[i], r->header_name_lens[i]};
		headers[i].value = (record_bytes){r->header_values[i], r->header_value_lens[i]};
	}
	return record_check(&f, record_limit, problem);
}

/* Only the winner of the record calls these, once. */
void
ingest_record_settle_kafka(ingest_record *r, int32_t partition, int64_t offset)
{
	r->outcome = OUTCOME_KAFKA;
	r->partition = partition;
	r->offset = offset;
	ingest_request_record_done(r->request);
}

void
ingest_record_settle_outbox(ingest_record *r, int64_t outbox_id)
{
	r->outcome = OUTCOME_OUTBOX;
	r->outbox_id = outbox_id;
	atomic_store(&r->route, ROUTE_SETTLED);
	ingest_request_record_done(r->request);
}

void
ingest_record_settle_failed(ingest_record *r, int http_status, const char *code,
							const char *message)
{
	r->outcome = OUTCOME_FAILED;
	r->http_status = http_status;
	snprintf(r->error_code, sizeof(r->error_code), "%s", code);
	free(r->error_message);
	r->error_message = strdup(message);
	atomic_store(&r->route, ROUTE_SETTLED);
	ingest_request_record_done(r->request);
}
