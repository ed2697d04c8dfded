/*
 * enqueue_check.c: the fast yes of wal_delivery.check_record (see enqueue_check.h). Every
 * test here must be at least as strict as the SQL rule it mirrors: a record this accepts
 * is stored without the SQL check ever seeing it.
 */
#include "postgres.h"

#include "enqueue_check.h"
#include "kafka_producer.h"

/* wal_delivery.record_limit() */
static int64
record_limit(int32 max_payload_bytes)
{
	return Min((int64) max_payload_bytes, Max((int64) max_payload_bytes, 1000000) - 16384);
}

/* A byte below 0x20 or 0x7f: control_character() would name it (0x00 cannot be in text). */
static bool
has_control_byte(const char *s, int len)
{
	for (int i = 0; i < len; i++)
		if ((unsigned char) s[i] < 0x20 || s[i] == 0x7f)
			return true;
	return false;
}

/* The header name regex of check_record: ^[!#$%&'*+.^_`|~0-9A-Za-z-]+$, at most 256 bytes. */
static bool
is_http_token(const char *s, int len)
{
	if (len < 1 || len > 256)
		return false;
	for (int i = 0; i < len; i++)
	{
		unsigned char c = (unsigned char) s[i];

		if (!((c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
			  strchr("!#$%&'*+.^_`|~-", c) != NULL) ||
			c == '\0')
			return false;
	}
	return true;
}

/* The headers' share of the record size, or -1 unless every header surely passes. */
static int64
header_bytes_if_valid(Jsonb *headers)
{
	JsonbIterator *it;
	JsonbValue v;
	JsonbIteratorToken tok;
	int64 bytes = 0;
	int count = 0;

	if (!JB_ROOT_IS_OBJECT(headers) || JB_ROOT_IS_SCALAR(headers) || JB_ROOT_COUNT(headers) > 64)
		return -1;
	it = JsonbIteratorInit(&headers->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY)
		{
			char name[257];

			if (!is_http_token(v.val.string.val, v.val.string.len))
				return -1;
			memcpy(name, v.val.string.val, v.val.string.len);
			name[v.val.string.len] = '\0';
			if (is_reserved_header(name))
				return -1;
			bytes += v.val.string.len;
			count++;
		}
		else if (tok == WJB_VALUE)
		{
			if (v.type != jbvString || has_control_byte(v.val.string.val, v.val.string.len))
				return -1;
			bytes += v.val.string.len;
		}
	}
	return count <= 64 ? bytes : -1;
}

bool
enqueue_record_surely_valid(const EnqueueRecord *record, int32 max_payload_bytes)
{
	int key_len;
	int message_key_len = 0;
	int64 header_bytes = 0;

	if (record->payload == NULL || record->idempotency_key == NULL)
		return false;
	key_len = VARSIZE_ANY_EXHDR(record->idempotency_key);
	if (key_len < 1 || key_len > 200 ||
		has_control_byte(VARDATA_ANY(record->idempotency_key), key_len))
		return false;
	if (record->message_key != NULL)
	{
		message_key_len = VARSIZE_ANY_EXHDR(record->message_key);
		if (message_key_len < 1 || message_key_len > 1024)
			return false;
	}
	if (record->headers != NULL && (header_bytes = header_bytes_if_valid(record->headers)) < 0)
		return false;
	return (int64) VARSIZE_ANY_EXHDR(record->payload) + key_len + message_key_len + header_bytes <=
		   record_limit(max_payload_bytes);
}
