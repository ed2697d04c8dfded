/*
 * trace_context.c: reading, checking and continuing W3C Trace Context (trace_context.h).
 */
#include "trace_context.h"

#include <stdio.h>
#include <string.h>

static int
hex_value(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1; /* uppercase is not allowed either */
}

/* Whether s[0..n) is lowercase hex; *all_zero says whether every digit was '0'. */
static bool
lower_hex(const char *s, size_t n, bool *all_zero)
{
	*all_zero = true;
	for (size_t i = 0; i < n; i++)
	{
		if (hex_value(s[i]) < 0)
			return false;
		if (s[i] != '0')
			*all_zero = false;
	}
	return true;
}

const char *
trace_context_parse(const char *v, size_t len, trace_context *out)
{
	bool zero;

	if (len < TRACEPARENT_LENGTH)
		return "traceparent is shorter than the 55 characters of version 00";
	if (!lower_hex(v, 2, &zero))
		return "traceparent's version is not two lowercase hex digits";
	if (v[0] == 'f' && v[1] == 'f')
		return "traceparent's version ff is invalid";
	if (v[2] != '-' || v[35] != '-' || v[52] != '-')
		return "traceparent's fields are not separated by '-' at positions 3, 36 and 53";
	if (v[0] == '0' && v[1] == '0' && len != TRACEPARENT_LENGTH)
		return "a version 00 traceparent is exactly 55 characters";
	if (len > TRACEPARENT_LENGTH && v[TRACEPARENT_LENGTH] != '-')
		return "a later version's traceparent must continue with '-' after 55 characters";
	if (!lower_hex(v + 3, TRACE_ID_HEX, &zero))
		return "traceparent's trace id is not 32 lowercase hex digits";
	if (zero)
		return "traceparent's trace id is all zeros";
	if (!lower_hex(v + 36, SPAN_ID_HEX, &zero))
		return "traceparent's parent id is not 16 lowercase hex digits";
	if (zero)
		return "traceparent's parent id is all zeros";
	if (!lower_hex(v + 53, 2, &zero))
		return "traceparent's flags are not two lowercase hex digits";
	memcpy(out->trace_id, v + 3, TRACE_ID_HEX);
	out->trace_id[TRACE_ID_HEX] = '\0';
	memcpy(out->span_id, v + 36, SPAN_ID_HEX);
	out->span_id[SPAN_ID_HEX] = '\0';
	out->flags = (unsigned char) (hex_value(v[53]) * 16 + hex_value(v[54]));
	return NULL;
}

const char *
tracestate_check(const char *v, size_t len)
{
	if (len > TRACESTATE_MAX)
		return "tracestate is longer than 512 characters";
	for (size_t i = 0; i < len; i++)
		if (v[i] < 0x20 || v[i] > 0x7e)
			return "tracestate holds a character outside printable ASCII";
	return NULL;
}

void
trace_context_child(const trace_context *parent, const unsigned char random8[8],
					trace_context *child)
{
	static const char digits[] = "0123456789abcdef";
	bool zero = true;

	memcpy(child->trace_id, parent->trace_id, sizeof(child->trace_id));
	child->flags = parent->flags;
	for (int i = 0; i < 8; i++)
	{
		child->span_id[2 * i] = digits[random8[i] >> 4];
		child->span_id[2 * i + 1] = digits[random8[i] & 0x0f];
		if (random8[i] != 0)
			zero = false;
	}
	if (zero)
		child->span_id[SPAN_ID_HEX - 1] = '1';
	child->span_id[SPAN_ID_HEX] = '\0';
}

void
trace_context_format(const trace_context *tc, char out[TRACEPARENT_LENGTH + 1])
{
	snprintf(out, TRACEPARENT_LENGTH + 1, "00-%s-%s-%02x", tc->trace_id, tc->span_id, tc->flags);
}
