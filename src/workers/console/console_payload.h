/*
 * console_payload.h: how the console shows a dead letter's payload, which a stranger
 * wrote: valid UTF-8 as text (the page pretty-prints it when it parses as JSON and shows
 * it with textContent, never as HTML), anything else as hex. At most
 * CONSOLE_PAYLOAD_SHOWN bytes are shown; the rest is a download.
 */
#ifndef WAL_CONSOLE_PAYLOAD_H
#define WAL_CONSOLE_PAYLOAD_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/*
 * {"kind": "text"|"binary", "text" or "hex": ..., "shown_bytes": n, "bytes": total,
 * "truncated": bool} for the first shown bytes of a payload of total bytes. A cut
 * through the middle of a UTF-8 character at the end of a truncated payload still
 * counts as text (the partial character is left out).
 */
json_t *console_payload_view(const unsigned char *bytes, size_t shown, size_t total);

/* Decodes PostgreSQL's hex text (no \x) into out (len/2 bytes); false when malformed. */
bool console_unhex(const char *hex, size_t len, unsigned char *out);

#endif
