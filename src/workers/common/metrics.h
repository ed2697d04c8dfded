/*
 * metrics.h: the worker's Prometheus metrics, one registry per process, rendered in the
 * text exposition format (version 0.0.4) for the admin server's GET /metrics.
 *
 * A metric is a counter (only goes up), a gauge (set to any value) or a histogram (counts
 * observations into buckets), with a name, a help
 * text and a fixed list of label names. A series is one set of label values of a metric
 * and holds one number; a series appears the first time it is added to or set, except
 * that a metric without labels has its one series from the start (at 0), so dashboards
 * see it before the first event.
 *
 * Register at start-up and keep the pointer: metric_counter/metric_gauge look the name up
 * under the registry lock. Registering a name again with the same kind and label names
 * returns the same metric; with a different kind or labels it is a bug and fatal().
 * Metrics live until the process exits.
 *
 * Every function is thread-safe (one mutex for the registry); label value arrays are
 * copied, so the caller's strings need only live for the call. A NULL label value is
 * the empty string.
 */
#ifndef WAL_METRICS_H
#define WAL_METRICS_H

#define METRIC_MAX_LABELS 8

typedef struct metric metric;

/*
 * name must match [a-zA-Z_:][a-zA-Z0-9_:]* and each label name [a-zA-Z_][a-zA-Z0-9_]*
 * (not starting with "__"); anything else is fatal(). Counter names should end in
 * _total, as Prometheus expects.
 */
metric *metric_counter(const char *name, const char *help, int n_labels,
					   const char *const *label_names);
metric *metric_gauge(const char *name, const char *help, int n_labels,
					 const char *const *label_names);

/*
 * label_values has one entry per label name, in the order registered (NULL when the
 * metric has no labels). A counter ignores a negative or NaN delta, so it never goes
 * down; metric_set on a counter is a bug and fatal().
 */
void metric_add(metric *m, double delta, const char *const *label_values);
void metric_set(metric *m, double value, const char *const *label_values);

/*
 * A histogram: bounds are its n_buckets upper bounds, ascending (+Inf is added). Rendered
 * as name_bucket{...,le="..."} (cumulative), name_sum and name_count.
 */
metric *metric_histogram(const char *name, const char *help, int n_buckets, const double *bounds,
						 int n_labels, const char *const *label_names);
void metric_observe(metric *m, double value, const char *const *label_values);

/* Every metric in registration order, its series in creation order; malloc'd, caller frees. */
char *metrics_render(void);

#endif
