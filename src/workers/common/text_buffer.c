/*
 * text_buffer.c: see text_buffer.h.
 */
#include "text_buffer.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"

void
text_buffer_reserve(text_buffer *buf, size_t extra)
{
	if (buf->data != NULL && buf->len + extra + 1 <= buf->cap)
		return;
	while (buf->len + extra + 1 > buf->cap)
		buf->cap = buf->cap ? buf->cap * 2 : 1024;
	buf->data = realloc(buf->data, buf->cap);
	if (buf->data == NULL)
		fatal("event=out_of_memory bytes=%zu", buf->cap);
	if (buf->len == 0)
		buf->data[0] = '\0';
}

void
text_buffer_append(text_buffer *buf, const char *s, size_t len)
{
	text_buffer_reserve(buf, len);
	memcpy(buf->data + buf->len, s, len);
	buf->len += len;
	buf->data[buf->len] = '\0';
}

void
text_buffer_puts(text_buffer *buf, const char *s)
{
	text_buffer_append(buf, s, strlen(s));
}
