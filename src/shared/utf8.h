/*
 * utf8.h: telling valid UTF-8 from bytes that only look like text. Values from outside
 * (Kafka headers, HTTP answers) go into logs and the database, which both need UTF-8.
 */
#ifndef WAL_UTF8_H
#define WAL_UTF8_H

#include <stddef.h>

/*
 * Length of the valid UTF-8 sequence at s (at most n bytes, n >= 1), or 0 when the
 * bytes there are not one: a NUL, a stray continuation byte, an overlong form, a
 * surrogate, past U+10FFFF, or cut short.
 */
size_t utf8_sequence_length(const unsigned char *s, size_t n);

#endif
