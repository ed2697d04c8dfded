/*
 * hex.h: the value of one hex digit, for the places that read hex from outside (percent
 * escapes in paths and queries, \x escapes, hex payloads). Either case; W3C trace ids
 * take lowercase only and check that themselves (trace_context.c).
 */
#ifndef WAL_HEX_H
#define WAL_HEX_H

/* 0 to 15, or -1 when c is not a hex digit. */
static inline int
hex_digit_value(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

#endif
