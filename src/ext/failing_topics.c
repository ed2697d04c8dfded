/*
 * failing_topics.c: the topics whose records Kafka did not take, remembered by each relay.
 *
 * The claim passes over a failing topic's rows until its retry time, the delay doubling up
 * to wal_delivery.relay_max_backoff while it keeps failing, so a failing topic neither
 * holds up the others nor has its rows rewritten on every try. The table is the relay's
 * own memory, bounded: a topic it cannot remember is simply claimed again each pass.
 */
#include "postgres.h"

#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "failing_topics.h"
#include "worker_spi.h"
#include "settings.h"

typedef struct FailingTopic
{
	char name[256];
	int delay_ms;
	TimestampTz retry_at;
	uint64 failed_in_pass;
	uint64 first_failed_in_pass; /* the pass that started its failing streak */
} FailingTopic;

#define MAX_FAILING_TOPICS 256
static FailingTopic failing_topics[MAX_FAILING_TOPICS];
static int n_failing_topics = 0;
static uint64 pass_number = 0;

void
failing_topics_new_pass(void)
{
	pass_number++;
}

static FailingTopic *
find_failing_topic(const char *name)
{
	for (int i = 0; i < n_failing_topics; i++)
		if (strcmp(failing_topics[i].name, name) == 0)
			return &failing_topics[i];
	return NULL;
}

/* Passes over the topic a while, longer after each pass in which it failed again. */
void
topic_failed(const char *name)
{
	FailingTopic *t = find_failing_topic(name);

	if (t == NULL)
	{
		if (n_failing_topics == MAX_FAILING_TOPICS || strlen(name) >= sizeof(t->name))
			return; /* not remembered: its rows are simply claimed again */
		t = &failing_topics[n_failing_topics++];
		strlcpy(t->name, name, sizeof(t->name));
		t->delay_ms = 0;
		t->failed_in_pass = 0;
		t->first_failed_in_pass = pass_number;
	}
	if (t->failed_in_pass == pass_number)
		return;
	t->failed_in_pass = pass_number;
	t->delay_ms = t->delay_ms ? Min(t->delay_ms * 2, relay_max_backoff_ms) : 1000;
	t->retry_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), t->delay_ms);
}

/* It is no longer failing, unless another of its records failed in this pass. */
void
topic_shipped(const char *name)
{
	FailingTopic *t = find_failing_topic(name);

	if (t != NULL && t->failed_in_pass != pass_number)
		*t = failing_topics[--n_failing_topics];
}

bool
topic_failing_streak_starts(const char *name)
{
	FailingTopic *t = find_failing_topic(name);

	return t == NULL || t->first_failed_in_pass == pass_number;
}

Datum
topics_to_pass_over(bool *isnull)
{
	Datum *names = palloc(sizeof(Datum) * Max(n_failing_topics, 1));
	TimestampTz now = GetCurrentTimestamp();
	int n = 0;

	for (int i = 0; i < n_failing_topics; i++)
		if (failing_topics[i].retry_at > now)
			names[n++] = CStringGetTextDatum(failing_topics[i].name);
	*isnull = n == 0;
	return n == 0 ? (Datum) 0 : text_array(names, n);
}

bool
any_failing_topics(void)
{
	return n_failing_topics > 0;
}

int
ms_until_next_topic_retry(void)
{
	TimestampTz now = GetCurrentTimestamp();
	int best = -1;

	for (int i = 0; i < n_failing_topics; i++)
	{
		long secs;
		int usecs;
		int ms;

		TimestampDifference(now, failing_topics[i].retry_at, &secs, &usecs);
		ms = (int) Min(secs * 1000 + usecs / 1000 + 1, INT_MAX);
		if (best < 0 || ms < best)
			best = ms;
	}
	return best;
}
