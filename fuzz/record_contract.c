/*
 * record_contract.c (fuzz target): src/shared/record_contract.c, the rules every record
 * meets.
 *
 * Input: flags||topic||payload||idempotency key||message key||content type||name||value...
 *   flags  letters T, P, I, K, C: that field is absent (NULL); M: the first header given
 *          65 times (over the count limit); digits: the topic's max_payload_bytes
 *          (default 1000000), turned into the record limit by record_limit().
 *
 * record_check is compared with the rules as record_contract.h states them, rewritten
 * here from that text: a record passes exactly when they all hold, and a refused one
 * names the first field at fault in the contract's order. Whatever the bytes, the
 * problem's message and hint are valid UTF-8 without control characters, terminated in
 * their buffers. record_quote's output, at several sizes, is valid UTF-8, quoted, fits,
 * and decodes back to the input when nothing had to be cut; record_invalid_utf8_at and
 * record_control_at agree with independent judges.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <limits.h>

#include "fuzz_util.h"
#include "shared/hex.h"
#include "shared/record_contract.h"
#include "shared/utf8.h"

#define MAX_FIELDS (6 + 2 * (RECORD_MAX_HEADERS + 2))

/* ---------------------------------------------------------------- the rules, rewritten */

static bool
is_tchar(unsigned char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		   (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

static bool
same_name_ci(record_bytes a, record_bytes b)
{
	if (a.len != b.len)
		return false;
	for (size_t i = 0; i < a.len; i++)
		if (tolower((unsigned char) a.data[i]) != tolower((unsigned char) b.data[i]))
			return false;
	return true;
}

static bool
has_control(record_bytes b)
{
	for (size_t i = 0; i < b.len; i++)
		if ((unsigned char) b.data[i] < 0x20 || b.data[i] == 0x7f)
			return true;
	return false;
}

static bool
reserved(record_bytes name)
{
	static const char *const names[] = {
		"idempotency-key",  "outbox-id",     "source-topic", "content-type", "created-at",
		"source-partition", "source-offset", "destination",  "attempt",      "step-entered-at",
		"step-jitter-ms",   "not-before",    "last-error",   "dead-reason",  "payload-omitted"};

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (same_name_ci(name, (record_bytes){names[i], strlen(names[i])}))
			return true;
	return false;
}

static bool
header_ok(const record_header *h, int i, const record_header *all)
{
	if (h->name.data == NULL || h->name.len < 1 || h->name.len > RECORD_MAX_HEADER_NAME)
		return false;
	for (size_t c = 0; c < h->name.len; c++)
		if (!is_tchar((unsigned char) h->name.data[c]))
			return false;
	if (reserved(h->name))
		return false;
	for (int j = 0; j < i; j++)
		if (same_name_ci(all[j].name, h->name))
			return false;
	return !has_control(h->value) && fuzz_utf8_invalid_at(h->value.data, h->value.len) < 0;
}

/* The field the contract refuses first, or NULL when the record meets every rule. */
static const char *
expected_fault(const record_fields *r, int64_t limit)
{
	record_bytes k = r->idempotency_key, m = r->message_key, t = r->content_type;
	int64_t size;

	if (r->payload.data == NULL)
		return "payload";
	if (k.len < 1 || k.len > RECORD_MAX_IDEMPOTENCY_KEY || has_control(k) ||
		fuzz_utf8_invalid_at(k.data, k.len) >= 0)
		return "idempotency_key";
	if (m.data != NULL &&
		(m.len < 1 || m.len > RECORD_MAX_MESSAGE_KEY || fuzz_utf8_invalid_at(m.data, m.len) >= 0))
		return "key";
	if (t.data != NULL)
	{
		bool printable = t.len >= 1 && t.len <= RECORD_MAX_CONTENT_TYPE;

		for (size_t i = 0; i < t.len; i++)
			printable = printable && t.data[i] >= 0x20 && t.data[i] <= 0x7e;
		if (!printable)
			return "content_type";
	}
	if (r->n_headers > RECORD_MAX_HEADERS)
		return "headers";
	for (int i = 0; i < r->n_headers; i++)
		if (!header_ok(&r->headers[i], i, r->headers))
			return "headers";
	size = (int64_t) r->payload.len + (int64_t) k.len + (m.data ? (int64_t) m.len : 0);
	for (int i = 0; i < r->n_headers; i++)
		size += (int64_t) (r->headers[i].name.len + r->headers[i].value.len);
	return size > limit ? "size" : NULL;
}

/* ---------------------------------------------------------------- record_quote */

/* Decodes record_quote's output (without the quotes) into out; its length, or -1. */
static long
unquote(const char *q, size_t len, char *out)
{
	size_t o = 0;

	for (size_t i = 0; i < len;)
	{
		if (q[i] != '\\')
		{
			out[o++] = q[i++];
			continue;
		}
		if (i + 1 >= len)
			return -1;
		switch (q[i + 1])
		{
			case '"':
			case '\\':
				out[o++] = q[i + 1];
				i += 2;
				break;
			case 'b':
				out[o++] = '\b', i += 2;
				break;
			case 't':
				out[o++] = '\t', i += 2;
				break;
			case 'n':
				out[o++] = '\n', i += 2;
				break;
			case 'f':
				out[o++] = '\f', i += 2;
				break;
			case 'r':
				out[o++] = '\r', i += 2;
				break;
			case 'x':
				if (i + 4 > len || hex_digit_value(q[i + 2]) < 0 || hex_digit_value(q[i + 3]) < 0)
					return -1;
				out[o++] = (char) (hex_digit_value(q[i + 2]) * 16 + hex_digit_value(q[i + 3]));
				i += 4;
				break;
			case 'u':
				if (i + 6 > len || q[i + 2] != '0' || q[i + 3] != '0' ||
					hex_digit_value(q[i + 4]) < 0 || hex_digit_value(q[i + 5]) < 0)
					return -1;
				out[o++] = (char) (hex_digit_value(q[i + 4]) * 16 + hex_digit_value(q[i + 5]));
				i += 6;
				break;
			default:
				return -1;
		}
	}
	return (long) o;
}

static void
check_quote(const char *s, size_t len)
{
	static const size_t sizes[] = {0, 1, 5, 6, 7, 9, 13, 64, 300};
	static const size_t max_chars[] = {0, 1, 100, SIZE_MAX};
	size_t full_size = len * 6 + 8;
	char *full = malloc(full_size), *decoded = malloc(len + 1);
	size_t full_len;
	long n;

	/* Nothing cut: the output decodes back to exactly the input. */
	record_quote(full, full_size, s, len, len);
	FUZZ_CHECK(fuzz_terminated(full, full_size));
	full_len = strlen(full);
	FUZZ_CHECK(full_len >= 2 && full[0] == '"' && full[full_len - 1] == '"');
	FUZZ_CHECK(fuzz_is_clean_text(full, full_len));
	n = unquote(full + 1, full_len - 2, decoded);
	FUZZ_CHECK(n == (long) len && memcmp(decoded, s, len) == 0);

	for (size_t m = 0; m < sizeof(max_chars) / sizeof(max_chars[0]); m++)
	{
		char *previous = NULL;
		size_t previous_len = 0;

		for (size_t z = 0; z < sizeof(sizes) / sizeof(sizes[0]); z++)
		{
			/* Exactly out_size bytes, so ASan sees a write past them. */
			char *out = malloc(sizes[z] ? sizes[z] : 1);
			size_t out_len;

			record_quote(out, sizes[z], s, len, max_chars[m]);
			if (sizes[z] == 0)
			{
				free(out);
				continue;
			}
			FUZZ_CHECK(fuzz_terminated(out, sizes[z]));
			out_len = strlen(out);
			if (sizes[z] < 6)
			{
				FUZZ_CHECK(out_len == 0);
				free(out);
				continue;
			}
			FUZZ_CHECK(out_len >= 2 && out[0] == '"' && out[out_len - 1] == '"');
			FUZZ_CHECK(fuzz_is_clean_text(out, out_len));
			/* A smaller buffer cuts the same text sooner: a prefix, without the closing quote. */
			if (previous != NULL)
				FUZZ_CHECK(previous_len <= out_len && memcmp(previous, out, previous_len - 1) == 0);
			free(previous);
			previous = out;
			previous_len = out_len;
		}
		free(previous);
	}
	free(full);
	free(decoded);
}

/* ---------------------------------------------------------------- the target */

static void
check_text_functions(record_bytes b, bool quote)
{
	long control = -1;

	if (b.data == NULL)
		return;
	FUZZ_CHECK(record_invalid_utf8_at(b.data, b.len) == fuzz_utf8_invalid_at(b.data, b.len));
	for (size_t i = 0; i < b.len && control < 0; i++)
		if ((unsigned char) b.data[i] < 0x20 || b.data[i] == 0x7f)
			control = (long) i;
	FUZZ_CHECK(record_control_at(b.data, b.len) == control);
	if (quote)
		check_quote(b.data, b.len);
}

static void
check_problem(const record_problem *p, const char *expected)
{
	static const char *const fields[] = {"payload",      "idempotency_key", "key",
										 "content_type", "headers",         "size"};
	bool known = false;
	size_t len;

	FUZZ_CHECK(p->sqlstate != NULL && strlen(p->sqlstate) == 5);
	FUZZ_CHECK(p->http_status == 400 || p->http_status == 413);
	FUZZ_CHECK(p->field != NULL);
	for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
		known = known || strcmp(p->field, fields[i]) == 0;
	FUZZ_CHECK(known);
	FUZZ_CHECK(strcmp(p->field, expected) == 0);
	FUZZ_CHECK(fuzz_terminated(p->message, sizeof(p->message)));
	FUZZ_CHECK(fuzz_terminated(p->hint, sizeof(p->hint)));
	len = strlen(p->message);
	FUZZ_CHECK(len > 0);
	FUZZ_CHECK(fuzz_is_clean_text(p->message, len));
	FUZZ_CHECK(record_invalid_utf8_at(p->message, len) < 0);
	len = strlen(p->hint);
	FUZZ_CHECK(fuzz_is_clean_text(p->hint, len));
	FUZZ_CHECK(record_invalid_utf8_at(p->hint, len) < 0);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_field f[MAX_FIELDS];
	int n = fuzz_split(data, size, f, MAX_FIELDS);
	record_header headers[RECORD_MAX_HEADERS + 1];
	record_header *many = NULL;
	char *copies[MAX_FIELDS] = {0};
	record_bytes b[6] = {{0}};
	record_fields r;
	record_problem p, again;
	int64_t max_payload = 1000000, limit;
	bool has_digits = false, ok;
	const char *expected;
	int n_headers = 0;

	/* Each field in a buffer of its own size. */
	for (int i = 0; i < n; i++)
		copies[i] = fuzz_exact_copy(f[i]);
	for (int i = 1; i < 6; i++)
		if (i < n)
			b[i] = (record_bytes){copies[i], f[i].len};
		else
			b[i] = (record_bytes){"", 0};
	for (size_t i = 0; n > 0 && i < f[0].len; i++)
	{
		char c = f[0].data[i];

		if (c >= '0' && c <= '9' && max_payload < INT32_MAX / 10)
			max_payload = (has_digits ? max_payload * 10 : 0) + (c - '0'), has_digits = true;
		else if (c == 'T')
			b[1].data = NULL, b[1].len = 0;
		else if (c == 'P')
			b[2].data = NULL, b[2].len = 0;
		else if (c == 'I')
			b[3].data = NULL, b[3].len = 0;
		else if (c == 'K')
			b[4].data = NULL, b[4].len = 0;
		else if (c == 'C')
			b[5].data = NULL, b[5].len = 0;
	}
	for (int i = 6; i + 1 < n && n_headers <= RECORD_MAX_HEADERS; i += 2)
		headers[n_headers++] =
			(record_header){{copies[i], f[i].len}, {copies[i + 1], f[i + 1].len}};

	limit = record_limit((int32_t) max_payload);
	FUZZ_CHECK(limit <= max_payload &&
			   limit <= (max_payload > 1000000 ? max_payload : 1000000) - RECORD_HANDOFF_RESERVE);

	r = (record_fields){.topic = b[1],
						.payload = b[2],
						.idempotency_key = b[3],
						.message_key = b[4],
						.content_type = b[5],
						.headers = headers,
						.n_headers = n_headers};
	if (n > 0 && memchr(f[0].data, 'M', f[0].len) != NULL && n_headers > 0)
	{
		many = malloc(sizeof(*many) * (RECORD_MAX_HEADERS + 1));
		for (int i = 0; i <= RECORD_MAX_HEADERS; i++)
			many[i] = headers[0];
		r.headers = many;
		r.n_headers = RECORD_MAX_HEADERS + 1;
	}

	/* record_quote at every size is slow: the fields and the first headers are enough. */
	for (int i = 1; i < 6; i++)
		check_text_functions(b[i], true);
	for (int i = 0; i < n_headers; i++)
	{
		bool token = headers[i].name.len >= 1 && headers[i].name.len <= RECORD_MAX_HEADER_NAME;

		for (size_t c = 0; c < headers[i].name.len; c++)
			token = token && is_tchar((unsigned char) headers[i].name.data[c]);
		FUZZ_CHECK(record_is_http_token(headers[i].name.data, headers[i].name.len) == token);
		FUZZ_CHECK(record_header_is_reserved(headers[i].name.data, headers[i].name.len) ==
				   reserved(headers[i].name));
		check_text_functions(headers[i].name, i < 4);
		check_text_functions(headers[i].value, i < 4);
	}

	expected = expected_fault(&r, limit);
	memset(&p, 0x5a, sizeof(p)); /* no help from a zeroed buffer */
	ok = record_check(&r, limit, &p);
	if (ok)
	{
		FUZZ_CHECK(expected == NULL);
		/* What the doors rely on once a record passed. */
		FUZZ_CHECK(r.payload.data != NULL);
		FUZZ_CHECK(memchr(r.idempotency_key.data, '\0', r.idempotency_key.len) == NULL);
		FUZZ_CHECK(record_control_at(r.idempotency_key.data, r.idempotency_key.len) < 0);
		FUZZ_CHECK(r.message_key.data == NULL ||
				   memchr(r.message_key.data, '\0', r.message_key.len) == NULL);
		FUZZ_CHECK(record_size(&r) <= limit);
	}
	else
	{
		FUZZ_CHECK(expected != NULL);
		check_problem(&p, expected);
	}
	/* The same bytes get the same answer. */
	FUZZ_CHECK(record_check(&r, limit, &again) == ok);
	if (!ok)
		FUZZ_CHECK(strcmp(p.message, again.message) == 0 && strcmp(p.hint, again.hint) == 0 &&
				   strcmp(p.sqlstate, again.sqlstate) == 0);

	free(many);
	for (int i = 0; i < n; i++)
		free(copies[i]);
	return 0;
}
