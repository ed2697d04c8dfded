/*
 * utf8.c: see utf8.h.
 */
#include "utf8.h"

#include <stdint.h>

size_t
utf8_sequence_length(const unsigned char *s, size_t n)
{
	size_t len;
	uint32_t cp;

	if (s[0] >= 0x01 && s[0] <= 0x7f)
		return 1;
	if (s[0] >= 0xc2 && s[0] <= 0xdf)
		len = 2, cp = s[0] & 0x1f;
	else if (s[0] >= 0xe0 && s[0] <= 0xef)
		len = 3, cp = s[0] & 0x0f;
	else if (s[0] >= 0xf0 && s[0] <= 0xf4)
		len = 4, cp = s[0] & 0x07;
	else
		return 0;
	if (len > n)
		return 0;
	for (size_t i = 1; i < len; i++)
	{
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = (cp << 6) | (s[i] & 0x3f);
	}
	if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10ffff ||
		(cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return len;
}
