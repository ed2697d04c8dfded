/*
 * otlp_exporter_check.c: a test driver for common/otlp_exporter
 * (tests/integration/test_otlp_export.py).
 *
 *   otlp_exporter_check ENDPOINT N_SPANS LINGER_MS
 *
 * Starts the exporter at ENDPOINT, records N_SPANS delivery-attempt spans as a call site
 * would (trace 4bf92f3577b34da6a3ce929d0e0e4736, span ids 1, 2, ... in hex, every third one
 * failed), waits LINGER_MS, stops the exporter, and prints one JSON line: the slowest and
 * the total time otlp_span_record took, how long the stop took, the process's CPU time
 * (every thread: recording, encoding and sending), and the /metrics text.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <jansson.h>

#include "common/clock.h"
#include "common/metrics.h"
#include "common/otlp_exporter.h"

static void
attempt_span(otlp_span *span, int i)
{
	trace_context parent;
	char span_id[SPAN_ID_HEX + 1];
	struct timespec now;
	const char *tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

	trace_context_parse(tp, strlen(tp), &parent);
	snprintf(span_id, sizeof(span_id), "%016x", i + 1);
	otlp_span_start(span, &parent, span_id, "wal_delivery deliver", OTLP_KIND_CLIENT);
	clock_gettime(CLOCK_REALTIME, &now);
	span->end_unix_nano = (uint64_t) now.tv_sec * 1000000000u + (uint64_t) now.tv_nsec;
	span->start_unix_nano = span->end_unix_nano - 1500000; /* 1.5 ms */
	otlp_span_add_string(span, "wal.topic", "orders");
	otlp_span_add_string(span, "wal.destination", "billing");
	otlp_span_add_int(span, "wal.attempt", i % 5 + 1);
	otlp_span_add_int(span, "wal.retry_step", i % 4);
	otlp_span_add_string(span, "wal.idempotency_key", "k-\"quoted\"-\xc3\xa9");
	if (i % 3 == 2)
	{
		otlp_span_add_int(span, "http.response.status_code", 503);
		/* A peer's text: a quote, a newline and a byte that is not UTF-8. */
		otlp_span_set_status(span, OTLP_STATUS_ERROR, "503 \"busy\"\nretry \xff later");
	}
	else
	{
		otlp_span_add_int(span, "http.response.status_code", 200);
		otlp_span_set_status(span, OTLP_STATUS_OK, NULL);
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

	if (argc != 4)
	{
		fprintf(stderr, "usage: otlp_exporter_check ENDPOINT N_SPANS LINGER_MS\n");
		return 2;
	}
	n = atoi(argv[2]);
	linger_ms = atoi(argv[3]);
	if (!otlp_exporter_start(argv[1], "consume"))
		return 1;
	for (int i = 0; i < n; i++)
	{
		otlp_span span;
		double started, took;

		attempt_span(&span, i);
		started = now_seconds();
		otlp_span_record(&span);
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
