/*
 * log.c: structured, line-at-a-time logging to stderr (see log.h).
 *
 * Values often come from outside (idempotency keys, HTTP answers, libpq's multi-line
 * errors), so every %s argument is escaped as it is formatted: a value can never end
 * the line or the quotes it stands in, and one event is always one line.
 */
#include "log.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shared/utf8.h"

#define LOG_LINE_MAX 4096
/* A longer value is cut, marked "...(N bytes)", so a line keeps all its fields. */
#define LOG_VALUE_MAX 512

static const char *log_role = "wal-worker";
static log_level log_min_level = LOG_INFO;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

void
log_set_role(const char *role)
{
	log_role = role;
}

void
log_set_min_level(log_level level)
{
	log_min_level = level;
}

/* A bounded string being built; writes past the end are dropped, the text stays whole. */
typedef struct
{
	char *buf;
	size_t size;
	size_t len;
} line_buffer;

static void
put_char(line_buffer *out, char c)
{
	if (out->len + 1 < out->size)
		out->buf[out->len++] = c;
}

static void
put_text(line_buffer *out, const char *text, size_t n)
{
	for (size_t i = 0; i < n; i++)
		put_char(out, text[i]);
}

/* A bare value must be quoted when it is empty or holds what separates logfmt fields. */
static bool
needs_quotes(const char *value, size_t n)
{
	if (n == 0)
		return true;
	for (size_t i = 0; i < n; i++)
	{
		unsigned char c = (unsigned char) value[i];

		if (c <= ' ' || c == '"' || c == '=' || c == '\\' || c >= 0x7f)
			return true;
	}
	return false;
}

/*
 * UTF-8 characters that readers splitting by Unicode's rules (Python's splitlines, for
 * one) take for a line break, though they are not bytes < 0x20: the C1 controls
 * U+0080-U+009F (NEL among them) and U+2028, U+2029. Left raw, one in a value would cut
 * its event in two.
 */
static bool
breaks_lines(const unsigned char *p, size_t seq)
{
	if (seq == 2)
		return p[0] == 0xc2 && p[1] <= 0x9f;
	return seq == 3 && p[0] == 0xe2 && p[1] == 0x80 && (p[2] == 0xa8 || p[2] == 0xa9);
}

/*
 * Appends value with ", \, control characters (C1 and the Unicode line separators too)
 * and bytes that are not UTF-8 escaped.
 */
static void
put_escaped(line_buffer *out, const char *value, size_t n)
{
	static const char hex[] = "0123456789abcdef";

	for (size_t i = 0; i < n; i++)
	{
		unsigned char c = (unsigned char) value[i];
		size_t seq = c >= 0x80 ? utf8_sequence_length((const unsigned char *) value + i, n - i) : 1;

		if (seq > 1 && !breaks_lines((const unsigned char *) value + i, seq))
		{
			put_text(out, value + i, seq);
			i += seq - 1;
		}
		else if (seq > 1)
		{
			/* Each byte as \xNN: the characters readers may take for a line break. */
			for (size_t b = 0; b < seq; b++)
			{
				unsigned char byte = (unsigned char) value[i + b];

				put_text(out, "\\x", 2);
				put_char(out, hex[byte >> 4]);
				put_char(out, hex[byte & 0xf]);
			}
			i += seq - 1;
		}
		else if (c == '"' || c == '\\')
		{
			put_char(out, '\\');
			put_char(out, (char) c);
		}
		else if (c == '\n')
			put_text(out, "\\n", 2);
		else if (c == '\r')
			put_text(out, "\\r", 2);
		else if (c == '\t')
			put_text(out, "\\t", 2);
		else if (c < 0x20 || c >= 0x7f)
		{
			put_text(out, "\\x", 2);
			put_char(out, hex[c >> 4]);
			put_char(out, hex[c & 0xf]);
		}
		else
			put_char(out, (char) c);
	}
}

/*
 * A %s value: inside quotes written by the format it is only escaped; standing bare
 * (key=%s) it is quoted too when it would otherwise split into other fields.
 */
static void
put_string_value(line_buffer *out, const char *value, size_t n, bool quoted_by_format)
{
	if (value == NULL)
	{
		value = "(null)";
		n = 6;
	}
	size_t shown = n > LOG_VALUE_MAX ? LOG_VALUE_MAX : n;
	bool quote = !quoted_by_format && (n > shown || needs_quotes(value, n));

	if (quote)
		put_char(out, '"');
	put_escaped(out, value, shown);
	if (n > shown)
	{
		char more[48];

		snprintf(more, sizeof(more), "...(%zu bytes)", n);
		put_text(out, more, strlen(more));
	}
	if (quote)
		put_char(out, '"');
}

/*
 * A line cut at LOG_LINE_MAX may end inside a quoted value: close it, so the line still
 * parses as its fields.
 */
static void
close_open_quote(line_buffer *out)
{
	bool open = false;

	for (size_t i = 0; i < out->len; i++)
	{
		if (out->buf[i] == '\\')
			i++;
		else if (out->buf[i] == '"')
			open = !open;
	}
	if (!open)
		return;
	/* Room for the quote: drop a trailing backslash (half an escape) or the last byte. */
	while (out->len > 0 && (out->len + 1 >= out->size || out->buf[out->len - 1] == '\\'))
		out->len--;
	out->buf[out->len++] = '"';
}

/* Formats one non-string conversion (spec is e.g. "%-5ld") with its argument from ap. */
static void
put_number(line_buffer *out, const char *spec, char conversion, const char *length, int star_count,
		   va_list *ap)
{
	char piece[128];
	int stars[2] = {0, 0};

	for (int i = 0; i < star_count; i++)
		stars[i] = va_arg(*ap, int);

#define FORMAT_ARG(type)                                                                           \
	do                                                                                             \
	{                                                                                              \
		type v = va_arg(*ap, type);                                                                \
		if (star_count == 2)                                                                       \
			snprintf(piece, sizeof(piece), spec, stars[0], stars[1], v);                           \
		else if (star_count == 1)                                                                  \
			snprintf(piece, sizeof(piece), spec, stars[0], v);                                     \
		else                                                                                       \
			snprintf(piece, sizeof(piece), spec, v);                                               \
	} while (0)

	/* Signed and unsigned of one width travel alike through varargs; the spec decides. */
	if (strchr("diouxXc", conversion) != NULL)
	{
		if (strcmp(length, "ll") == 0)
			FORMAT_ARG(long long);
		else if (strcmp(length, "l") == 0)
			FORMAT_ARG(long);
		else if (strcmp(length, "z") == 0 || strcmp(length, "t") == 0)
			FORMAT_ARG(size_t);
		else if (strcmp(length, "j") == 0)
			FORMAT_ARG(intmax_t);
		else
			FORMAT_ARG(int);
	}
	else if (conversion == 'p')
		FORMAT_ARG(void *);
	else if (strcmp(length, "L") == 0)
		FORMAT_ARG(long double);
	else
		FORMAT_ARG(double);
#undef FORMAT_ARG
	put_text(out, piece, strlen(piece));
}

/* vsnprintf, except that every %s argument goes through put_string_value. */
static void
format_event(line_buffer *out, const char *fmt, va_list ap_in)
{
	va_list ap;

	va_copy(ap, ap_in);
	for (const char *p = fmt; *p != '\0'; p++)
	{
		const char *start = p;
		char spec[32];
		char length[3] = "";
		int star_count = 0;
		bool has_precision = false;
		int precision = -1;

		if (*p != '%')
		{
			put_char(out, *p);
			continue;
		}
		p++;
		if (*p == '%')
		{
			put_char(out, '%');
			continue;
		}
		while (*p != '\0' && strchr("-+ #0", *p) != NULL)
			p++;
		if (*p == '*')
			star_count++, p++;
		while (*p >= '0' && *p <= '9')
			p++;
		if (*p == '.')
		{
			has_precision = true;
			p++;
			if (*p == '*')
				star_count++, p++;
			while (*p >= '0' && *p <= '9')
				p++;
		}
		for (size_t n = 0; *p != '\0' && strchr("hljztL", *p) != NULL; p++)
			if (n < 2)
				length[n++] = *p;
		if (*p == '\0')
			break;
		if (*p == 's')
		{
			/* Only "%s" and "%.*s" are used with strings. */
			if (has_precision && star_count == 1)
				precision = va_arg(ap, int);
			const char *value = va_arg(ap, const char *);
			size_t n = value == NULL ? 0 : strlen(value);

			if (precision >= 0 && (size_t) precision < n)
				n = (size_t) precision;
			put_string_value(out, value, n, start > fmt && start[-1] == '"');
			continue;
		}
		if ((size_t) (p - start + 1) >= sizeof(spec))
			break;
		memcpy(spec, start, (size_t) (p - start + 1));
		spec[p - start + 1] = '\0';
		put_number(out, spec, *p, length, star_count, &ap);
	}
	va_end(ap);
	close_open_quote(out);
	out->buf[out->len] = '\0';
}

/* A record's fields (see log_record_event), after what the format wrote. */
typedef struct record_fields
{
	const char *topic;
	const char *key;
	const char *trace_id;
} record_fields;

static void
put_field(line_buffer *out, const char *name, const char *value)
{
	put_char(out, ' ');
	put_text(out, name, strlen(name));
	put_char(out, '=');
	put_string_value(out, value, value ? strlen(value) : 0, false);
}

static void
put_record_fields(line_buffer *out, const record_fields *r)
{
	put_field(out, "topic", r->topic);
	put_field(out, "key", r->key);
	if (r->trace_id != NULL)
		put_field(out, "trace_id", r->trace_id);
	close_open_quote(out);
	out->buf[out->len] = '\0';
}

static void
log_vwrite(log_level level, const char *file, int line, const record_fields *r, const char *fmt,
		   va_list ap)
{
	struct timespec now;
	struct tm tm;
	char stamp[32];
	char message[LOG_LINE_MAX];
	line_buffer out = {message, sizeof(message), 0};

	clock_gettime(CLOCK_REALTIME, &now);
	gmtime_r(&now.tv_sec, &tm);
	strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
	format_event(&out, fmt, ap);
	if (r != NULL)
		put_record_fields(&out, r);

	/* One fprintf per line keeps lines whole when threads log at once. */
	if (level >= LOG_WARN)
		fprintf(stderr, "%s.%03ldZ level=%s role=%s at=%s:%d %s\n", stamp, now.tv_nsec / 1000000,
				level_names[level], log_role, file, line, message);
	else
		fprintf(stderr, "%s.%03ldZ level=%s role=%s %s\n", stamp, now.tv_nsec / 1000000,
				level_names[level], log_role, message);
}

void
log_event(log_level level, const char *file, int line, const char *fmt, ...)
{
	va_list ap;

	if (level < log_min_level)
		return;
	va_start(ap, fmt);
	log_vwrite(level, file, line, NULL, fmt, ap);
	va_end(ap);
}

void
log_record_event(log_level level, const char *file, int line, const char *topic, const char *key,
				 const char *trace_id, const char *fmt, ...)
{
	record_fields r = {topic, key, trace_id};
	va_list ap;

	if (level < log_min_level)
		return;
	va_start(ap, fmt);
	log_vwrite(level, file, line, &r, fmt, ap);
	va_end(ap);
}

void
log_fatal(const char *file, int line, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	log_vwrite(LOG_ERROR, file, line, NULL, fmt, ap);
	va_end(ap);
	exit(1);
}
