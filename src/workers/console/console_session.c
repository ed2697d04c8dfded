/*
 * console_session.c: see console_session.h.
 */
#include "console/console_session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/metrics.h"

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static console_session **table; /* max_sessions slots, NULL when free */
static console_session_limits lim;
static metric *live_gauge, *ended_counter;

void
console_sessions_init(const console_session_limits *limits)
{
	static const char *const reason[] = {"reason"};

	lim = *limits;
	table = calloc((size_t) lim.max_sessions, sizeof(*table));
	if (table == NULL)
		fatal("event=out_of_memory what=session_table");
	live_gauge = metric_gauge("wal_console_sessions", "Console sessions signed in now", 0, NULL);
	ended_counter =
		metric_counter("wal_console_sessions_ended_total",
					   "Console sessions ended, by why (signout, idle, max_age, stop)", 1, reason);
}

bool
console_random_hex(char *out)
{
	unsigned char bytes[CONSOLE_TOKEN_HEX / 2];
	size_t got = 0;

	while (got < sizeof(bytes))
	{
		ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);

		if (n <= 0)
			return false;
		got += (size_t) n;
	}
	for (size_t i = 0; i < sizeof(bytes); i++)
		snprintf(out + 2 * i, 3, "%02x", bytes[i]);
	return true;
}

bool
console_token_equal(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	unsigned char diff = la != lb;

	/* Every byte of the expected token is compared, whatever the first difference. */
	for (size_t i = 0; i < lb; i++)
		diff |= (unsigned char) (b[i] ^ (i < la ? a[i] : 0));
	return diff == 0;
}

static int
count_live(void)
{
	int n = 0;

	for (int i = 0; i < lim.max_sessions; i++)
		if (table[i] && !table[i]->ended)
			n++;
	return n;
}

/* Called with table_lock held; frees the slot's session when nobody holds it. */
static void
free_if_unheld(int slot)
{
	console_session *s = table[slot];

	if (s == NULL || !s->ended || s->holders > 0)
		return;
	PQfinish(s->conn);
	pthread_mutex_destroy(&s->conn_lock);
	explicit_bzero(s, sizeof(*s));
	free(s);
	table[slot] = NULL;
}

static void
end_locked(console_session *s, const char *why)
{
	const char *labels[] = {why};

	if (s->ended)
		return;
	s->ended = true;
	metric_add(ended_counter, 1, labels);
	log_info("event=session_ended user=%s reason=%s", s->user, why);
	for (int i = 0; i < lim.max_sessions; i++)
		if (table[i] == s)
			free_if_unheld(i);
	metric_set(live_gauge, count_live(), NULL);
}

console_session *
console_session_create(PGconn *conn, const char *user)
{
	console_session *s = calloc(1, sizeof(*s));
	int slot = -1;

	if (s == NULL || !console_random_hex(s->token) || !console_random_hex(s->csrf))
	{
		free(s);
		PQfinish(conn);
		return NULL;
	}
	snprintf(s->user, sizeof(s->user), "%s", user);
	s->conn = conn;
	pthread_mutex_init(&s->conn_lock, NULL);
	s->started_ms = s->last_ms = now_ms();
	s->holders = 1;
	pthread_mutex_lock(&table_lock);
	for (int i = 0; i < lim.max_sessions && slot < 0; i++)
	{
		free_if_unheld(i);
		if (table[i] == NULL)
			slot = i;
	}
	if (slot >= 0)
		table[slot] = s;
	metric_set(live_gauge, count_live(), NULL);
	pthread_mutex_unlock(&table_lock);
	if (slot < 0)
	{
		PQfinish(conn);
		pthread_mutex_destroy(&s->conn_lock);
		explicit_bzero(s, sizeof(*s));
		free(s);
		return NULL;
	}
	return s;
}

/* Why s is over a limit at now, or NULL. */
static const char *
expired(const console_session *s, int64_t now)
{
	if (now - s->last_ms > (int64_t) lim.idle_s * 1000)
		return "idle";
	if (now - s->started_ms > (int64_t) lim.max_age_s * 1000)
		return "max_age";
	return NULL;
}

console_session *
console_session_acquire(const char *token)
{
	console_session *found = NULL;
	int64_t now = now_ms();

	if (token == NULL || strlen(token) != CONSOLE_TOKEN_HEX)
		return NULL;
	pthread_mutex_lock(&table_lock);
	for (int i = 0; i < lim.max_sessions; i++)
	{
		console_session *s = table[i];
		const char *why;

		if (s == NULL || s->ended || !console_token_equal(token, s->token))
			continue;
		if ((why = expired(s, now)) != NULL)
		{
			end_locked(s, why);
			break;
		}
		s->holders++;
		s->last_ms = now;
		found = s;
		break;
	}
	pthread_mutex_unlock(&table_lock);
	return found;
}

void
console_session_release(console_session *s)
{
	if (s == NULL)
		return;
	pthread_mutex_lock(&table_lock);
	s->holders--;
	for (int i = 0; i < lim.max_sessions; i++)
		if (table[i] == s)
			free_if_unheld(i);
	pthread_mutex_unlock(&table_lock);
}

void
console_session_end(console_session *s)
{
	pthread_mutex_lock(&table_lock);
	end_locked(s, "signout");
	pthread_mutex_unlock(&table_lock);
}

void
console_sessions_expire(void)
{
	int64_t now = now_ms();

	pthread_mutex_lock(&table_lock);
	for (int i = 0; i < lim.max_sessions; i++)
	{
		const char *why;

		if (table[i] && !table[i]->ended && (why = expired(table[i], now)) != NULL)
			end_locked(table[i], why);
		else
			free_if_unheld(i);
	}
	pthread_mutex_unlock(&table_lock);
}

void
console_sessions_end_all(void)
{
	pthread_mutex_lock(&table_lock);
	for (int i = 0; i < lim.max_sessions; i++)
		if (table[i])
			end_locked(table[i], "stop");
	pthread_mutex_unlock(&table_lock);
}

int
console_sessions_live(void)
{
	int n;

	pthread_mutex_lock(&table_lock);
	n = count_live();
	pthread_mutex_unlock(&table_lock);
	return n;
}
