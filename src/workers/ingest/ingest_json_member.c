/*
 * ingest_json_member.c: the text of one member of a JSON object (see ingest_json_member.h).
 *
 * The text was validated by jansson first, so this only walks it: strings (with their
 * escapes), brackets and the commas between members. No recursion: nesting is a count.
 */
#include "ingest_json_member.h"

#include <string.h>

#include <jansson.h>

static size_t
skip_space(const char *s, size_t i, size_t len)
{
	while (i < len && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
		i++;
	return i;
}

/* s[i] is the opening quote; returns the index past the closing one. */
static size_t
skip_string(const char *s, size_t i, size_t len)
{
	for (i++; i < len; i++)
	{
		if (s[i] == '\\')
			i++;
		else if (s[i] == '"')
			return i + 1;
	}
	return len;
}

/* Returns the index past the value that starts at s[i]. */
static size_t
skip_value(const char *s, size_t i, size_t len)
{
	int depth = 0;

	while (i < len)
	{
		char c = s[i];

		if (c == '"')
		{
			i = skip_string(s, i, len);
			if (depth == 0)
				return i;
			continue;
		}
		if (c == '{' || c == '[')
			depth++;
		else if (c == '}' || c == ']')
		{
			if (depth == 0)
				return i; /* the end of the enclosing object: a scalar ended here */
			if (--depth == 0)
				return i + 1;
		}
		else if (depth == 0 && (c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r'))
			return i;
		i++;
	}
	return i;
}

/* The quoted member name s[start, end) is name, once its escapes are decoded. */
static bool
name_is(const char *s, size_t start, size_t end, const char *name)
{
	json_t *decoded;
	bool same;

	if (end - start < 2)
		return false;
	if (memchr(s + start, '\\', end - start) == NULL)
		return end - start - 2 == strlen(name) && memcmp(s + start + 1, name, end - start - 2) == 0;
	decoded = json_loadb(s + start, end - start, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
	same = json_is_string(decoded) && json_string_length(decoded) == strlen(name) &&
		   memcmp(json_string_value(decoded), name, strlen(name)) == 0;
	json_decref(decoded);
	return same;
}

bool
json_member_text(const char *text, size_t len, const char *name, const char **value,
				 size_t *value_len)
{
	size_t i = skip_space(text, 0, len);

	if (i >= len || text[i] != '{')
		return false;
	i++;
	for (;;)
	{
		size_t name_start, name_end, value_start;

		i = skip_space(text, i, len);
		if (i >= len || text[i] != '"')
			return false; /* "}" or the end: no such member */
		name_start = i;
		i = name_end = skip_string(text, i, len);
		i = skip_space(text, i, len);
		if (i >= len || text[i] != ':')
			return false;
		i = value_start = skip_space(text, i + 1, len);
		i = skip_value(text, i, len);
		if (name_is(text, name_start, name_end, name))
		{
			*value = text + value_start;
			*value_len = i - value_start;
			return true;
		}
		i = skip_space(text, i, len);
		if (i < len && text[i] == ',')
			i++;
	}
}
