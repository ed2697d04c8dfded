/*
 * metrics.c: the process-wide registry of Prometheus counters and gauges and its text
 * rendering (see metrics.h).
 *
 * Linear lists under one mutex: a worker has tens of series and is scraped every few
 * seconds, so lookups by strcmp cost less than any index would save.
 */
#include "metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "text_buffer.h"

typedef enum
{
	METRIC_COUNTER,
	METRIC_GAUGE,
	METRIC_HISTOGRAM
} metric_kind;

static const char *const kind_names[] = {"counter", "gauge", "histogram"};

typedef struct metric_series
{
	struct metric_series *next;
	char **label_values; /* n_labels strings */
	double value;        /* a histogram's sum */
	double *buckets;     /* a histogram's counts per bucket, +Inf last (not cumulative) */
	double count;        /* a histogram's observations */
} metric_series;

struct metric
{
	struct metric *next;
	metric_kind kind;
	char *name;
	char *help;
	int n_labels;
	char **label_names;
	int n_buckets; /* a histogram's upper bounds, ascending, +Inf not included */
	double *bounds;
	metric_series *series_head;
	metric_series *series_tail;
};

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static metric *registry_head;
static metric *registry_tail;

static void *
checked_malloc(size_t size)
{
	void *p = malloc(size);

	if (p == NULL)
		fatal("event=out_of_memory what=metrics bytes=%zu", size);
	return p;
}

static char *
checked_strdup(const char *s)
{
	size_t len = strlen(s) + 1;

	return memcpy(checked_malloc(len), s, len);
}

static bool
is_valid_name(const char *name, bool colon_allowed)
{
	if (name == NULL || name[0] == '\0' || (name[0] >= '0' && name[0] <= '9'))
		return false;
	for (const char *c = name; *c; c++)
		if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
			  *c == '_' || (colon_allowed && *c == ':')))
			return false;
	return true;
}

static bool
same_label_names(const metric *m, int n_labels, const char *const *label_names)
{
	if (m->n_labels != n_labels)
		return false;
	for (int i = 0; i < n_labels; i++)
		if (strcmp(m->label_names[i], label_names[i]) != 0)
			return false;
	return true;
}

/* Called with registry_lock held. */
static metric_series *
find_or_add_series(metric *m, const char *const *label_values)
{
	metric_series *s;

	for (s = m->series_head; s != NULL; s = s->next)
	{
		int i;

		for (i = 0; i < m->n_labels; i++)
			if (strcmp(s->label_values[i], label_values[i] ? label_values[i] : "") != 0)
				break;
		if (i == m->n_labels)
			return s;
	}

	s = checked_malloc(sizeof(*s));
	s->next = NULL;
	s->value = 0;
	s->count = 0;
	s->buckets = NULL;
	if (m->kind == METRIC_HISTOGRAM)
	{
		s->buckets = checked_malloc(sizeof(double) * (m->n_buckets + 1));
		memset(s->buckets, 0, sizeof(double) * (m->n_buckets + 1));
	}
	s->label_values = checked_malloc(sizeof(char *) * (m->n_labels > 0 ? m->n_labels : 1));
	for (int i = 0; i < m->n_labels; i++)
		s->label_values[i] = checked_strdup(label_values[i] ? label_values[i] : "");
	if (m->series_tail)
		m->series_tail->next = s;
	else
		m->series_head = s;
	m->series_tail = s;
	return s;
}

static metric *
metric_register(metric_kind kind, const char *name, const char *help, int n_labels,
				const char *const *label_names, int n_buckets, const double *bounds)
{
	metric *m;

	/* Bad names are programming errors: fail at start-up, not at the first scrape. */
	if (!is_valid_name(name, true))
		fatal("event=bad_metric_name metric=\"%s\"", name ? name : "(null)");
	if (n_labels < 0 || n_labels > METRIC_MAX_LABELS || (n_labels > 0 && label_names == NULL))
		fatal("event=bad_metric_labels metric=%s n_labels=%d", name, n_labels);
	for (int i = 0; i < n_labels; i++)
		if (!is_valid_name(label_names[i], false) || strncmp(label_names[i], "__", 2) == 0)
			fatal("event=bad_metric_label_name metric=%s label=\"%s\"", name,
				  label_names[i] ? label_names[i] : "(null)");

	pthread_mutex_lock(&registry_lock);
	for (m = registry_head; m != NULL; m = m->next)
		if (strcmp(m->name, name) == 0)
			break;
	if (m != NULL)
	{
		bool same = m->kind == kind && same_label_names(m, n_labels, label_names);

		pthread_mutex_unlock(&registry_lock);
		if (!same)
			fatal("event=metric_redefined metric=%s msg=\"registered again with another kind or "
				  "other labels\"",
				  name);
		return m;
	}

	m = checked_malloc(sizeof(*m));
	m->next = NULL;
	m->kind = kind;
	m->name = checked_strdup(name);
	m->help = checked_strdup(help ? help : "");
	m->n_labels = n_labels;
	m->label_names = checked_malloc(sizeof(char *) * (n_labels > 0 ? n_labels : 1));
	for (int i = 0; i < n_labels; i++)
		m->label_names[i] = checked_strdup(label_names[i]);
	m->n_buckets = n_buckets;
	m->bounds = NULL;
	if (n_buckets > 0)
	{
		m->bounds = checked_malloc(sizeof(double) * n_buckets);
		memcpy(m->bounds, bounds, sizeof(double) * n_buckets);
	}
	m->series_head = m->series_tail = NULL;
	if (n_labels == 0)
		find_or_add_series(m, NULL);

	if (registry_tail)
		registry_tail->next = m;
	else
		registry_head = m;
	registry_tail = m;
	pthread_mutex_unlock(&registry_lock);
	return m;
}

metric *
metric_counter(const char *name, const char *help, int n_labels, const char *const *label_names)
{
	return metric_register(METRIC_COUNTER, name, help, n_labels, label_names, 0, NULL);
}

metric *
metric_gauge(const char *name, const char *help, int n_labels, const char *const *label_names)
{
	return metric_register(METRIC_GAUGE, name, help, n_labels, label_names, 0, NULL);
}

metric *
metric_histogram(const char *name, const char *help, int n_buckets, const double *bounds,
				 int n_labels, const char *const *label_names)
{
	if (n_buckets < 1 || bounds == NULL)
		fatal("event=bad_metric_buckets metric=%s", name ? name : "(null)");
	for (int i = 1; i < n_buckets; i++)
		if (!(bounds[i] > bounds[i - 1]))
			fatal("event=bad_metric_buckets metric=%s msg=\"bounds must ascend\"", name);
	return metric_register(METRIC_HISTOGRAM, name, help, n_labels, label_names, n_buckets, bounds);
}

void
metric_observe(metric *m, double value, const char *const *label_values)
{
	metric_series *s;
	int i;

	if (m->kind != METRIC_HISTOGRAM)
		fatal("event=metric_observe_on_non_histogram metric=%s", m->name);
	if (isnan(value))
		return;
	pthread_mutex_lock(&registry_lock);
	s = find_or_add_series(m, label_values);
	for (i = 0; i < m->n_buckets && value > m->bounds[i]; i++)
		;
	s->buckets[i] += 1;
	s->count += 1;
	s->value += value;
	pthread_mutex_unlock(&registry_lock);
}

void
metric_add(metric *m, double delta, const char *const *label_values)
{
	/* A counter that went down would read as a process restart to rate(). */
	if (m->kind == METRIC_COUNTER && !(delta >= 0))
		return;
	if (m->kind == METRIC_HISTOGRAM)
		fatal("event=metric_add_on_histogram metric=%s", m->name);

	pthread_mutex_lock(&registry_lock);
	find_or_add_series(m, label_values)->value += delta;
	pthread_mutex_unlock(&registry_lock);
}

void
metric_set(metric *m, double value, const char *const *label_values)
{
	if (m->kind != METRIC_GAUGE)
		fatal("event=metric_set_on_non_gauge metric=%s", m->name);

	pthread_mutex_lock(&registry_lock);
	find_or_add_series(m, label_values)->value = value;
	pthread_mutex_unlock(&registry_lock);
}

/* ---------------------------------------------------------------- rendering */

/*
 * The exposition format escapes backslash and newline in HELP text, and also the double
 * quote in label values; everything else, UTF-8 included, goes through as is.
 */
static void
buffer_put_escaped(text_buffer *buf, const char *s, bool escape_quote)
{
	for (; *s; s++)
	{
		if (*s == '\\')
			text_buffer_append(buf, "\\\\", 2);
		else if (*s == '\n')
			text_buffer_append(buf, "\\n", 2);
		else if (*s == '"' && escape_quote)
			text_buffer_append(buf, "\\\"", 2);
		else
			text_buffer_append(buf, s, 1);
	}
}

static void
buffer_put_value(text_buffer *buf, double value)
{
	char number[32];

	if (isnan(value))
		text_buffer_puts(buf, "NaN");
	else if (isinf(value))
		text_buffer_puts(buf, value > 0 ? "+Inf" : "-Inf");
	else
	{
		/* %.17g round-trips every double and prints whole counts without a fraction. */
		snprintf(number, sizeof(number), "%.17g", value);
		text_buffer_puts(buf, number);
	}
}

/*
 * One line: name, suffix (a histogram's _bucket, _sum, _count), the series' labels and
 * le when given, the value.
 */
static void
put_sample(text_buffer *buf, const metric *m, const char *suffix, const metric_series *s,
		   const char *le, double value)
{
	bool any = false;

	text_buffer_puts(buf, m->name);
	text_buffer_puts(buf, suffix);
	for (int i = 0; i < m->n_labels; i++)
	{
		text_buffer_puts(buf, any ? "," : "{");
		any = true;
		text_buffer_puts(buf, m->label_names[i]);
		text_buffer_puts(buf, "=\"");
		buffer_put_escaped(buf, s->label_values[i], true);
		text_buffer_puts(buf, "\"");
	}
	if (le != NULL)
	{
		text_buffer_puts(buf, any ? ",le=\"" : "{le=\"");
		any = true;
		text_buffer_puts(buf, le);
		text_buffer_puts(buf, "\"");
	}
	if (any)
		text_buffer_puts(buf, "}");
	text_buffer_puts(buf, " ");
	buffer_put_value(buf, value);
	text_buffer_puts(buf, "\n");
}

/* Cumulative buckets up to +Inf, then _sum and _count, as Prometheus reads them. */
static void
put_histogram(text_buffer *buf, const metric *m, const metric_series *s)
{
	double cumulative = 0;
	char le[32];

	for (int i = 0; i <= m->n_buckets; i++)
	{
		cumulative += s->buckets[i];
		if (i < m->n_buckets)
			snprintf(le, sizeof(le), "%g", m->bounds[i]);
		else
			strcpy(le, "+Inf");
		put_sample(buf, m, "_bucket", s, le, cumulative);
	}
	put_sample(buf, m, "_sum", s, NULL, s->value);
	put_sample(buf, m, "_count", s, NULL, s->count);
}

char *
metrics_render(void)
{
	text_buffer buf = {NULL, 0, 0};

	text_buffer_reserve(&buf, 0);
	buf.data[0] = '\0';

	pthread_mutex_lock(&registry_lock);
	for (const metric *m = registry_head; m != NULL; m = m->next)
	{
		text_buffer_puts(&buf, "# HELP ");
		text_buffer_puts(&buf, m->name);
		text_buffer_puts(&buf, " ");
		buffer_put_escaped(&buf, m->help, false);
		text_buffer_puts(&buf, "\n# TYPE ");
		text_buffer_puts(&buf, m->name);
		text_buffer_puts(&buf, " ");
		text_buffer_puts(&buf, kind_names[m->kind]);
		text_buffer_puts(&buf, "\n");

		for (const metric_series *s = m->series_head; s != NULL; s = s->next)
		{
			if (m->kind == METRIC_HISTOGRAM)
				put_histogram(&buf, m, s);
			else
				put_sample(&buf, m, "", s, NULL, s->value);
		}
	}
	pthread_mutex_unlock(&registry_lock);
	return buf.data;
}
