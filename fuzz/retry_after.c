/*
 * retry_after.c (fuzz target): parse_retry_after (src/workers/common/webhook.c), which
 * reads the Retry-After header of a destination's answer (http_delivery.c keeps its
 * value, up to 127 bytes, as a C string).
 *
 * Input: the header's value; or "now:<seconds>||value" to read it at another moment
 * (default 2026-01-01T00:00:00Z).
 *
 * Invariants: the result is -1 or 0..INT32_MAX; delta-seconds (digits only, spaces
 * around) give their value, clamped; anything that starts with neither a digit nor a
 * letter is refused; for an HTTP-date, a later "now" never asks for a longer wait, and one
 * second later asks for one second less, down to 0; and the result does not depend on
 * the spaces around the value.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <limits.h>
#include <time.h>

#include <curl/curl.h>

#include "common/webhook.h"
#include "fuzz_util.h"

#define DEFAULT_NOW 1767225600L

/* The digits of s (spaces around allowed) as delta-seconds clamped to INT32_MAX, or -2
 * when s is not that. */
static long long
delta_seconds(const char *s)
{
	long long v = 0;
	bool any = false;

	while (isspace((unsigned char) *s))
		s++;
	for (; *s >= '0' && *s <= '9'; s++, any = true)
		v = v < INT32_MAX ? v * 10 + (*s - '0') : v;
	while (isspace((unsigned char) *s))
		s++;
	if (!any || *s != '\0')
		return -2;
	return v > INT32_MAX ? INT32_MAX : v;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_field f[2] = {{(const char *) data, size}};
	time_t now = DEFAULT_NOW;
	char *value, *trimmed;
	const char *start;
	size_t len;
	long result, later, padded;
	long long expected;

	if (size >= 4 && memcmp(data, "now:", 4) == 0 && fuzz_split(data, size, f, 2) == 2)
	{
		long long n = 0;

		for (size_t i = 4;
			 i < f[0].len && f[0].data[i] >= '0' && f[0].data[i] <= '9' && n < 100000000000LL; i++)
			n = n * 10 + (f[0].data[i] - '0');
		now = (time_t) n;
		f[0] = f[1];
	}
	/* A C string in a buffer of its own size: it ends at the first NUL. */
	value = fuzz_cstring(f[0]);
	len = strlen(value);
	result = parse_retry_after(value, now);
	FUZZ_CHECK(result >= -1 && result <= INT32_MAX);

	start = value;
	while (isspace((unsigned char) *start))
		start++;
	expected = delta_seconds(value);
	if (expected != -2 && len < 128)
		FUZZ_CHECK(result == expected);
	if (*start != '\0' && !isdigit((unsigned char) *start) && !isalpha((unsigned char) *start))
		FUZZ_CHECK(result == -1);
	if (*start == '\0')
		FUZZ_CHECK(result == -1);

	/* An HTTP-date: the wait shrinks as time passes. */
	if (result >= 0 && isalpha((unsigned char) *start))
	{
		later = parse_retry_after(value, now + 1);
		FUZZ_CHECK(later >= 0 && later <= result);
		if (result > 0 && result < INT32_MAX)
			FUZZ_CHECK(later == result - 1);
	}

	/* Spaces around the value change nothing (as long as it stays under 128 bytes). */
	trimmed = malloc(len + 3);
	snprintf(trimmed, len + 3, " %s\t", value);
	padded = parse_retry_after(trimmed, now);
	if (len + 2 < 128)
		FUZZ_CHECK(padded == result);
	free(trimmed);

	FUZZ_CHECK(parse_retry_after(NULL, now) == -1);
	free(value);
	return 0;
}
