/*
 * record_contract.c: the rules of a record (see record_contract.h).
 *
 * The checks run in a fixed order (payload, idempotency key, message key, content type,
 * headers, size), so a record that breaks two rules gets the same error at every door.
 */
#include "record_contract.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "trace_context.h"
#include "utf8.h"

const char *const record_reserved_headers[] = {
	"idempotency-key",  "outbox-id",     "source-topic", "content-type", "created-at",
	"source-partition", "source-offset", "destination",  "attempt",      "step-entered-at",
	"step-jitter-ms",   "not-before",    "last-error",   "dead-reason",  "payload-omitted"};
const int record_n_reserved_headers =
	(int) (sizeof(record_reserved_headers) / sizeof(record_reserved_headers[0]));

int64_t
record_limit(int32_t max_payload_bytes)
{
	int64_t kafka = max_payload_bytes > 1000000 ? max_payload_bytes : 1000000;

	kafka -= RECORD_HANDOFF_RESERVE;
	return max_payload_bytes < kafka ? max_payload_bytes : kafka;
}

int64_t
record_size(const record_fields *r)
{
	int64_t size = (int64_t) r->payload.len + (int64_t) r->idempotency_key.len;

	if (r->message_key.data != NULL)
		size += (int64_t) r->message_key.len;
	for (int i = 0; i < r->n_headers; i++)
		size += (int64_t) r->headers[i].name.len + (int64_t) r->headers[i].value.len;
	return size;
}

static char
ascii_lower(char c)
{
	return c >= 'A' && c <= 'Z' ? (char) (c - 'A' + 'a') : c;
}

static bool
same_name(record_bytes a, const char *b, size_t b_len)
{
	if (a.len != b_len)
		return false;
	for (size_t i = 0; i < b_len; i++)
		if (ascii_lower(a.data[i]) != ascii_lower(b[i]))
			return false;
	return true;
}

bool
record_header_named(const char *name, size_t len, const char *wanted)
{
	return same_name((record_bytes){name, len}, wanted, strlen(wanted));
}

bool
record_header_is_reserved(const char *name, size_t len)
{
	record_bytes n = {name, len};

	for (int i = 0; i < record_n_reserved_headers; i++)
		if (same_name(n, record_reserved_headers[i], strlen(record_reserved_headers[i])))
			return true;
	return false;
}

const char *
record_topic_name_problem(const char *name, size_t len)
{
	if (len < 1 || len > 249)
		return "a Kafka topic name is 1 to 249 letters, digits, \".\", \"_\" or \"-\"";
	for (size_t i = 0; i < len; i++)
	{
		char c = name[i];

		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
			  c == '.' || c == '_' || c == '-'))
			return "a Kafka topic name is 1 to 249 letters, digits, \".\", \"_\" or \"-\"";
	}
	if ((len == 1 && name[0] == '.') || (len == 2 && name[0] == '.' && name[1] == '.'))
		return "Kafka refuses \".\" and \"..\" as topic names";
	if (len >= 2 && name[0] == '_' && name[1] == '_')
		return "names starting with \"__\" are Kafka's own (__consumer_offsets, "
			   "__transaction_state)";
	return NULL;
}

bool
record_is_http_token(const char *s, size_t len)
{
	if (len < 1 || len > RECORD_MAX_HEADER_NAME)
		return false;
	for (size_t i = 0; i < len; i++)
	{
		unsigned char c = (unsigned char) s[i];

		if (!((c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
			  (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL)))
			return false;
	}
	return true;
}

long
record_invalid_utf8_at(const char *s, size_t len)
{
	const unsigned char *u = (const unsigned char *) s;
	size_t i = 0;

	while (i < len)
	{
		size_t n = utf8_sequence_length(u + i, len - i);

		if (n == 0)
			return (long) i;
		i += n;
	}
	return -1;
}

long
record_control_at(const char *s, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if ((unsigned char) s[i] < 0x20 || (unsigned char) s[i] == 0x7f)
			return (long) i;
	return -1;
}

/* The 1-based character number of byte offset at (a byte that is not UTF-8 counts as one). */
static long
character_number(const char *s, size_t at)
{
	long n = 1;

	for (size_t i = 0; i < at; i++)
		if (((unsigned char) s[i] & 0xc0) != 0x80)
			n++;
	return n;
}

/* A control character as JSON writes it: \n and its kind, else \u00XX. */
static size_t
json_control_escape(char *out, size_t out_size, unsigned char c)
{
	switch (c)
	{
		case '\b':
			return (size_t) snprintf(out, out_size, "\\b");
		case '\t':
			return (size_t) snprintf(out, out_size, "\\t");
		case '\n':
			return (size_t) snprintf(out, out_size, "\\n");
		case '\f':
			return (size_t) snprintf(out, out_size, "\\f");
		case '\r':
			return (size_t) snprintf(out, out_size, "\\r");
		default:
			return (size_t) snprintf(out, out_size, "\\u%04x", c);
	}
}

void
record_quote(char *out, size_t out_size, const char *s, size_t len, size_t max_chars)
{
	const unsigned char *u = (const unsigned char *) s;
	size_t o = 0, i = 0, chars = 0;

	if (out_size < 6)
	{
		if (out_size > 0)
			out[0] = '\0';
		return;
	}
	out[o++] = '"';
	while (i < len)
	{
		char piece[8];
		size_t piece_len, step = utf8_sequence_length(u + i, len - i);

		if (chars == max_chars)
		{
			memcpy(piece, "...", 3);
			piece_len = 3;
			if (o + piece_len + 2 <= out_size)
			{
				memcpy(out + o, piece, piece_len);
				o += piece_len;
			}
			break;
		}
		if (step == 0)
			piece_len = (size_t) snprintf(piece, sizeof(piece), "\\x%02X", u[i]), step = 1;
		else if (u[i] < 0x20 || u[i] == 0x7f)
			piece_len = json_control_escape(piece, sizeof(piece), u[i]);
		else if (u[i] == '"' || u[i] == '\\')
			piece[0] = '\\', piece[1] = (char) u[i], piece_len = 2;
		else
			memcpy(piece, s + i, step), piece_len = step;
		/* Room for the piece, the closing quote and the terminator, or stop cleanly. */
		if (o + piece_len + 2 > out_size)
			break;
		memcpy(out + o, piece, piece_len);
		o += piece_len;
		i += step;
		chars++;
	}
	out[o++] = '"';
	out[o] = '\0';
}

static bool refuse(record_problem *p, const char *sqlstate, int http_status, const char *field,
				   const char *hint, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static bool
refuse(record_problem *p, const char *sqlstate, int http_status, const char *field,
	   const char *hint, const char *fmt, ...)
{
	va_list ap;

	p->sqlstate = sqlstate;
	p->http_status = http_status;
	p->field = field;
	va_start(ap, fmt);
	vsnprintf(p->message, sizeof(p->message), fmt, ap);
	va_end(ap);
	snprintf(p->hint, sizeof(p->hint), "%s", hint);
	return false;
}

/* "U+000A at character 5" for the first control character of s. */
static void
describe_control(char *out, size_t out_size, const char *s, size_t len)
{
	long at = record_control_at(s, len);

	snprintf(out, out_size, "U+%04X at character %ld", (unsigned char) s[at],
			 character_number(s, (size_t) at));
}

/* "byte 0xFF at byte 3" for the first byte of s that is not UTF-8 text. */
static void
describe_invalid(char *out, size_t out_size, const char *s, size_t len)
{
	long at = record_invalid_utf8_at(s, len);

	snprintf(out, out_size, "byte 0x%02X at byte %ld", (unsigned char) s[at], at + 1);
}

static const char utf8_hint[] =
	"Keys, header values and content types are text: send UTF-8 without NUL bytes, and put "
	"binary data in the payload.";

static bool
check_idempotency_key(record_bytes k, record_problem *p)
{
	char where[64];

	if (k.len == 0)
		return refuse(p, "22023", 400, "idempotency_key",
					  "Pass NULL for a generated key, or a short stable identifier such as "
					  "\"order-42-created\".",
					  "idempotency key must not be empty");
	if (k.len > RECORD_MAX_IDEMPOTENCY_KEY)
		return refuse(p, "22001", 400, "idempotency_key",
					  "Destinations see a record as \"<topic>:<key>\" (Idempotency-Key, "
					  "webhook-id), which must stay under 512 bytes to be signed; use a short "
					  "stable identifier such as \"order-42-created\", or a hash of a longer one.",
					  "idempotency key must be at most %d bytes, got %zu",
					  RECORD_MAX_IDEMPOTENCY_KEY, k.len);
	if (record_control_at(k.data, k.len) >= 0)
	{
		describe_control(where, sizeof(where), k.data, k.len);
		return refuse(p, "22023", 400, "idempotency_key",
					  "The key travels in the Idempotency-Key and webhook-id headers, where tabs "
					  "and line breaks cannot; use printable characters.",
					  "idempotency key must not hold control characters, found %s", where);
	}
	if (record_invalid_utf8_at(k.data, k.len) >= 0)
	{
		describe_invalid(where, sizeof(where), k.data, k.len);
		return refuse(p, "22021", 400, "idempotency_key", utf8_hint,
					  "idempotency key is not valid UTF-8: %s", where);
	}
	return true;
}

static bool
check_message_key(record_bytes k, record_problem *p)
{
	char where[64];

	if (k.data == NULL)
		return true;
	if (k.len == 0)
		return refuse(p, "22023", 400, "key",
					  "Pass NULL for no key (records spread over the partitions), or an "
					  "identifier such as the order id to keep its records in order.",
					  "message key must not be empty");
	if (k.len > RECORD_MAX_MESSAGE_KEY)
		return refuse(p, "22001", 400, "key",
					  "The key only chooses the Kafka partition; a short identifier is enough.",
					  "message key must be at most %d bytes, got %zu", RECORD_MAX_MESSAGE_KEY,
					  k.len);
	if (record_invalid_utf8_at(k.data, k.len) >= 0)
	{
		describe_invalid(where, sizeof(where), k.data, k.len);
		return refuse(p, "22021", 400, "key", utf8_hint, "message key is not valid UTF-8: %s",
					  where);
	}
	return true;
}

static bool
check_content_type(record_bytes t, record_problem *p)
{
	char shown[300];

	if (t.data == NULL)
		return true;
	for (size_t i = 0; i < t.len; i++)
		if ((unsigned char) t.data[i] < 0x20 || (unsigned char) t.data[i] > 0x7e)
			goto bad;
	if (t.len >= 1 && t.len <= RECORD_MAX_CONTENT_TYPE)
		return true;
bad:
	record_quote(shown, sizeof(shown), t.data, t.len, 100);
	return refuse(p, "22023", 400, "content_type",
				  "For example application/json or text/plain; charset=utf-8: a media type "
				  "travels in Kafka and HTTP headers, which carry printable ASCII only.",
				  "content type must be 1 to %d printable ASCII characters, got %s",
				  RECORD_MAX_CONTENT_TYPE, shown);
}

/* A header's name as messages show it: quoted only when a refusal needs it. */
static const char *
shown_name(char *out, size_t out_size, const record_header *h)
{
	record_quote(out, out_size, h->name.data, h->name.len, 100);
	return out;
}

/*
 * traceparent and tracestate (in any case, as every header name) are the record's trace
 * context: every delivery attempt continues it, so a value that cannot be read is refused
 * here rather than dropped later.
 */
static bool
check_trace_header(const record_header *h, record_problem *p)
{
	char shown[300];
	const char *problem;
	trace_context tc;

	if (record_header_named(h->name.data, h->name.len, TRACEPARENT_HEADER))
	{
		problem = trace_context_parse(h->value.data, h->value.len, &tc);
		if (problem != NULL)
			return refuse(p, "22023", 400, "headers",
						  "W3C Trace Context: version-traceid-parentid-flags in lowercase hex, for "
						  "example 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01; leave "
						  "the header out when there is no trace.",
						  "header %s is not a valid traceparent: %s",
						  shown_name(shown, sizeof(shown), h), problem);
	}
	else if (record_header_named(h->name.data, h->name.len, TRACESTATE_HEADER))
	{
		problem = tracestate_check(h->value.data, h->value.len);
		if (problem != NULL)
			return refuse(p, "22023", 400, "headers",
						  "W3C Trace Context: a tracestate is at most 512 printable ASCII "
						  "characters (vendor=value pairs separated by commas).",
						  "header %s is not a valid tracestate: %s",
						  shown_name(shown, sizeof(shown), h), problem);
	}
	return true;
}

static bool
check_header(const record_header *headers, int i, record_problem *p)
{
	const record_header *h = &headers[i];
	char shown[300], where[64], hint[600];

	if (!record_is_http_token(h->name.data, h->name.len))
		return refuse(p, "22023", 400, "headers",
					  "A header name is 1 to 256 ASCII letters, digits or !#$%&'*+-.^_`|~ (an "
					  "HTTP token), for example \"trace-id\".",
					  "header name %s is not an HTTP token", shown_name(shown, sizeof(shown), h));
	if (record_header_is_reserved(h->name.data, h->name.len))
	{
		char lower[RECORD_MAX_HEADER_NAME + 1];
		size_t o;

		for (size_t c = 0; c < h->name.len; c++)
			lower[c] = ascii_lower(h->name.data[c]);
		lower[h->name.len] = '\0';
		o = (size_t) snprintf(hint, sizeof(hint),
							  "Rename it, for example \"x-app-%s\". Reserved in any case: ", lower);
		for (int r = 0; r < record_n_reserved_headers && o < sizeof(hint); r++)
			o += (size_t) snprintf(hint + o, sizeof(hint) - o, "%s%s", r ? ", " : "",
								   record_reserved_headers[r]);
		if (o < sizeof(hint))
			snprintf(hint + o, sizeof(hint) - o, ".");
		return refuse(p, "22023", 400, "headers", hint,
					  "header %s is reserved: the relay and the workers write it",
					  shown_name(shown, sizeof(shown), h));
	}
	for (int j = 0; j < i; j++)
		if (same_name(headers[j].name, h->name.data, h->name.len))
			return refuse(p, "22023", 400, "headers",
						  "Header names ignore case, as in HTTP: give each header once.",
						  "header %s is given twice", shown_name(shown, sizeof(shown), h));
	if (record_control_at(h->value.data, h->value.len) >= 0)
	{
		describe_control(where, sizeof(where), h->value.data, h->value.len);
		return refuse(p, "22023", 400, "headers",
					  "A line break would end the header; encode such a value (base64, "
					  "percent-encoding) or leave it out.",
					  "header %s must not hold control characters, found %s",
					  shown_name(shown, sizeof(shown), h), where);
	}
	if (record_invalid_utf8_at(h->value.data, h->value.len) >= 0)
	{
		describe_invalid(where, sizeof(where), h->value.data, h->value.len);
		return refuse(p, "22021", 400, "headers", utf8_hint, "header %s is not valid UTF-8: %s",
					  shown_name(shown, sizeof(shown), h), where);
	}
	return check_trace_header(h, p);
}

/* The topic as messages show it; only a refusal needs it (a valid record costs nothing). */
static void
quote_topic(char *out, size_t out_size, const record_fields *r)
{
	record_quote(out, out_size, r->topic.data ? r->topic.data : "", r->topic.len, 249);
}

bool
record_check(const record_fields *r, int64_t limit, record_problem *p)
{
	char topic[300];
	int64_t size;

	if (r->payload.data == NULL)
	{
		quote_topic(topic, sizeof(topic), r);
		return refuse(p, "22004", 400, "payload",
					  "Enqueue an empty JSON object or empty bytes if the record has no body.",
					  "payload must not be NULL (topic %s)", topic);
	}
	if (!check_idempotency_key(r->idempotency_key, p) || !check_message_key(r->message_key, p) ||
		!check_content_type(r->content_type, p))
		return false;
	if (r->n_headers > RECORD_MAX_HEADERS)
		return refuse(p, "54000", 413, "headers", "Put what does not fit in the payload.",
					  "headers must be at most %d, got %d", RECORD_MAX_HEADERS, r->n_headers);
	for (int i = 0; i < r->n_headers; i++)
		if (!check_header(r->headers, i, p))
			return false;
	size = record_size(r);
	if (size > limit)
	{
		int64_t header_bytes = size - (int64_t) r->payload.len - (int64_t) r->idempotency_key.len -
							   (r->message_key.data ? (int64_t) r->message_key.len : 0);

		quote_topic(topic, sizeof(topic), r);
		return refuse(
			p, "54000", 413, "size",
			"Send a smaller payload (for example a reference to the data). The limit is the "
			"topic's max_payload_bytes, less 16384 bytes kept for the workers' hand-off headers "
			"when that is above 983616; raise max_payload_bytes only together with Kafka's "
			"message limits.",
			"record of %lld bytes is over the limit of topic %s (%lld bytes): payload %zu, "
			"idempotency key %zu, message key %zu, headers %lld",
			(long long) size, topic, (long long) limit, r->payload.len, r->idempotency_key.len,
			r->message_key.data ? r->message_key.len : 0, (long long) header_bytes);
	}
	return true;
}
