/*
 * console_request.h: one console request and its answer, as the handlers see them
 * (console_http.c turns them into libmicrohttpd calls and adds the headers every answer
 * carries).
 *
 * Words used below:
 *   path    the request target's path as sent (percent escapes kept)
 *   query   the request target's query arguments, read with console_query_arg (decoded)
 */
#ifndef WAL_CONSOLE_REQUEST_H
#define WAL_CONSOLE_REQUEST_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include <microhttpd.h>

#include "console/console_session.h"

typedef struct
{
	struct MHD_Connection *connection;
	const char *method;
	const char *path;
	char client[64];  /* the peer's address */
	const char *body; /* POST bodies: NUL-terminated, body_len bytes */
	size_t body_len;
	console_session *session; /* the cookie's live session, held; or NULL */
} console_request;

typedef struct
{
	unsigned int status;
	const char *content_type;
	char *body; /* malloc'd */
	size_t body_len;
	char set_cookie[256];
	char disposition[128]; /* Content-Disposition, for downloads */
	int retry_after_s;
	bool asset; /* a static file of the page, not the API */
} console_answer;

/* An answer of json (stolen) with status. */
void console_answer_json(console_answer *a, unsigned int status, json_t *json);

/* An answer of JSON text already made (copied). */
void console_answer_json_text(console_answer *a, unsigned int status, const char *text);

/* {"error": message} with status. */
void console_answer_error(console_answer *a, unsigned int status, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/*
 * The query argument name, percent-decoded into out: 1 when present, 0 when absent or
 * empty, -1 when it cannot be decoded (a malformed escape, %00, not UTF-8) or is longer
 * than out: the answer is then a 400.
 */
int console_query_arg(const console_request *r, const char *name, char *out, size_t out_size);

/* The request's body as a JSON object, or NULL with a 400 answered. */
json_t *console_body_object(const console_request *r, console_answer *a);

#endif
