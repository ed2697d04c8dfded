/*
 * console_http.h: the console's HTTP server (libmicrohttpd): the page, the JSON API, and
 * the rules every request passes before a handler sees it.
 *
 *   every answer   Content-Security-Policy (CONSOLE_CSP: no inline script or style,
 *                  nothing from another origin, no framing), X-Content-Type-Options
 *                  nosniff, Referrer-Policy no-referrer; the API's also Cache-Control
 *                  no-store
 *   framing        as the ingest service and admin ports (http_framing.h): ambiguous
 *                  framing is 400 with the connection closed; paths are compared as sent
 *   /api/...       a live session's cookie, or 401 (but POST /api/session: sign-in)
 *   POST           X-CSRF-Token equal to the session's csrf token, an Origin (when sent)
 *                  equal to this Host, and no Sec-Fetch-Site: cross-site; else 403.
 *                  Sign-in needs Content-Type application/json (which a form on another
 *                  site cannot send without the preflight this server never answers) and
 *                  the same Origin rule.
 *   bodies         at most CONSOLE_BODY_MAX bytes (413)
 *
 *   POST /api/session   {"user", "password"}: sign in; sets the cookie
 *   GET  /api/session   {"user", "csrf", "roles", "idle_timeout_s", "expires_in_s"}
 *   POST /api/signout   ends the session, clears the cookie
 *   GET  /, /app.js, /app.css   the page;  GET /healthz   "ok"
 */
#ifndef WAL_CONSOLE_HTTP_H
#define WAL_CONSOLE_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#define CONSOLE_CSP                                                                                \
	"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "              \
	"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
#define CONSOLE_COOKIE   "wal_console"
#define CONSOLE_BODY_MAX 65536

typedef struct console_http console_http;

typedef struct
{
	const char *listen; /* ADDR:PORT */
	bool secure_cookie; /* --behind-tls: the cookie says Secure */
	int idle_s, max_age_s;
} console_http_settings;

console_http *console_http_start(const console_http_settings *settings, char *errbuf,
								 size_t errbuf_size);
int console_http_port(const console_http *http);
void console_http_stop(console_http *http);

#endif
