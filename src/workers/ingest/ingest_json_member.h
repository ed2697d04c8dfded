/*
 * ingest_json_member.h: the text of one member of a JSON object, as the client wrote it.
 *
 * A batch line's "value" becomes the record's payload byte for byte: parsing it and
 * writing it out again would change it (19.99 becomes 19.989999999999998 as a double,
 * an integer over 64 bits cannot be held at all), and the record stored must be the one
 * sent.
 */
#ifndef WAL_INGEST_JSON_MEMBER_H
#define WAL_INGEST_JSON_MEMBER_H

#include <stdbool.h>
#include <stddef.h>

/*
 * text (len bytes) is one JSON object that jansson already accepted. Sets *value and
 * *value_len to the text of its member name (escapes in the member's name are decoded
 * before comparing); false when it has none.
 */
bool json_member_text(const char *text, size_t len, const char *name, const char **value,
					  size_t *value_len);

#endif
