/*
 * console_signin.c: see console_signin.h.
 */
#include "console/console_signin.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/db_connect.h"
#include "common/log.h"
#include "common/metrics.h"

#define LIMIT_SLOTS 512

/* Failures of one key (an address or a role name) in its current window. */
typedef struct
{
	char key[160];
	int64_t window_start_ms;
	int failures;
} failure_count;

static pthread_mutex_t limit_lock = PTHREAD_MUTEX_INITIALIZER;
static failure_count counts[LIMIT_SLOTS];
static const char *base_conninfo;
static metric *signins;

void
console_signin_init(const char *conninfo)
{
	static const char *const outcome[] = {"outcome"};

	base_conninfo = conninfo ? conninfo : "";
	signins = metric_counter("wal_console_signins_total",
							 "Console sign-in attempts, by outcome (ok, failed, limited, refused, "
							 "full)",
							 1, outcome);
}

static void
count_signin(const char *outcome)
{
	const char *labels[] = {outcome};

	metric_add(signins, 1, labels);
}

/* The slot of key, or the one to reuse for it (free, or the oldest window). Locked. */
static failure_count *
slot_for(const char *key, bool create)
{
	failure_count *oldest = &counts[0];

	for (int i = 0; i < LIMIT_SLOTS; i++)
	{
		if (strcmp(counts[i].key, key) == 0 && counts[i].key[0] != '\0')
			return &counts[i];
		if (counts[i].window_start_ms < oldest->window_start_ms)
			oldest = &counts[i];
	}
	if (!create)
		return NULL;
	snprintf(oldest->key, sizeof(oldest->key), "%s", key);
	oldest->window_start_ms = now_ms();
	oldest->failures = 0;
	return oldest;
}

/* Seconds until key may try again, or 0. Locked. */
static int
blocked_for(const char *key, int64_t now)
{
	failure_count *c = slot_for(key, false);
	int64_t window_end;

	if (c == NULL || c->failures < CONSOLE_SIGNIN_FAILURES)
		return 0;
	window_end = c->window_start_ms + CONSOLE_SIGNIN_WINDOW_S * 1000;
	return now >= window_end ? 0 : (int) ((window_end - now + 999) / 1000);
}

static void
count_failure(const char *key, int64_t now)
{
	failure_count *c = slot_for(key, true);

	if (now - c->window_start_ms >= CONSOLE_SIGNIN_WINDOW_S * 1000)
	{
		c->window_start_ms = now;
		c->failures = 0;
	}
	c->failures++;
}

static void
fail(console_signin_result *out, int status, const char *message)
{
	out->status = status;
	snprintf(out->message, sizeof(out->message), "%s", message);
}

void
console_signin(const char *client, const char *user, char *password, console_signin_result *out)
{
	char by_address[160], by_role[160];
	char *options;
	const char *keys[] = {"connect_timeout", "fallback_application_name",
						  "dbname",          "user",
						  "password",        "passfile",
						  "options",         NULL};
	const char *values[] = {"5",      "wal-worker console", base_conninfo, user,
							password, "/dev/null",          NULL,          NULL};
	int64_t now = now_ms();
	int wait_s;
	PGconn *conn;

	memset(out, 0, sizeof(*out));
	snprintf(by_address, sizeof(by_address), "address %s", client);
	snprintf(by_role, sizeof(by_role), "role %s", user);
	pthread_mutex_lock(&limit_lock);
	wait_s = blocked_for(by_address, now);
	if (wait_s == 0)
		wait_s = blocked_for(by_role, now);
	pthread_mutex_unlock(&limit_lock);
	if (wait_s > 0)
	{
		explicit_bzero(password, strlen(password));
		out->retry_after_s = wait_s;
		fail(out, 429,
			 "too many failed sign-ins from this address or for this role; try again later");
		count_signin("limited");
		log_warn("event=signin_limited user=%s client=%s retry_after_s=%d", user, client, wait_s);
		return;
	}

	options = db_pinned_options(base_conninfo);
	values[6] = options;
	conn = PQconnectdbParams(keys, values, 1);
	free(options);
	/* The password went into libpq's copy; the connection, not the password, is kept. */
	explicit_bzero(password, strlen(password));
	if (PQstatus(conn) != CONNECTION_OK || !PQconnectionUsedPassword(conn))
	{
		bool no_password_asked = PQstatus(conn) == CONNECTION_OK;
		const char *error =
			no_password_asked ? "the server did not ask for a password" : PQerrorMessage(conn);

		log_warn("event=signin_failed user=%s client=%s error=\"%.*s\"", user, client,
				 (int) strcspn(error, "\n"), error);
		PQfinish(conn);
		pthread_mutex_lock(&limit_lock);
		count_failure(by_address, now);
		count_failure(by_role, now);
		pthread_mutex_unlock(&limit_lock);
		if (no_password_asked)
		{
			fail(out, 401,
				 "the database let this role in without checking a password (trust, peer or a "
				 "certificate); the console signs in only roles whose password the server "
				 "checks");
			count_signin("refused");
		}
		else
		{
			fail(out, 401, "wrong role or password, or the database cannot be reached");
			count_signin("failed");
		}
		return;
	}
	/*
	 * A console query that runs away is cancelled, not left holding the session. No JIT:
	 * the overview's estimates (a day of dead letters) cross jit_above_cost, and
	 * compiling it took a second, five times the query itself, on every refresh.
	 */
	PQclear(PQexec(conn, "SET statement_timeout = '30s'; SET jit = off"));
	out->session = console_session_create(conn, user);
	if (out->session == NULL)
	{
		fail(out, 503, "too many people are signed in to this console; try again later");
		count_signin("full");
		return;
	}
	out->status = 200;
	count_signin("ok");
	log_info("event=signed_in user=%s client=%s", user, client);
}
