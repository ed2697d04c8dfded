/*
 * console_session.h: the console's sign-in sessions.
 *
 * A session is one person signed in with a Postgres role: it owns the libpq connection
 * opened as that role (every API query of the session runs on it, so Postgres decides
 * what the person may see and do) and two random tokens, 32 bytes from getrandom as hex:
 *   token  the session cookie's value (HttpOnly: the page's script never sees it)
 *   csrf   what the page sends back in X-CSRF-Token on every POST (GET /api/session)
 * A session ends at sign-out, after idle_s without a request, or max_age_s after sign-in,
 * whichever comes first; its connection is closed then. At most max_sessions live at
 * once (the oldest idle one does not make room: sign-in is refused with 503).
 *
 * Thread-safe: the HTTP server's threads share the table under one lock. A session in
 * use by a request is held (console_session_acquire .. _release) and freed only when the
 * last holder lets go; its connection is used by one request at a time (conn_lock).
 */
#ifndef WAL_CONSOLE_SESSION_H
#define WAL_CONSOLE_SESSION_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <libpq-fe.h>

#define CONSOLE_TOKEN_HEX 64 /* 32 random bytes as hex */

typedef struct console_session
{
	char token[CONSOLE_TOKEN_HEX + 1];
	char csrf[CONSOLE_TOKEN_HEX + 1];
	char user[64]; /* the Postgres role signed in as */
	PGconn *conn;  /* opened as user; closed when the session ends */
	pthread_mutex_t conn_lock;
	int64_t started_ms; /* sign-in */
	int64_t last_ms;    /* the last request */
	int holders;        /* requests using it now */
	bool ended;         /* signed out or expired: no new holder */
} console_session;

typedef struct
{
	int idle_s;
	int max_age_s;
	int max_sessions;
} console_session_limits;

void console_sessions_init(const console_session_limits *limits);

/*
 * A new session owning conn (which the table closes when it ends) for user, held once
 * by the caller; NULL when max_sessions are live (conn is then closed too) or the
 * random bytes cannot be had.
 */
console_session *console_session_create(PGconn *conn, const char *user);

/* The live session of token (held: release it), or NULL. Counts as activity. */
console_session *console_session_acquire(const char *token);
void console_session_release(console_session *s);

/* Sign-out: the session ends now; its connection closes once no request uses it. */
void console_session_end(console_session *s);

/* Ends sessions past their idle or absolute limit; the console's loop calls it. */
void console_sessions_expire(void);

/* Ends every session (at stop). */
void console_sessions_end_all(void);

int console_sessions_live(void);

/* 32 random bytes as 64 hex characters into out (65 bytes); false when getrandom fails. */
bool console_random_hex(char *out);

/* a and b as tokens, compared in constant time for their length. */
bool console_token_equal(const char *a, const char *b);

#endif
