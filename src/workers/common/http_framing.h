/*
 * http_framing.h: what the workers' HTTP servers (the ingest service, the admin server)
 * refuse before they act on a request, so that a proxy in front of them and they can
 * never read one byte stream as different requests (request smuggling).
 *
 * libmicrohttpd's own parser does most of it at HTTP_CLIENT_DISCIPLINE (it answers 400
 * itself and closes the connection); http_framing_problem covers what it lets through.
 * The servers answer a problem with 400 and "Connection: close" from the request
 * handler's first call, before the body is read, which makes libmicrohttpd close the
 * connection after the answer: a request pipelined behind it is never read.
 */
#ifndef WAL_HTTP_FRAMING_H
#define WAL_HTTP_FRAMING_H

#include <stdbool.h>
#include <stddef.h>

#include <microhttpd.h>

#if MHD_VERSION < 0x01000000
#error                                                                                             \
	"wal-worker needs libmicrohttpd 1.0 or later (run tests/setup: it builds one into .cache/libmicrohttpd)"
#endif

/*
 * MHD_OPTION_CLIENT_DISCIPLINE_LVL for every server. In libmicrohttpd 1.0.1, level 1
 * answers 400 to folded header lines (obs-fold), to Transfer-Encoding together with
 * Content-Length, to bare CR or LF, to whitespace in a header name or before its colon,
 * and to whitespace in the request target; any level from 0 up refuses a NUL in a header
 * and a Transfer-Encoding other than "chunked". Level 2 adds only two things: no empty
 * line is skipped before the request line, and a partly malformed Cookie header is
 * ignored whole. curl, Python's http.client and requests, and HAProxy never send either,
 * so level 2 costs them nothing. Level 3 refuses nothing more: it only starts accepting
 * whitespace between a chunk's size and its extension, a laxer chunk parser. So 2 is the
 * strictest level for these clients.
 */
#define HTTP_CLIENT_DISCIPLINE 2

/*
 * The MHD_OPTION_UNESCAPE_CALLBACK of every server: leaves the request target (and the
 * query arguments) as sent, with their percent escapes, so a handler sees the path with
 * its real length and decodes it itself.
 */
size_t http_keep_escaped(void *cls, struct MHD_Connection *connection, char *s);

/*
 * Called with the request's headers in: false, with why (plain ASCII) filled, when the
 * request is framed in a way two parsers could read two ways: two Content-Length
 * headers (even equal ones), two Transfer-Encoding headers, Transfer-Encoding with
 * Content-Length, a Transfer-Encoding other than "chunked", two Host headers, or a NUL
 * byte in a header. singletons: other header names (NULL-terminated list, or NULL) the
 * caller reads one value of, which may appear once only.
 */
bool http_framing_ok(struct MHD_Connection *connection, const char *const *singletons, char *why,
					 size_t why_size);

/*
 * s (len bytes) as plain ASCII, for messages and logs: printable ASCII as it is, every
 * other byte as %XX, cut at out_size - 1 bytes with "..." when longer.
 */
void http_escape(const char *s, size_t len, char *out, size_t out_size);

/* A header's value and its length, or false when there is none. */
bool http_header(struct MHD_Connection *connection, const char *name, const char **value,
				 size_t *len);

/*
 * The token of the request's "Authorization: Bearer <token>" header and its length: the
 * scheme in any letter case, one space or more before the token (RFC 9110, 11.1 and
 * 11.4). False when there is no such header or no token after the scheme.
 */
bool http_bearer_token(struct MHD_Connection *connection, const char **token, size_t *len);

/* Queues resp for status with "Connection: close" (the connection ends after it). */
enum MHD_Result http_queue_closing(struct MHD_Connection *connection, unsigned int status,
								   struct MHD_Response *resp);

#endif
