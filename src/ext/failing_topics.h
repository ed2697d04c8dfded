/*
 * failing_topics.h: the topics whose records Kafka did not take (failing_topics.c).
 */
#ifndef FAILING_TOPICS_H
#define FAILING_TOPICS_H

#include "postgres.h"

/* Called at the start of each pass: a topic fails at most once per pass. */
void failing_topics_new_pass(void);

/* Kafka did not take a record of the topic / took one. */
void topic_failed(const char *name);
void topic_shipped(const char *name);

/*
 * Whether a record of the topic that Kafka did not take in this pass starts the topic's
 * failing streak (so its reason is worth writing down), rather than continuing one.
 */
bool topic_failing_streak_starts(const char *name);

/* The failing topics whose retry time has not come: a text[] for the claim, or NULL. */
Datum topics_to_pass_over(bool *isnull);

/* Whether any topic is failing now. */
bool any_failing_topics(void);

/* Milliseconds until a failing topic may be tried again; -1 when none waits. */
int ms_until_next_topic_retry(void);

#endif
