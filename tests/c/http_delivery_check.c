/*
 * http_delivery_check.c: a test driver for common/http_delivery and common/webhook.
 * tests/integration/test_worker_http_delivery.py builds it and runs it against
 * tests/destination.py; it prints one JSON line per event, so the test reads the
 * engine's results next to what the destination recorded.
 *
 *   http_delivery_check BASE_URL SCENARIO [OPTIONS]
 *
 * Scenarios:
 *   requests          --count requests to BASE_URL + --path, destination "dest"; all at
 *                     once, or each submitted from the previous one's callback with
 *                     --sequential. One "done" line each, then a "summary" line.
 *   two-destinations  --count requests to /slow (destination "slow") submitted first, then
 *                     --fast-count to /fast (destination "fast") at --fast-url (default:
 *                     BASE_URL), both limited to --max-in-flight.
 *   abort             --count requests, polls for --abort-after-ms, then frees the engine.
 *   sign              prints webhook_sign(--secret, --msg-id, --timestamp, --body).
 *   retry-after       prints parse_retry_after(--value, --now).
 *   classify          prints classify_http_result(--curl-code, --status, --transient).
 *
 * "max_in_flight_seen" is the most requests the engine had in flight per destination,
 * sampled after every submit and every poll.
 *
 * --hold-ms N: after every poll that completed a request, a "hold" line with the wall
 * clock (ms), then N ms without polling, as a consumer's loop spends a turn on other work:
 * what the engine started within that poll must already be on its way meanwhile.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/header_lines.h"
#include "common/http_delivery.h"
#include "common/webhook.h"

#define MAX_HEADERS      16
#define MAX_TRANSIENT    16
#define MAX_DESTINATIONS 2

typedef struct
{
	const char *base_url;
	const char *fast_url;
	const char *path;
	int count;
	int fast_count;
	int max_in_flight;
	int max_total;
	long timeout_ms;
	bool sequential;
	bool insecure;
	int abort_after_ms;
	int hold_ms;
	const char *method;
	const char *headers[MAX_HEADERS];
	int n_headers;
	const char *body;
	const char *secret;
	const char *msg_id;
	long timestamp;
	bool has_transient;
	char *transient_storage;
	const char *transient[MAX_TRANSIENT];
	int n_transient;
	const char *value;
	long now;
	int curl_code;
	long status;
} check_options;

typedef struct
{
	const char *name;
	int max_in_flight_seen;
} destination_seen;

typedef struct
{
	check_options *opts;
	http_engine *engine;
	long long started_at_ms;
	destination_seen seen[MAX_DESTINATIONS];
	int n_seen;
	int max_total_seen;
	int submitted;
	int completed;
	long new_connections;
} check_run;

typedef struct
{
	check_run *run;
	const char *destination;
	int index;
} request_tag;

static long long
monotonic_ms(void)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (long long) now.tv_sec * 1000 + now.tv_nsec / 1000000;
}

/* Prints s as a JSON string, or null. */
static void
print_json_string(const char *s)
{
	if (!s)
	{
		fputs("null", stdout);
		return;
	}
	putchar('"');
	for (const unsigned char *p = (const unsigned char *) s; *p; p++)
	{
		if (*p == '"' || *p == '\\')
			printf("\\%c", *p);
		else if (*p < 0x20 || *p == 0x7f)
			printf("\\u%04x", *p);
		else
			putchar(*p);
	}
	putchar('"');
}

static void
sample_in_flight(check_run *run)
{
	int total = http_engine_in_flight(run->engine, NULL);

	if (total > run->max_total_seen)
		run->max_total_seen = total;
	for (int i = 0; i < run->n_seen; i++)
	{
		int n = http_engine_in_flight(run->engine, run->seen[i].name);

		if (n > run->seen[i].max_in_flight_seen)
			run->seen[i].max_in_flight_seen = n;
	}
}

static int
seen_for(check_run *run, const char *destination)
{
	for (int i = 0; i < run->n_seen; i++)
		if (strcmp(run->seen[i].name, destination) == 0)
			return run->seen[i].max_in_flight_seen;
	return 0;
}

static bool submit_one(check_run *run, const char *base_url, const char *destination,
					   const char *path, int index);

static void
on_done(void *opaque, const http_result *result)
{
	request_tag *tag = opaque;
	check_run *run = tag->run;
	check_options *opts = run->opts;
	delivery_outcome outcome =
		classify_http_result(result->curl_code, result->http_status,
							 opts->has_transient ? opts->transient : NULL, opts->n_transient);

	run->completed++;
	run->new_connections += result->new_connections;
	printf("{\"event\":\"done\",\"destination\":");
	print_json_string(tag->destination);
	printf(",\"index\":%d,\"status\":%ld,\"curl_code\":%d,\"outcome\":\"%s\",\"retry_after\":",
		   tag->index, result->http_status, (int) result->curl_code,
		   delivery_outcome_name(outcome));
	print_json_string(result->retry_after);
	printf(",\"retry_after_s\":%ld,\"elapsed_ms\":%ld,\"queued_ms\":%ld,\"new_connections\":%ld,"
		   "\"aborted\":%s,\"t_ms\":%lld,\"max_in_flight_seen\":%d,\"error\":",
		   parse_retry_after(result->retry_after, time(NULL)), result->elapsed_ms,
		   result->queued_ms, result->new_connections, result->aborted ? "true" : "false",
		   monotonic_ms() - run->started_at_ms, seen_for(run, tag->destination));
	print_json_string(result->error);
	printf(",\"response_excerpt\":");
	print_json_string(result->response_excerpt);
	printf("}\n");
	fflush(stdout);

	/* Sequential: the next request goes out from this callback, as a consumer's would. */
	if (opts->sequential && !result->aborted && run->submitted < opts->count)
		submit_one(run, opts->base_url, tag->destination, opts->path, run->submitted);
	free(tag);
}

static bool
submit_one(check_run *run, const char *base_url, const char *destination, const char *path,
		   int index)
{
	check_options *opts = run->opts;
	header_lines headers;
	bool submitted;
	request_tag *tag = calloc(1, sizeof(*tag));
	char url[1024];
	char msg_id[64];
	const char *body = opts->body ? opts->body : "{\"n\":0}";
	http_request req;

	snprintf(url, sizeof(url), "%s%s", base_url, path);
	header_lines_init(&headers);
	for (int i = 0; i < opts->n_headers; i++)
		header_lines_add_line(&headers, opts->headers[i]);
	if (opts->secret)
	{
		if (opts->msg_id)
			snprintf(msg_id, sizeof(msg_id), "%s", opts->msg_id);
		else
			snprintf(msg_id, sizeof(msg_id), "msg_%d", index);
		if (!webhook_add_header_lines(&headers, opts->secret, msg_id,
								 opts->timestamp ? opts->timestamp : (long) time(NULL), body,
								 strlen(body)))
		{
			printf("{\"event\":\"sign_failed\",\"index\":%d}\n", index);
			header_lines_release(&headers);
			free(tag);
			return false;
		}
	}
	tag->run = run;
	tag->destination = destination;
	tag->index = index;
	req = (http_request){
		.destination = destination,
		.max_in_flight = opts->max_in_flight,
		.method = opts->method,
		.url = url,
		.headers = headers.text,
		.body = body,
		.body_len = strlen(body),
		.timeout_ms = opts->timeout_ms,
		.verify_tls = !opts->insecure,
	};
	run->submitted++;
	submitted = http_engine_submit(run->engine, &req, on_done, tag);
	header_lines_release(&headers);
	if (!submitted)
	{
		printf("{\"event\":\"submit_failed\",\"index\":%d}\n", index);
		free(tag);
		return false;
	}
	sample_in_flight(run);
	return true;
}

static void
poll_until_idle(check_run *run, long long deadline_ms)
{
	while (http_engine_pending(run->engine, NULL) > 0 && monotonic_ms() < deadline_ms)
	{
		int completed = http_engine_poll(run->engine, 100);

		if (completed < 0)
			break;
		sample_in_flight(run);
		if (completed > 0 && run->opts->hold_ms > 0)
		{
			struct timespec wall, hold = {run->opts->hold_ms / 1000,
										  (run->opts->hold_ms % 1000) * 1000000L};

			clock_gettime(CLOCK_REALTIME, &wall);
			printf("{\"event\":\"hold\",\"wall_ms\":%lld}\n",
				   (long long) wall.tv_sec * 1000 + wall.tv_nsec / 1000000);
			fflush(stdout);
			nanosleep(&hold, NULL);
		}
	}
}

static void
print_summary(check_run *run)
{
	printf("{\"event\":\"summary\",\"submitted\":%d,\"completed\":%d,\"pending\":%d,"
		   "\"new_connections\":%ld,\"max_total_in_flight_seen\":%d,\"max_in_flight_seen\":{",
		   run->submitted, run->completed, http_engine_pending(run->engine, NULL),
		   run->new_connections, run->max_total_seen);
	for (int i = 0; i < run->n_seen; i++)
	{
		printf("%s", i ? "," : "");
		print_json_string(run->seen[i].name);
		printf(":%d", run->seen[i].max_in_flight_seen);
	}
	printf("}}\n");
}

static int
run_deliveries(check_options *opts, const char *scenario)
{
	check_run run = {.opts = opts, .started_at_ms = monotonic_ms()};
	bool two = strcmp(scenario, "two-destinations") == 0;

	run.engine = http_engine_new(opts->max_total);
	if (!run.engine)
	{
		fprintf(stderr, "http_engine_new failed\n");
		return 1;
	}
	run.seen[run.n_seen++].name = two ? "slow" : "dest";
	if (two)
		run.seen[run.n_seen++].name = "fast";

	if (opts->sequential)
		submit_one(&run, opts->base_url, "dest", opts->path, 0);
	else
		for (int i = 0; i < opts->count; i++)
			submit_one(&run, opts->base_url, two ? "slow" : "dest", two ? "/slow" : opts->path, i);
	if (two)
	{
		/* "slow" is at its limit with a queue behind it when "fast" is submitted. */
		for (int i = 0; i < opts->fast_count; i++)
			submit_one(&run, opts->fast_url ? opts->fast_url : opts->base_url, "fast", "/fast", i);
	}

	if (strcmp(scenario, "abort") == 0)
	{
		long long until = monotonic_ms() + opts->abort_after_ms;

		while (monotonic_ms() < until)
		{
			http_engine_poll(run.engine, 50);
			sample_in_flight(&run);
		}
		printf("{\"event\":\"freeing\",\"pending\":%d,\"in_flight\":%d}\n",
			   http_engine_pending(run.engine, NULL), http_engine_in_flight(run.engine, NULL));
		fflush(stdout);
		http_engine_free(run.engine);
		printf("{\"event\":\"freed\",\"submitted\":%d,\"completed\":%d}\n", run.submitted,
			   run.completed);
		return 0;
	}

	poll_until_idle(&run, monotonic_ms() + 60000);
	print_summary(&run);
	http_engine_free(run.engine);
	return 0;
}

static void
parse_transient_list(check_options *opts, const char *list)
{
	char *saveptr = NULL;

	opts->has_transient = true;
	opts->n_transient = 0;
	free(opts->transient_storage);
	opts->transient_storage = strdup(list);
	for (char *entry = strtok_r(opts->transient_storage, ",", &saveptr);
		 entry && opts->n_transient < MAX_TRANSIENT; entry = strtok_r(NULL, ",", &saveptr))
		opts->transient[opts->n_transient++] = entry;
}

int
main(int argc, char **argv)
{
	static const struct option long_options[] = {
		{"path", required_argument, NULL, 'p'},
		{"count", required_argument, NULL, 'n'},
		{"fast-count", required_argument, NULL, 'f'},
		{"fast-url", required_argument, NULL, 'u'},
		{"max-in-flight", required_argument, NULL, 'm'},
		{"max-total", required_argument, NULL, 'M'},
		{"timeout-ms", required_argument, NULL, 't'},
		{"sequential", no_argument, NULL, 's'},
		{"insecure", no_argument, NULL, 'k'},
		{"abort-after-ms", required_argument, NULL, 'a'},
		{"hold-ms", required_argument, NULL, 'h'},
		{"method", required_argument, NULL, 'X'},
		{"header", required_argument, NULL, 'H'},
		{"body", required_argument, NULL, 'b'},
		{"secret", required_argument, NULL, 'S'},
		{"msg-id", required_argument, NULL, 'i'},
		{"timestamp", required_argument, NULL, 'T'},
		{"transient", required_argument, NULL, 'r'},
		{"value", required_argument, NULL, 'v'},
		{"now", required_argument, NULL, 'w'},
		{"curl-code", required_argument, NULL, 'c'},
		{"status", required_argument, NULL, 'x'},
		{NULL, 0, NULL, 0},
	};
	check_options opts = {
		.path = "/",
		.count = 1,
		.fast_count = 5,
		.max_in_flight = 4,
		.max_total = 64,
		.timeout_ms = 5000,
		.abort_after_ms = 300,
	};
	const char *scenario;
	int c;
	int rc;

	if (argc < 3)
	{
		fprintf(stderr, "usage: %s BASE_URL SCENARIO [OPTIONS] (see the file's header)\n", argv[0]);
		return 2;
	}
	opts.base_url = argv[1];
	scenario = argv[2];
	optind = 3;
	while ((c = getopt_long(argc, argv, "", long_options, NULL)) != -1)
	{
		switch (c)
		{
			case 'p':
				opts.path = optarg;
				break;
			case 'n':
				opts.count = atoi(optarg);
				break;
			case 'f':
				opts.fast_count = atoi(optarg);
				break;
			case 'u':
				opts.fast_url = optarg;
				break;
			case 'm':
				opts.max_in_flight = atoi(optarg);
				break;
			case 'M':
				opts.max_total = atoi(optarg);
				break;
			case 't':
				opts.timeout_ms = atol(optarg);
				break;
			case 's':
				opts.sequential = true;
				break;
			case 'k':
				opts.insecure = true;
				break;
			case 'a':
				opts.abort_after_ms = atoi(optarg);
				break;
			case 'h':
				opts.hold_ms = atoi(optarg);
				break;
			case 'X':
				opts.method = optarg;
				break;
			case 'H':
				if (opts.n_headers < MAX_HEADERS)
					opts.headers[opts.n_headers++] = optarg;
				break;
			case 'b':
				opts.body = optarg;
				break;
			case 'S':
				opts.secret = optarg;
				break;
			case 'i':
				opts.msg_id = optarg;
				break;
			case 'T':
				opts.timestamp = atol(optarg);
				break;
			case 'r':
				parse_transient_list(&opts, optarg);
				break;
			case 'v':
				opts.value = optarg;
				break;
			case 'w':
				opts.now = atol(optarg);
				break;
			case 'c':
				opts.curl_code = atoi(optarg);
				break;
			case 'x':
				opts.status = atol(optarg);
				break;
			default:
				return 2;
		}
	}

	if (strcmp(scenario, "sign") == 0)
	{
		char signature[WEBHOOK_SIGNATURE_SIZE];
		const char *body = opts.body ? opts.body : "";
		bool ok = webhook_sign(opts.secret ? opts.secret : "", opts.msg_id ? opts.msg_id : "",
							   opts.timestamp, body, strlen(body), signature, sizeof(signature));

		printf("{\"ok\":%s,\"signature\":", ok ? "true" : "false");
		print_json_string(signature);
		printf("}\n");
		rc = 0;
	}
	else if (strcmp(scenario, "retry-after") == 0)
	{
		printf("{\"seconds\":%ld}\n",
			   parse_retry_after(opts.value, opts.now ? (time_t) opts.now : time(NULL)));
		rc = 0;
	}
	else if (strcmp(scenario, "classify") == 0)
	{
		printf("{\"outcome\":\"%s\"}\n",
			   delivery_outcome_name(classify_http_result(
				   (CURLcode) opts.curl_code, opts.status,
				   opts.has_transient ? opts.transient : NULL, opts.n_transient)));
		rc = 0;
	}
	else if (strcmp(scenario, "requests") == 0 || strcmp(scenario, "two-destinations") == 0 ||
			 strcmp(scenario, "abort") == 0)
		rc = run_deliveries(&opts, scenario);
	else
	{
		fprintf(stderr, "unknown scenario '%s'\n", scenario);
		rc = 2;
	}
	free(opts.transient_storage);
	return rc;
}
