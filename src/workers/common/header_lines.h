/*
 * header_lines.h: HTTP request headers as "Name: value\n" text, built without an
 * allocation per header (a delivery sends eight or more, for every copy of every record).
 *
 * The text lives in the struct's own 2 KB buffer and moves to the heap only when it
 * outgrows it, so a header_lines on the stack costs no malloc in the usual case. Values
 * are copied with CR and LF replaced by spaces: a value comes from a Kafka header or the
 * config, and a line break in it would inject a header of its own.
 */
#ifndef WAL_HEADER_LINES_H
#define WAL_HEADER_LINES_H

#include <stdbool.h>
#include <stddef.h>

typedef struct header_lines
{
	char *text; /* NUL-terminated lines; inline_buf until it outgrows it */
	size_t len;
	size_t cap;
	bool failed; /* out of memory: later adds do nothing */
	char inline_buf[2048];
} header_lines;

/* Must be called before use; the struct must not be copied or moved afterwards. */
void header_lines_init(header_lines *h);

/* Adds "name: value". */
void header_lines_add(header_lines *h, const char *name, const char *value);

/* Adds "name: <value>" for a number. */
void header_lines_add_long(header_lines *h, const char *name, long value);

/* Adds a whole "Name: value" line as given (CR/LF replaced like values). */
void header_lines_add_line(header_lines *h, const char *line);

/* Frees heap text, if any. */
void header_lines_release(header_lines *h);

#endif
