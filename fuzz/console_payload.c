/*
 * console_payload.c (fuzz target): console_payload_view and console_unhex
 * (src/workers/console/console_payload.c), how the console shows a dead letter's payload,
 * which a stranger wrote, and reads it back from Postgres's hex.
 *
 * Input: the payload; or "cut:<n>||payload" to show only its first n bytes, as the
 * console does past 64 KiB.
 *
 * Invariants: the view says the payload's size and whether it was cut; text is shown
 * exactly when the shown bytes are UTF-8 without a NUL (judged by fuzz_utf8_invalid_at,
 * not src/shared/utf8.c), but for a character the cut split, which is left out (at most
 * 3 bytes); the text is those bytes, unchanged; anything else is hex of every shown byte,
 * which console_unhex turns back into them; console_unhex refuses odd lengths and
 * non-hex digits.
 */
#define _GNU_SOURCE
#include <jansson.h>

#include "console/console_payload.h"
#include "fuzz_util.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_field f[2] = {{(const char *) data, size}};
	size_t total, shown;
	unsigned char *bytes, *back;
	json_t *view;
	const char *kind;
	size_t shown_bytes;
	bool truncated, all_text;

	if (size >= 4 && memcmp(data, "cut:", 4) == 0 && fuzz_split(data, size, f, 2) == 2)
	{
		size_t n = 0;

		for (size_t i = 4;
			 i < f[0].len && f[0].data[i] >= '0' && f[0].data[i] <= '9' && n < 1000000; i++)
			n = n * 10 + (size_t) (f[0].data[i] - '0');
		f[0] = f[1];
		total = f[0].len;
		shown = n < total ? n : total;
	}
	else
		total = shown = size;
	bytes = (unsigned char *) fuzz_exact_copy((fuzz_field){f[0].data, shown});
	view = console_payload_view(bytes, shown, total);
	FUZZ_CHECK(json_is_object(view));
	kind = json_string_value(json_object_get(view, "kind"));
	truncated = json_is_true(json_object_get(view, "truncated"));
	shown_bytes = (size_t) json_integer_value(json_object_get(view, "shown_bytes"));
	FUZZ_CHECK(kind != NULL);
	FUZZ_CHECK(truncated == (shown < total));
	FUZZ_CHECK((size_t) json_integer_value(json_object_get(view, "bytes")) == total);
	all_text = fuzz_utf8_invalid_at((const char *) bytes, shown) < 0;

	if (strcmp(kind, "text") == 0)
	{
		const char *text = json_string_value(json_object_get(view, "text"));
		size_t len = json_string_length(json_object_get(view, "text"));

		FUZZ_CHECK(text != NULL && len == shown_bytes && shown_bytes <= shown);
		FUZZ_CHECK(memcmp(text, bytes, len) == 0);
		FUZZ_CHECK(fuzz_utf8_invalid_at(text, len) < 0);
		if (!truncated || all_text)
			FUZZ_CHECK(all_text && shown_bytes == shown);
		else
			FUZZ_CHECK(shown - shown_bytes < 4);
	}
	else
	{
		const char *hex = json_string_value(json_object_get(view, "hex"));

		FUZZ_CHECK(strcmp(kind, "binary") == 0 && !all_text);
		FUZZ_CHECK(hex != NULL && strlen(hex) == 2 * shown && shown_bytes == shown);
		back = malloc(shown + 1);
		FUZZ_CHECK(console_unhex(hex, 2 * shown, back));
		FUZZ_CHECK(memcmp(back, bytes, shown) == 0);
		free(back);
	}
	json_decref(view);

	/* The input itself read as hex: decoded only when every byte is a hex digit. */
	back = malloc(size / 2 + 1);
	{
		bool ok = console_unhex((const char *) data, size, back);
		bool all_hex = size % 2 == 0;

		for (size_t i = 0; i < size && all_hex; i++)
			all_hex = (data[i] >= '0' && data[i] <= '9') || (data[i] >= 'a' && data[i] <= 'f') ||
					  (data[i] >= 'A' && data[i] <= 'F');
		FUZZ_CHECK(ok == all_hex);
	}
	free(back);
	free(bytes);
	return 0;
}
