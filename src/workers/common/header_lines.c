/*
 * header_lines.c: see header_lines.h.
 */
#include "header_lines.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void
header_lines_init(header_lines *h)
{
	h->text = h->inline_buf;
	h->len = 0;
	h->cap = sizeof(h->inline_buf);
	h->failed = false;
	h->text[0] = '\0';
}

/* Room for more bytes plus the NUL; false (and failed set) when memory ran out. */
static bool
reserve(header_lines *h, size_t more)
{
	size_t cap = h->cap;
	char *text;

	if (h->failed)
		return false;
	if (h->len + more + 1 <= h->cap)
		return true;
	while (cap < h->len + more + 1)
		cap *= 2;
	text = h->text == h->inline_buf ? malloc(cap) : realloc(h->text, cap);
	if (text == NULL)
	{
		h->failed = true;
		return false;
	}
	if (h->text == h->inline_buf)
		memcpy(text, h->inline_buf, h->len + 1);
	h->text = text;
	h->cap = cap;
	return true;
}

static void
append_clean(header_lines *h, const char *s, size_t n)
{
	char *out = h->text + h->len;

	for (size_t i = 0; i < n; i++)
		out[i] = s[i] == '\r' || s[i] == '\n' ? ' ' : s[i];
	h->len += n;
}

void
header_lines_add(header_lines *h, const char *name, const char *value)
{
	size_t name_len = strlen(name), value_len = strlen(value);

	if (!reserve(h, name_len + 2 + value_len + 1))
		return;
	append_clean(h, name, name_len);
	memcpy(h->text + h->len, ": ", 2);
	h->len += 2;
	append_clean(h, value, value_len);
	h->text[h->len++] = '\n';
	h->text[h->len] = '\0';
}

void
header_lines_add_long(header_lines *h, const char *name, long value)
{
	char digits[24];

	snprintf(digits, sizeof(digits), "%ld", value);
	header_lines_add(h, name, digits);
}

void
header_lines_add_line(header_lines *h, const char *line)
{
	size_t n = strlen(line);

	if (!reserve(h, n + 1))
		return;
	append_clean(h, line, n);
	h->text[h->len++] = '\n';
	h->text[h->len] = '\0';
}

void
header_lines_release(header_lines *h)
{
	if (h->text != h->inline_buf)
		free(h->text);
	header_lines_init(h);
}
