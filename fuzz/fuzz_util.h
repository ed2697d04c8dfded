/*
 * fuzz_util.h: what the fuzz targets share: cutting an input into fields, checking an
 * invariant, and an independent judge of UTF-8 to compare the production code with.
 *
 * An input is fields separated by "||" (a single "|" is an ordinary byte), so a seed can
 * be written by hand: "flags||topic||{\"a\":1}||order-1".
 */
#ifndef WAL_FUZZ_UTIL_H
#define WAL_FUZZ_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Stops the run (libFuzzer keeps the input) when an invariant does not hold. */
#define FUZZ_CHECK(cond)                                                                           \
	do                                                                                             \
	{                                                                                              \
		if (!(cond))                                                                               \
		{                                                                                          \
			fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__);     \
			__builtin_trap();                                                                      \
		}                                                                                          \
	} while (0)

typedef struct fuzz_field
{
	const char *data;
	size_t len;
} fuzz_field;

#define FUZZ_SEPARATOR     "||"
#define FUZZ_SEPARATOR_LEN 2

/* Cuts data at each "||" into at most max fields (the last takes the rest); the count. */
static inline int
fuzz_split(const uint8_t *data, size_t size, fuzz_field *out, int max)
{
	const char *p = (const char *) data, *end = p + size;
	int n = 0;

	while (n < max)
	{
		const char *sep = n == max - 1 ? NULL : memmem(p, (size_t) (end - p), FUZZ_SEPARATOR, 2);

		out[n].data = p;
		out[n].len = sep ? (size_t) (sep - p) : (size_t) (end - p);
		n++;
		if (sep == NULL)
			break;
		p = sep + FUZZ_SEPARATOR_LEN;
	}
	return n;
}

/* True when field f is exactly the text s. */
static inline bool
fuzz_field_is(fuzz_field f, const char *s)
{
	return f.len == strlen(s) && memcmp(f.data, s, f.len) == 0;
}

/* A malloc'd copy of f with exactly f.len bytes (NULL data stays NULL): ASan sees any
 * read past the end. */
static inline char *
fuzz_exact_copy(fuzz_field f)
{
	char *copy;

	if (f.data == NULL)
		return NULL;
	copy = malloc(f.len ? f.len : 1);
	if (copy == NULL)
		abort();
	memcpy(copy, f.data, f.len);
	return copy;
}

/* A malloc'd NUL-terminated copy of f. */
static inline char *
fuzz_cstring(fuzz_field f)
{
	char *copy = malloc(f.len + 1);

	if (copy == NULL)
		abort();
	memcpy(copy, f.data, f.len);
	copy[f.len] = '\0';
	return copy;
}

/*
 * The offset of the first byte of s that does not start a well-formed UTF-8 sequence
 * (the Unicode Standard's table 3-7), a NUL counting as ill-formed; -1 when there is
 * none. Written from the table, independently of src/shared/utf8.c.
 */
static inline long
fuzz_utf8_invalid_at(const char *text, size_t len)
{
	const unsigned char *s = (const unsigned char *) text;
	size_t i = 0;

	while (i < len)
	{
		unsigned char c = s[i], lo = 0x80, hi = 0xbf;
		size_t n;

		if (c == 0x00)
			return (long) i;
		if (c < 0x80)
		{
			i++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf)
			n = 2;
		else if (c == 0xe0)
			n = 3, lo = 0xa0;
		else if ((c >= 0xe1 && c <= 0xec) || c == 0xee || c == 0xef)
			n = 3;
		else if (c == 0xed)
			n = 3, hi = 0x9f;
		else if (c == 0xf0)
			n = 4, lo = 0x90;
		else if (c >= 0xf1 && c <= 0xf3)
			n = 4;
		else if (c == 0xf4)
			n = 4, hi = 0x8f;
		else
			return (long) i;
		if (len - i < n || s[i + 1] < lo || s[i + 1] > hi)
			return (long) i;
		for (size_t k = 2; k < n; k++)
			if (s[i + k] < 0x80 || s[i + k] > 0xbf)
				return (long) i;
		i += n;
	}
	return -1;
}

/* True when s is valid UTF-8 text with no NUL and no byte below 0x20 or 0x7f. */
static inline bool
fuzz_is_clean_text(const char *s, size_t len)
{
	if (fuzz_utf8_invalid_at(s, len) >= 0)
		return false;
	for (size_t i = 0; i < len; i++)
		if ((unsigned char) s[i] < 0x20 || s[i] == 0x7f)
			return false;
	return true;
}

/* True when buf[0..size) holds a NUL (a C string that ends inside its buffer). */
static inline bool
fuzz_terminated(const char *buf, size_t size)
{
	return memchr(buf, '\0', size) != NULL;
}

#endif
