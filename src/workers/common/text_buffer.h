/*
 * text_buffer.h: a growing NUL-terminated string, for text built piece by piece (the
 * /metrics page, array literals sent to the database). Running out of memory is fatal.
 */
#ifndef WAL_TEXT_BUFFER_H
#define WAL_TEXT_BUFFER_H

#include <stddef.h>

typedef struct text_buffer
{
	char *data; /* NULL until the first reserve or append; the caller frees it */
	size_t len;
	size_t cap;
} text_buffer;

/* Room for extra more bytes plus the NUL. */
void text_buffer_reserve(text_buffer *buf, size_t extra);
void text_buffer_append(text_buffer *buf, const char *s, size_t len);
void text_buffer_puts(text_buffer *buf, const char *s);

#endif
