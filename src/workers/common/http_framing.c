/*
 * http_framing.c: see http_framing.h.
 */
#include "http_framing.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

size_t
http_keep_escaped(void *cls, struct MHD_Connection *connection, char *s)
{
	(void) cls;
	(void) connection;
	return strlen(s);
}

/* What the header walk found. */
typedef struct
{
	int content_lengths;
	int transfer_encodings;
	bool chunked; /* the (last) Transfer-Encoding is "chunked" */
	int hosts;
	bool nul;        /* a header holds a NUL byte */
	char nul_in[64]; /* the first such header's name, escaped */
} header_walk;

static enum MHD_Result
count_header(void *arg, enum MHD_ValueKind kind, const char *name, size_t name_len,
			 const char *value, size_t value_len)
{
	header_walk *w = arg;

	(void) kind;
	if (!w->nul && (memchr(name, '\0', name_len) != NULL ||
					(value != NULL && memchr(value, '\0', value_len) != NULL)))
	{
		w->nul = true;
		http_escape(name, name_len, w->nul_in, sizeof(w->nul_in));
	}
	if (strcasecmp(name, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0)
		w->content_lengths++;
	else if (strcasecmp(name, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0)
	{
		w->transfer_encodings++;
		w->chunked = value != NULL && value_len == 7 && strncasecmp(value, "chunked", 7) == 0;
	}
	else if (strcasecmp(name, MHD_HTTP_HEADER_HOST) == 0)
		w->hosts++;
	return MHD_YES;
}

/* How many headers are named name. */
typedef struct
{
	const char *name;
	int count;
} name_count;

static enum MHD_Result
count_name(void *arg, enum MHD_ValueKind kind, const char *name, size_t name_len, const char *value,
		   size_t value_len)
{
	name_count *c = arg;

	(void) kind;
	(void) name_len;
	(void) value;
	(void) value_len;
	if (strcasecmp(name, c->name) == 0)
		c->count++;
	return MHD_YES;
}

bool
http_framing_ok(struct MHD_Connection *connection, const char *const *singletons, char *why,
				size_t why_size)
{
	header_walk w = {0};

	MHD_get_connection_values_n(connection, MHD_HEADER_KIND, count_header, &w);
	if (w.nul)
		snprintf(why, why_size, "header %s holds a NUL byte", w.nul_in);
	else if (w.content_lengths > 1)
		snprintf(why, why_size,
				 "the request has %d Content-Length headers: send one (or Transfer-Encoding: "
				 "chunked alone)",
				 w.content_lengths);
	else if (w.transfer_encodings > 1)
		snprintf(why, why_size,
				 "the request has %d Transfer-Encoding headers: send one, \"chunked\"",
				 w.transfer_encodings);
	else if (w.transfer_encodings == 1 && w.content_lengths == 1)
		snprintf(why, why_size,
				 "the request has both Transfer-Encoding and Content-Length: send one of them");
	else if (w.transfer_encodings == 1 && !w.chunked)
		snprintf(why, why_size,
				 "Transfer-Encoding must be \"chunked\" (no other coding is accepted)");
	else if (w.hosts > 1)
		snprintf(why, why_size, "the request has %d Host headers: send one", w.hosts);
	else
	{
		for (const char *const *s = singletons; s != NULL && *s != NULL; s++)
		{
			name_count c = {.name = *s};

			MHD_get_connection_values_n(connection, MHD_HEADER_KIND, count_name, &c);
			if (c.count > 1)
			{
				snprintf(why, why_size, "the request has %d %s headers: send one", c.count, *s);
				return false;
			}
		}
		return true;
	}
	return false;
}

void
http_escape(const char *s, size_t len, char *out, size_t out_size)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t total = 0, o = 0;

	if (out_size == 0)
		return;
	for (size_t i = 0; i < len; i++)
		total += (unsigned char) s[i] > 0x20 && (unsigned char) s[i] < 0x7f ? 1 : 3;
	for (size_t i = 0; i < len; i++)
	{
		unsigned char c = (unsigned char) s[i];
		size_t need = c > 0x20 && c < 0x7f ? 1 : 3;

		/* When it is cut, room is kept for "..." */
		if (o + need + (total < out_size ? 0 : 3) >= out_size)
		{
			if (o + 3 < out_size)
			{
				memcpy(out + o, "...", 3);
				o += 3;
			}
			break;
		}
		if (need == 1)
			out[o++] = (char) c;
		else
		{
			out[o++] = '%';
			out[o++] = hex[c >> 4];
			out[o++] = hex[c & 0xf];
		}
	}
	out[o] = '\0';
}

bool
http_header(struct MHD_Connection *connection, const char *name, const char **value, size_t *len)
{
	return MHD_lookup_connection_value_n(connection, MHD_HEADER_KIND, name, strlen(name), value,
										 len) == MHD_YES;
}

bool
http_bearer_token(struct MHD_Connection *connection, const char **token, size_t *len)
{
	static const char scheme[] = "Bearer";
	const size_t scheme_len = sizeof(scheme) - 1;
	const char *auth = NULL;
	size_t auth_len = 0, i;

	if (!http_header(connection, MHD_HTTP_HEADER_AUTHORIZATION, &auth, &auth_len) || auth == NULL ||
		auth_len <= scheme_len || strncasecmp(auth, scheme, scheme_len) != 0 ||
		auth[scheme_len] != ' ')
		return false;
	for (i = scheme_len; i < auth_len && auth[i] == ' '; i++)
		;
	if (i == auth_len)
		return false;
	*token = auth + i;
	*len = auth_len - i;
	return true;
}

enum MHD_Result
http_queue_closing(struct MHD_Connection *connection, unsigned int status,
				   struct MHD_Response *resp)
{
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
	return MHD_queue_response(connection, status, resp);
}
