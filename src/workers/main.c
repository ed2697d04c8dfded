/*
 * main.c: the wal-worker binary. Picks the role named by the first argument, parses the
 * shared options and runs that role until it is told to stop.
 */
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/options.h"
#include "common/otlp_exporter.h"
#include "common/stop_signal.h"
#include "roles.h"

/* The Makefile passes default_version of wal_delivery.control: worker and SQL agree. */
#ifndef WAL_DELIVERY_VERSION
#error "WAL_DELIVERY_VERSION is not defined; build with make"
#endif

static int
run_role(const worker_options *opts)
{
	if (strcmp(opts->role, "consume") == 0)
		return run_consume(opts);
	if (strcmp(opts->role, "dlq") == 0)
		return run_dlq(opts);
	if (strcmp(opts->role, "retry") == 0)
		return run_retry(opts);
	if (strcmp(opts->role, "process") == 0)
		return run_process(opts);
	if (strcmp(opts->role, "ingest") == 0)
		return run_ingest(opts);
	if (strcmp(opts->role, "console") == 0)
		return run_console(opts);

	/* The roles land one by one (see the project's issues); until then say so plainly. */
	log_error("event=role_unavailable role=%s msg=\"this build does not include the %s role yet\"",
			  opts->role, opts->role);
	return 3;
}

int
main(int argc, char **argv)
{
	worker_options opts;
	bool help_requested;
	int rc;

	if (argc == 2 && (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-V") == 0))
	{
		printf("wal-worker %s\n", WAL_DELIVERY_VERSION);
		return 0;
	}
	if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)
	{
		print_main_help();
		return argc < 2 ? 2 : 0;
	}
	if (!is_known_role(argv[1]))
	{
		fprintf(stderr, "wal-worker: unknown role '%s'\nTry 'wal-worker --help'.\n", argv[1]);
		return 2;
	}

	rc = parse_worker_options(argc - 1, argv + 1, &opts, &help_requested);
	if (rc != 0)
		return rc;
	if (help_requested)
	{
		print_role_help(opts.role);
		return 0;
	}

	log_set_role(opts.role);
	if (opts.verbose)
		log_set_min_level(LOG_DEBUG);

	/* Before the role starts any thread: the exporter's start initialises libcurl. */
	if (opts.otlp_endpoint != NULL && !otlp_exporter_start(opts.otlp_endpoint, opts.role))
		return 1;
	rc = run_role(&opts);
	otlp_exporter_stop();
	/* A failure that stopped the role (stop_with_failure) outranks a clean stop's 0. */
	return stop_exit_status != 0 ? stop_exit_status : rc;
}
