/*
 * admin_server_check.c: a test driver for the workers' admin server and metrics registry
 * (src/workers/common/admin_server.c, metrics.c), run by
 * tests/integration/test_worker_admin_server.py.
 *
 *   admin_server_check PORT READY_FILE [INCREMENTS_PER_THREAD]
 *
 * Registers a few metrics whose labels and help need escaping, serves them on
 * ADMIN_CHECK_ADDRESS (environment; default 127.0.0.1) at PORT (0: any free port) and
 * prints "listening on ADDRESS:PORT". /config needs the token in ADMIN_CHECK_TOKEN
 * (environment; unset: /config is not served). /readyz is
 * ready, and /config has its JSON, while READY_FILE exists. Each SIGUSR1 starts 8 threads
 * that each add 1 to a shared and a per-thread counter INCREMENTS_PER_THREAD times, then
 * prints "increments done TOTAL". SIGTERM or SIGINT stops the server and exits 0; a server
 * that cannot start prints the reason to stderr and exits 1.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/admin_server.h"
#include "common/metrics.h"

#define INCREMENT_THREADS 8

typedef struct
{
	const char *ready_file;
} check_state;

typedef struct
{
	pthread_t thread;
	int index;
	long increments;
	metric *shared_counter;
} increment_thread;

static const char *const destination_outcome[] = {"destination", "outcome"};
static const char *const destination_only[] = {"destination"};
static const char *const thread_only[] = {"thread"};

static bool
ready_while_file_exists(void *arg)
{
	const check_state *state = arg;

	return access(state->ready_file, F_OK) == 0;
}

/* Like a worker that has not loaded its config yet: no JSON until it is ready. */
static char *
config_once_ready(void *arg)
{
	if (!ready_while_file_exists(arg))
		return NULL;
	return strdup("{\"role\": \"admin-check\", \"time_scale\": 10, "
				  "\"note\": \"quote \\\" backslash \\\\ accent \\u00e9\"}");
}

static void
register_fixed_metrics(void)
{
	metric *deliveries;
	metric *breaker;

	deliveries = metric_counter("admin_check_deliveries_total",
								"Deliveries by destination and outcome.", 2, destination_outcome);
	if (metric_counter("admin_check_deliveries_total", "ignored", 2, destination_outcome) !=
		deliveries)
	{
		fprintf(stderr, "admin_server_check: registering a name twice gave two metrics\n");
		exit(1);
	}
	metric_add(deliveries, 3, (const char *const[]){"say \"hi\"", "ok"});
	/* Ignored: a counter never goes down. */
	metric_add(deliveries, -5, (const char *const[]){"say \"hi\"", "ok"});
	metric_add(deliveries, 1.5, (const char *const[]){"back\\slash", "ok"});
	metric_add(deliveries, 2, (const char *const[]){"new\nline", "failed"});

	breaker = metric_gauge("admin_check_breaker_open",
						   "Whether a destination's breaker is open.\nOne line per destination, "
						   "path C:\\x",
						   1, destination_only);
	metric_set(breaker, 1, (const char *const[]){"plain"});
	metric_set(breaker, -2.5,
			   (const char *const[]){"\xc3\xbc"
									 "n"
									 "\xc3\xaf"
									 "code"});
	metric_add(breaker, 0.25, (const char *const[]){"plain"});

	metric_set(metric_gauge("admin_check_up", "1 while the driver runs.", 0, NULL), 1, NULL);
	metric_counter("admin_check_untouched_total", "Never incremented.", 0, NULL);
	metric_counter("admin_check_increments_total", "Increments by the SIGUSR1 threads.", 1,
				   thread_only);
}

static void *
run_increments(void *arg)
{
	increment_thread *self = arg;
	char thread_label[16];
	metric *counter;
	metric *last_seen;

	/* Registering concurrently must still give every thread the one metric. */
	counter = metric_counter("admin_check_increments_total", "Increments by the SIGUSR1 threads.",
							 1, thread_only);
	if (counter != self->shared_counter)
	{
		fprintf(stderr, "admin_server_check: thread %d got another metric\n", self->index);
		abort();
	}
	last_seen = metric_gauge("admin_check_last_increment", "Last increment number per thread.", 1,
							 thread_only);
	snprintf(thread_label, sizeof(thread_label), "%d", self->index);

	for (long i = 1; i <= self->increments; i++)
	{
		metric_add(counter, 1, (const char *const[]){"all"});
		metric_add(counter, 1, (const char *const[]){thread_label});
		metric_set(last_seen, (double) i, (const char *const[]){thread_label});
		/* Spread the increments out so that scrapes land in the middle of them. */
		if (i % 100 == 0)
			nanosleep(&(struct timespec){0, 1000000}, NULL);
	}
	return NULL;
}

static void
run_increment_threads(long increments_per_thread)
{
	increment_thread threads[INCREMENT_THREADS];
	metric *shared = metric_counter("admin_check_increments_total",
									"Increments by the SIGUSR1 threads.", 1, thread_only);

	for (int i = 0; i < INCREMENT_THREADS; i++)
	{
		threads[i].index = i;
		threads[i].increments = increments_per_thread;
		threads[i].shared_counter = shared;
		if (pthread_create(&threads[i].thread, NULL, run_increments, &threads[i]) != 0)
		{
			fprintf(stderr, "admin_server_check: cannot start thread %d\n", i);
			exit(1);
		}
	}
	for (int i = 0; i < INCREMENT_THREADS; i++)
		pthread_join(threads[i].thread, NULL);
	printf("increments done %ld\n", increments_per_thread * INCREMENT_THREADS);
	fflush(stdout);
}

int
main(int argc, char **argv)
{
	check_state state;
	admin_handlers handlers;
	admin_listen listen;
	admin_server *server;
	long increments_per_thread;
	char errbuf[256];
	sigset_t signals;
	int signal_number;

	if (argc < 3 || argc > 4)
	{
		fprintf(stderr, "usage: admin_server_check PORT READY_FILE [INCREMENTS_PER_THREAD]\n");
		return 2;
	}
	state.ready_file = argv[2];
	increments_per_thread = argc == 4 ? atol(argv[3]) : 1000;

	/* Blocked before any thread starts, so only sigwait below ever sees them. */
	sigemptyset(&signals);
	sigaddset(&signals, SIGTERM);
	sigaddset(&signals, SIGINT);
	sigaddset(&signals, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, &signals, NULL);

	register_fixed_metrics();

	handlers.is_ready = ready_while_file_exists;
	handlers.config_json = config_once_ready;
	handlers.arg = &state;
	listen.address = getenv("ADMIN_CHECK_ADDRESS");
	listen.port = atoi(argv[1]);
	listen.config_token = getenv("ADMIN_CHECK_TOKEN");
	server = admin_server_start(&listen, &handlers, errbuf, sizeof(errbuf));
	if (server == NULL)
	{
		fprintf(stderr, "admin_server_check: %s\n", errbuf);
		return 1;
	}
	printf("listening on %s:%d\n", listen.address ? listen.address : "127.0.0.1",
		   admin_server_port(server));
	fflush(stdout);

	for (;;)
	{
		if (sigwait(&signals, &signal_number) != 0)
			continue;
		if (signal_number == SIGUSR1)
			run_increment_threads(increments_per_thread);
		else
			break;
	}

	admin_server_stop(server);
	printf("stopped\n");
	fflush(stdout);
	return 0;
}
