/*
 * console_signin.h: signing in to the console with a Postgres role and its password, and
 * the limit on failed attempts.
 *
 * Sign-in opens a libpq connection as that role to the console's database (--db: host,
 * port, dbname and TLS settings; its user and any password there are replaced), with no
 * password file, and keeps it only when the server asked for the password: a role the
 * server lets in without one (trust, peer, a client certificate) is refused, so nobody
 * signs in as a role without knowing its password. The password is wiped once the
 * connection is open or refused; only the connection is kept (console_session.h).
 *
 * Failed attempts are counted per client address and per role name: the
 * CONSOLE_SIGNIN_FAILURES-th failure within a minute blocks further attempts from that
 * address, or for that role, until the minute is over (429 with Retry-After).
 */
#ifndef WAL_CONSOLE_SIGNIN_H
#define WAL_CONSOLE_SIGNIN_H

#include <stddef.h>

#include "console/console_session.h"

#define CONSOLE_SIGNIN_FAILURES 5
#define CONSOLE_SIGNIN_WINDOW_S 60

typedef struct
{
	int status;               /* 200, 400, 401, 429 or 503 */
	int retry_after_s;        /* with 429 */
	console_session *session; /* with 200: held once, release it */
	char message[256];
} console_signin_result;

void console_signin_init(const char *conninfo);

/* password is wiped (it is the caller's buffer) whatever the outcome. */
void console_signin(const char *client, const char *user, char *password,
					console_signin_result *out);

#endif
