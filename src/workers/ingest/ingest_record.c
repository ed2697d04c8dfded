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
#include <sys/random.h>
#include <sys/time.h>
#include <time.h>

#include "common/log.h"
#include "ingest/ingest_request.h"

/* wal_delivery.reserved_header_names(): the relay and the workers write these. */
static const char *const reserved_headers[] = {
	"idempotency-key",  "outbox-id",     "source-topic", "content-type", "created-at",
	"source-partition", "source-offset", "destination",  "attempt",      "step-entered-at",
	"step-jitter-ms",   "not-before",    "last-error",   "dead-reason",  "payload-omitted"};

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

/*
 * Random bytes from the kernel (getrandom), drawn from a per-thread pool so that a key
 * costs a memcpy, not a system call (RAND_bytes was 8% of the server's time under load).
 */
static void
random_bytes(unsigned char *out, size_t n)
{
	static __thread unsigned char pool[4096];
	static __thread size_t left;

	if (left < n)
	{
		size_t got = 0;

		while (got < sizeof(pool))
		{
			ssize_t k = getrandom(pool + got, sizeof(pool) - got, 0);

			if (k < 0 && errno != EINTR)
				fatal("event=random_failed msg=\"cannot generate an idempotency key\" error=\"%s\"",
					  strerror(errno));
			if (k > 0)
				got += (size_t) k;
		}
		left = sizeof(pool);
	}
	memcpy(out, pool + sizeof(pool) - left, n);
	left -= n;
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
	r->key_generated = true;
}

long
control_character_at(const char *s, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if ((unsigned char) s[i] < 0x20 || (unsigned char) s[i] == 0x7f)
			return (long) i;
	return -1;
}

static bool
is_token_char(unsigned char c)
{
	return isalnum(c) || strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static bool
refuse(int *status, int code, char *why, size_t why_size, const char *fmt, const char *arg)
{
	*status = code;
	snprintf(why, why_size, fmt, arg);
	return false;
}

bool
ingest_record_add_header(ingest_record *r, const char *name, size_t name_len, const char *value,
						 size_t value_len, int *status, char *why, size_t why_size)
{
	char shown[INGEST_MAX_HEADER_NAME + 1];
	char *lower;

	snprintf(shown, sizeof(shown), "%.*s", (int) (name_len < 100 ? name_len : 100), name);
	if (name_len == 0 || name_len > INGEST_MAX_HEADER_NAME)
		return refuse(status, 400, why, why_size,
					  "header name \"%s\" must be 1 to 256 characters (an HTTP token)", shown);
	for (size_t i = 0; i < name_len; i++)
		if (!is_token_char((unsigned char) name[i]))
			return refuse(status, 400, why, why_size, "header name \"%s\" is not an HTTP token",
						  shown);
	/* HTTP header names carry no case (a proxy may lower them): records get lower case. */
	lower = must(strndup(name, name_len));
	for (char *c = lower; *c; c++)
		*c = (char) tolower((unsigned char) *c);
	for (size_t i = 0; i < sizeof(reserved_headers) / sizeof(reserved_headers[0]); i++)
		if (strcmp(lower, reserved_headers[i]) == 0)
		{
			free(lower);
			return refuse(status, 400, why, why_size,
						  "header \"%s\" is reserved: the relay and the workers write it", shown);
		}
	for (int i = 0; i < r->n_headers; i++)
		if (strcmp(r->header_names[i], lower) == 0)
		{
			free(lower);
			return refuse(status, 400, why, why_size, "header \"%s\" is given twice", shown);
		}
	if (control_character_at(value, value_len) >= 0)
	{
		free(lower);
		return refuse(status, 400, why, why_size, "header \"%s\" must not hold control characters",
					  shown);
	}
	if (r->n_headers == INGEST_MAX_HEADERS)
	{
		free(lower);
		return refuse(status, 413, why, why_size, "headers must be at most 64%s", "");
	}
	r->header_names[r->n_headers] = lower;
	r->header_values[r->n_headers] = must(strndup(value, value_len));
	r->n_headers++;
	return true;
}

bool
ingest_record_check(const ingest_record *r, int record_limit, int *status, char *why,
					size_t why_size)
{
	size_t ikey_len = strlen(r->idempotency_key);
	size_t key_len = r->message_key ? strlen(r->message_key) : 0;
	size_t size = r->payload_len + ikey_len + key_len;

	if (ikey_len == 0)
		return refuse(status, 400, why, why_size, "idempotency key must not be empty%s", "");
	if (ikey_len > INGEST_MAX_IKEY_BYTES)
		return refuse(status, 400, why, why_size, "idempotency key must be at most 200 bytes%s",
					  "");
	if (control_character_at(r->idempotency_key, ikey_len) >= 0)
		return refuse(status, 400, why, why_size,
					  "idempotency key must not hold control characters%s", "");
	if (r->message_key && key_len == 0)
		return refuse(status, 400, why, why_size, "message key must not be empty%s", "");
	if (key_len > INGEST_MAX_KEY_BYTES)
		return refuse(status, 400, why, why_size, "message key must be at most 1024 bytes%s", "");
	if (r->content_type == NULL || r->content_type[0] == '\0' ||
		strlen(r->content_type) > INGEST_MAX_CONTENT_TYPE ||
		control_character_at(r->content_type, strlen(r->content_type)) >= 0)
		return refuse(status, 400, why, why_size,
					  "content type must be 1 to 255 printable characters%s", "");
	for (int i = 0; i < r->n_headers; i++)
		size += strlen(r->header_names[i]) + strlen(r->header_values[i]);
	if (size > (size_t) record_limit)
	{
		char detail[160];

		snprintf(detail, sizeof(detail), "%zu bytes (payload, keys and headers) against %d", size,
				 record_limit);
		return refuse(status, 413, why, why_size, "record is over the topic's limit: %s", detail);
	}
	return true;
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
