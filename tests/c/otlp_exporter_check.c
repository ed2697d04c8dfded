/*
 * otlp_exporter_check.c: a test driver for common/otlp_exporter
 * (tests/integration/test_otlp_export.py).
 *
 *   otlp_exporter_check ENDPOINT N_SPANS LINGER_MS
 *
 * Starts the exporter at ENDPOINT, records N_SPANS delivery attempts' spans as consume and
 * retry do (attempt_span_record; trace 4bf92f3577b34da6a3ce929d0e0e4736, span ids 1, 2,
 * ... in hex, every third attempt failed with a 503, every seventh of a trace that is not
 * sampled), waits LINGER_MS, stops the exporter,
 * and prints one JSON line: the slowest and the total time attempt_span_record took, how
 * long the stop took, the process's CPU time (every thread: recording, encoding and
 * sending), and the /metrics text.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <jansson.h>

#include "common/attempt_span.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "common/otlp_exporter.h"

/* The answer of attempt i: every third one failed with a peer's awkward text. */
static void
attempt_result(http_result *r, int i)
{
	memset(r, 0, sizeof(*r));
	r->elapsed_ms = 2;
	if (i % 3 == 2)
	{
		r->http_status = 503;
		/* A quote, a newline and a byte that is not UTF-8. */
		r->error = "503 \"busy\"\nretry \xff later";
	}
	else
	{
		r->http_status = 200;
		r->error = "";
	}
}

int
main(int argc, char **argv)
{
	int n;
	int linger_ms;
	double slowest = 0, total = 0, stop_started;
	char *metrics_text;
	json_t *out;
	char *line;
	struct rusage usage;
	trace_context record;
	trace_context unsampled;
	const char *tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

	if (argc != 4)
	{
		fprintf(stderr, "usage: otlp_exporter_check ENDPOINT N_SPANS LINGER_MS\n");
		return 2;
	}
	n = atoi(argv[2]);
	linger_ms = atoi(argv[3]);
	if (!otlp_exporter_start(argv[1], "consume"))
		return 1;
	trace_context_parse(tp, strlen(tp), &record);
	unsampled = record;
	unsampled.flags = 0;
	for (int i = 0; i < n; i++)
	{
		http_result result;
		trace_context attempt = record;
		attempt_span a = {&record, &attempt, "orders", "billing", "k-\"quoted\"-\xc3\xa9", i % 5 + 1,
						  i % 4};
		double started, took;

		snprintf(attempt.span_id, sizeof(attempt.span_id), "%016x", i + 1);
		if (i % 7 == 6)
			a.record = &unsampled; /* no span: only sampled traces are exported */
		attempt_result(&result, i);
		started = now_seconds();
		attempt_span_record(&a, &result, i % 3 == 2 ? DELIVERY_TRANSIENT : DELIVERY_SUCCESS);
		took = now_seconds() - started;
		total += took;
		if (took > slowest)
			slowest = took;
	}
	nanosleep(&(struct timespec){linger_ms / 1000, (linger_ms % 1000) * 1000000L}, NULL);
	stop_started = now_seconds();
	otlp_exporter_stop();
	metrics_text = metrics_render();
	getrusage(RUSAGE_SELF, &usage);
	out = json_pack("{s:f, s:f, s:f, s:f, s:s}", "record_max_s", slowest, "record_total_s", total,
					"stop_s", now_seconds() - stop_started, "cpu_s",
					usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6 + usage.ru_stime.tv_sec +
						usage.ru_stime.tv_usec / 1e6,
					"metrics", metrics_text);
	line = json_dumps(out, JSON_COMPACT);
	printf("%s\n", line);
	free(line);
	free(metrics_text);
	json_decref(out);
	return 0;
}
