/*
 * pg_array.c: Postgres array literals, element by element (see pg_array.h).
 */
#include "pg_array.h"

#include <inttypes.h>
#include <stdio.h>

void
pg_array_begin(pg_array *a)
{
	a->text = (text_buffer){0};
	a->n = 0;
	text_buffer_puts(&a->text, "{");
}

/* The comma between elements. */
static void
next_element(pg_array *a)
{
	if (a->n++ > 0)
		text_buffer_puts(&a->text, ",");
}

void
pg_array_add_int64(pg_array *a, int64_t value)
{
	char digits[24];

	next_element(a);
	snprintf(digits, sizeof(digits), "%" PRId64, value);
	text_buffer_puts(&a->text, digits);
}

void
pg_array_add_text(pg_array *a, const char *s)
{
	next_element(a);
	if (s == NULL)
	{
		text_buffer_puts(&a->text, "NULL");
		return;
	}
	text_buffer_puts(&a->text, "\"");
	for (; *s; s++)
	{
		if (*s == '"' || *s == '\\')
			text_buffer_append(&a->text, "\\", 1);
		text_buffer_append(&a->text, s, 1);
	}
	text_buffer_puts(&a->text, "\"");
}

void
pg_array_add_bytea(pg_array *a, const char *bytes, size_t len)
{
	static const char hex[] = "0123456789abcdef";
	text_buffer *b = &a->text;

	next_element(a);
	if (bytes == NULL)
	{
		text_buffer_puts(b, "NULL");
		return;
	}
	/* Written in place: a payload can be megabytes, two characters a byte. */
	text_buffer_reserve(b, 2 * len + 8);
	text_buffer_puts(b, "\"\\\\x");
	for (size_t i = 0; i < len; i++)
	{
		b->data[b->len++] = hex[(unsigned char) bytes[i] >> 4];
		b->data[b->len++] = hex[(unsigned char) bytes[i] & 15];
	}
	b->data[b->len] = '\0';
	text_buffer_puts(b, "\"");
}

char *
pg_array_finish(pg_array *a)
{
	text_buffer_puts(&a->text, "}");
	return a->text.data;
}
