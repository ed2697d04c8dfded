/*
 * console_payload.c: see console_payload.h.
 */
#include "console/console_payload.h"

#include <stdbool.h>
#include <stdlib.h>

#include "shared/hex.h"
#include "shared/utf8.h"

bool
console_unhex(const char *hex, size_t len, unsigned char *out)
{
	if (len % 2 != 0)
		return false;
	for (size_t i = 0; i < len; i += 2)
	{
		int hi = hex_digit_value(hex[i]), lo = hex_digit_value(hex[i + 1]);

		if (hi < 0 || lo < 0)
			return false;
		out[i / 2] = (unsigned char) (hi << 4 | lo);
	}
	return true;
}

/* How many leading bytes are valid UTF-8 (a NUL counts as not text), up to n. */
static size_t
utf8_prefix(const unsigned char *s, size_t n)
{
	size_t i = 0;

	while (i < n)
	{
		size_t len = utf8_sequence_length(s + i, n - i);

		if (len == 0)
			break;
		i += len;
	}
	return i;
}

json_t *
console_payload_view(const unsigned char *bytes, size_t shown, size_t total)
{
	size_t valid = utf8_prefix(bytes, shown);
	bool truncated = shown < total;
	json_t *view;

	/* Text when all of it is, but for a character the cut split (at most 3 bytes). */
	if (valid == shown ||
		(truncated && shown - valid < 4 && valid > 0 &&
		 utf8_sequence_length(bytes + valid, shown - valid) == 0 && (bytes[valid] & 0xC0) == 0xC0))
	{
		view = json_pack("{s:s, s:s%}", "kind", "text", "text", (const char *) bytes, valid);
		json_object_set_new(view, "shown_bytes", json_integer((json_int_t) valid));
	}
	else
	{
		char *hex = malloc(shown * 2 + 1);
		static const char digits[] = "0123456789abcdef";

		for (size_t i = 0; i < shown; i++)
		{
			hex[2 * i] = digits[bytes[i] >> 4];
			hex[2 * i + 1] = digits[bytes[i] & 15];
		}
		hex[shown * 2] = '\0';
		view = json_pack("{s:s, s:s}", "kind", "binary", "hex", hex);
		json_object_set_new(view, "shown_bytes", json_integer((json_int_t) shown));
		free(hex);
	}
	json_object_set_new(view, "bytes", json_integer((json_int_t) total));
	json_object_set_new(view, "truncated", json_boolean(truncated));
	return view;
}
