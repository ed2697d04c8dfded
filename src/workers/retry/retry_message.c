/*
 * retry_message.c: see retry_message.h.
 */
#include "retry/retry_message.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

/* Retry-After may push a message back by at most this much (before the time scale). */
#define MAX_NOT_BEFORE_MS (60L * 60 * 1000)

/* A non-negative integer header value; false when missing or not a number. */
static bool
header_number(const rd_kafka_message_t *rkm, const char *name, int64_t *out)
{
	char *value = kafka_header_value(rkm, name);
	char *end;
	bool ok;

	if (value == NULL)
		return false;
	errno = 0;
	*out = strtoll(value, &end, 10);
	ok = errno == 0 && end != value && *end == '\0' && *out >= 0;
	free(value);
	return ok;
}

static void
set_bad(retry_message *m, const char *fmt, const char *what)
{
	char text[256];

	snprintf(text, sizeof(text), fmt, what);
	free(m->bad);
	m->bad = strdup(text);
}

void
retry_message_read(retry_message *m, const rd_kafka_message_t *rkm, int step,
				   const control_plane_config *config, double time_scale, int64_t now_wall_ms)
{
	const destination_config *d;
	int64_t entered, jitter = 0, not_before, attempt, partition, offset;

	memset(m, 0, sizeof(*m));
	/* The record's identity is where it first came from, not this retry topic. */
	handoff_message_from_kafka(&m->msg, rkm, true);
	if (header_number(rkm, "source-partition", &partition))
		m->msg.source_partition = (int32_t) partition;
	if (header_number(rkm, "source-offset", &offset))
		m->msg.source_offset = offset;
	m->step = step;
	m->attempt = header_number(rkm, "attempt", &attempt) && attempt < 1000000 ? (int) attempt : 1;
	m->destination = kafka_header_value(rkm, "destination");
	m->due_ms = m->earliest_ms = now_wall_ms;

	if (m->destination == NULL)
	{
		set_bad(m, "missing header %s", "destination");
		return;
	}
	d = config_find_destination(config, m->destination);
	if (d == NULL)
	{
		set_bad(m, "destination \"%s\" no longer exists", m->destination);
		return;
	}
	if (!header_number(rkm, "step-entered-at", &entered))
	{
		set_bad(m, "missing or garbled header %s", "step-entered-at");
		return;
	}
	/*
	 * Entered "in the future" by more than any wait: a clock jumped, or the header is not
	 * ours. Due now (not stranded), and no arithmetic on a number that could overflow.
	 */
	if (entered - now_wall_ms >
		(int64_t) ((d->retry_delays_ms[step - 1] * 2 + MAX_NOT_BEFORE_MS) / time_scale) + 60000)
	{
		m->clock_jump = true;
		return;
	}
	if (!header_number(rkm, "step-jitter-ms", &jitter) ||
		jitter > (int64_t) (d->retry_jitter * d->retry_delays_ms[step - 1]) + 1)
		jitter = 0; /* garbled, or larger than the destination allows: not ours to trust */
	m->earliest_ms = entered + (int64_t) (d->retry_delays_ms[step - 1] / time_scale);
	m->due_ms = entered + (int64_t) ((d->retry_delays_ms[step - 1] + jitter) / time_scale);
	if (header_number(rkm, "not-before", &not_before) && not_before > entered)
	{
		int64_t wait =
			not_before - entered < MAX_NOT_BEFORE_MS ? not_before - entered : MAX_NOT_BEFORE_MS;
		int64_t asked = entered + (int64_t) (wait / time_scale);

		if (asked > m->due_ms)
			m->due_ms = asked;
	}
	/* Entered "in the future" by more than any wait: a clock jumped; do not strand it. */
	if (m->due_ms - now_wall_ms >
		(int64_t) ((d->retry_delays_ms[step - 1] * 2 + MAX_NOT_BEFORE_MS) / time_scale) + 60000)
	{
		m->clock_jump = true;
		m->due_ms = m->earliest_ms = now_wall_ms;
	}
}

void
retry_message_clear(retry_message *m)
{
	handoff_message_clear(&m->msg);
	free(m->destination);
	free(m->bad);
	memset(m, 0, sizeof(*m));
}

int
retry_topic_step(const char *topic, const char *prefix)
{
	size_t n = strlen(prefix);

	if (strncmp(topic, prefix, n) != 0 || topic[n] < '1' || topic[n] > '3' || topic[n + 1] != '\0')
		return 0;
	return topic[n] - '0';
}
