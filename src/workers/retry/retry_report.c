/*
 * retry_report.c: the counters of `wal-worker retry` per destination and step, sent to
 * wal_delivery.report_step_stats every second and shown as gauges (see retry_state.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <jansson.h>

#include "common/clock.h"
#include "retry/retry_state.h"

static char *
iso_time(char *buf, size_t size, int64_t ms)
{
	time_t secs = (time_t) (ms / 1000);
	struct tm tm;

	gmtime_r(&secs, &tm);
	snprintf(buf, size, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
			 tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int) (ms % 1000));
	return buf;
}

/* Per destination and step this process owns: counters into destination_step_stats. */
void
report_stats(retry_state *st)
{
	const control_plane_config *config = config_watch_current(st->watch);
	json_t *rows = json_array();
	step_stats **reported = calloc(st->n_lanes > 0 ? st->n_lanes : 1, sizeof(step_stats *));
	int n_reported = 0;
	char when[80];

	for (int i = 0; i < st->n_lanes; i++)
	{
		lane *l = st->lanes[i];
		const destination_config *d = partition_owner(config, l->partition);
		step_stats *ss;
		json_t *row;

		if (!l->assigned || d == NULL || l->step < 1)
			continue;
		l->backlog = partition_backlog_get(st->backlogs, l->topic, l->partition);
		ss = &dest_get(st, d->name)->steps[l->step - 1];
		row = json_pack("{s:s, s:i, s:i, s:I, s:I}", "destination", d->name, "step", l->step,
						"consecutive_failures", ss->consecutive_failures, "delivered",
						(json_int_t) ss->delivered, "failed", (json_int_t) ss->failed);
		if (l->backlog >= 0)
			json_object_set_new(row, "backlog", json_integer(l->backlog));
		if (ss->last_error_at)
		{
			json_object_set_new(row, "last_error", json_string(ss->last_error));
			json_object_set_new(row, "last_error_at",
								json_string(iso_time(when, sizeof(when), ss->last_error_at)));
		}
		if (ss->last_success_at)
			json_object_set_new(row, "last_success_at",
								json_string(iso_time(when, sizeof(when), ss->last_success_at)));
		json_array_append_new(rows, row);
		reported[n_reported++] = ss;
		metric_set(st->backlog_gauge, (double) l->backlog,
				   (const char *const[]){d->name, l->topic});
	}
	/* Deltas go out once: only what the database took is reset. */
	if (n_reported > 0 && pause_state_report_stats(st->pauses, rows))
		for (int i = 0; i < n_reported; i++)
		{
			reported[i]->delivered = reported[i]->failed = 0;
			reported[i]->last_error_at = reported[i]->last_success_at = 0;
		}
	free(reported);
	json_decref(rows);
}
