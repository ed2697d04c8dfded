/*
 * dlq_message.c: see dlq_message.h.
 */
#include "dlq/dlq_message.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/log.h"
#include "shared/utf8.h"

char *
utf8_or_escaped(const char *bytes, size_t len)
{
	const unsigned char *s = (const unsigned char *) bytes;
	char *out = malloc(len * 4 + 1); /* every byte escaped at worst */
	size_t o = 0;

	if (out == NULL)
		fatal("event=out_of_memory msg=\"cannot read a DLQ message\"");
	for (size_t i = 0; i < len;)
	{
		size_t n = utf8_sequence_length(s + i, len - i);

		if (n == 0)
		{
			o += (size_t) snprintf(out + o, 5, "\\x%02x", s[i]);
			i++;
			continue;
		}
		memcpy(out + o, s + i, n);
		o += n;
		i += n;
	}
	out[o] = '\0';
	return out;
}

bool
parse_bounded_digits(const char *text, int64_t max, int64_t *out)
{
	int64_t value = 0;

	if (text == NULL || text[0] == '\0')
		return false;
	for (const char *c = text; *c; c++)
	{
		if (*c < '0' || *c > '9' || value > (max - (*c - '0')) / 10)
			return false;
		value = value * 10 + (*c - '0');
	}
	*out = value;
	return true;
}

/* The first value of header name, made text; NULL when the message has none. */
static char *
header_text(rd_kafka_headers_t *hdrs, const char *name)
{
	const void *value;
	size_t size;

	if (hdrs == NULL ||
		rd_kafka_header_get(hdrs, 0, name, &value, &size) != RD_KAFKA_RESP_ERR_NO_ERROR)
		return NULL;
	return utf8_or_escaped(value ? value : "", value ? size : 0);
}

/* Every header into one JSON object; a name seen again keeps its first value. */
static char *
headers_as_json(rd_kafka_headers_t *hdrs)
{
	json_t *all = json_object();
	const char *name;
	const void *value;
	size_t size;
	char *out;

	for (size_t i = 0; hdrs && rd_kafka_header_get_all(hdrs, i, &name, &value, &size) ==
								   RD_KAFKA_RESP_ERR_NO_ERROR;
		 i++)
	{
		char *clean_name = utf8_or_escaped(name, strlen(name));
		char *clean_value = utf8_or_escaped(value ? value : "", value ? size : 0);

		if (json_object_get(all, clean_name) == NULL)
			json_object_set_new(all, clean_name, json_string(clean_value));
		free(clean_name);
		free(clean_value);
	}
	out = json_dumps(all, JSON_COMPACT);
	json_decref(all);
	if (out == NULL)
		fatal("event=out_of_memory msg=\"cannot read a DLQ message\"");
	return out;
}

void
dlq_message_read(dlq_message *m, const rd_kafka_message_t *rkm)
{
	rd_kafka_headers_t *hdrs = NULL;
	char *number;
	int64_t value;

	memset(m, 0, sizeof(*m));
	if (rd_kafka_message_headers(rkm, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR)
		hdrs = NULL;
	m->topic = header_text(hdrs, "source-topic");
	m->idempotency_key = header_text(hdrs, "idempotency-key");
	m->destination = header_text(hdrs, "destination");
	m->content_type = header_text(hdrs, "content-type");
	m->last_error = header_text(hdrs, "last-error");
	number = header_text(hdrs, "outbox-id");
	if ((m->has_outbox_id = parse_bounded_digits(number, INT64_MAX, &value)))
		m->outbox_id = value;
	free(number);
	number = header_text(hdrs, "attempt");
	if ((m->has_attempt = parse_bounded_digits(number, INT32_MAX, &value)))
		m->attempt = (int32_t) value;
	free(number);
	m->headers_json = headers_as_json(hdrs);
}

void
dlq_message_clear(dlq_message *m)
{
	free(m->topic);
	free(m->idempotency_key);
	free(m->destination);
	free(m->content_type);
	free(m->last_error);
	free(m->headers_json);
	memset(m, 0, sizeof(*m));
}
