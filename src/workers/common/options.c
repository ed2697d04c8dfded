/*
 * options.c: parsing and help text of the wal-worker command line.
 */
#include "options.h"

#include "shared/otlp_span.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A role's help: one line for the role list, what it does, its own options. */
typedef struct
{
	const char *name;
	const char *summary;
	const char *behaviour;
	const char *options;
} role_help;

static const role_help roles[] = {
	{"consume", "deliver records from the main topics to their subscribed destinations",
	 "  Reads the main topics (group wal_delivery.shared) and sends each record to every\n"
	 "  subscribed destination it serves. A 2xx is done; a transient failure goes to\n"
	 "  retry step 1, a permanent one to the DLQ topic. A partition's offset is committed\n"
	 "  only up to the lowest record whose copies are not all done. Follows the published\n"
	 "  config version; asks --peer workers for theirs when the database is down.\n",
	 "  --destination NAME   run a dedicated consumer (own consumer group) for one busy\n"
	 "                       destination; without it, serve every shared destination\n"},
	{"retry", "deliver records waiting in the retry steps, pausing failing destinations",
	 "  Consumes the three retry-step topics (group wal_delivery.retry); each message is\n"
	 "  delivered when due, a transient failure moves it to the next step (then the DLQ).\n"
	 "  After pause_after_failures consecutive failures the destination is paused for every\n"
	 "  process; one half-open probe per probe_interval decides when it resumes.\n"
	 "  See SELECT * FROM wal_delivery.destination_status.\n",
	 ""},
	{"dlq", "copy the DLQ topic into wal_delivery.dead_letters and raise alerts",
	 "  Consumes the DLQ topic (group wal_delivery.dlq) and writes each message into\n"
	 "  wal_delivery.dead_letters with its Kafka position, once: its offset is committed\n"
	 "  only after the row. Every dead letter raises one alert: the metric\n"
	 "  wal_dead_letter_alerts_total and, when settings.dlq_alert_url is set, a JSON POST\n"
	 "  retried every 5 s until it is answered 2xx. Entries marked by\n"
	 "  wal_delivery.replay_dead_letter() are written to retry step 1 and resolved once\n"
	 "  Kafka acknowledged them. While the database is down it stops consuming.\n"
	 "  See SELECT * FROM wal_delivery.unresolved_dead_letters.\n",
	 ""},
	{"process", "run the processors of topics whose records need processing",
	 "  Claims rows of topics with a processor (up to 100 at a time, one kind of\n"
	 "  processor per batch, each row under a lease and a fencing token), runs\n"
	 "  SQL processors in the database one row per statement, as the role\n"
	 "  settings.processing_role (a hang is cancelled at its lease plus 1 s), POSTs to\n"
	 "  HTTP processors, and hands each result back; the database refuses a result that\n"
	 "  comes after the lease. A failed attempt waits processing_backoff (doubling);\n"
	 "  after processing_max_attempts the row is a dead letter. Needs no Kafka: the\n"
	 "  relay ships processed rows. Run as many as you like.\n"
	 "  Connect as a LOGIN member of wal_delivery_worker, never as a superuser: a\n"
	 "  processor could RESET ROLE to it, so the worker refuses to start as one.\n"
	 "  See SELECT * FROM wal_delivery.processing_status.\n",
	 ""},
	{"ingest", "the HTTP entry point: records to Kafka, or to the outbox as the fallback",
	 "  Takes records over HTTP (POST /v1/topics/{topic}/records, or /batch as NDJSON),\n"
	 "  with a bearer token of wal_delivery.ingest_tokens. A plain topic's record goes to\n"
	 "  Kafka and is answered 201 once acknowledged with the topic's acks; if Kafka refuses\n"
	 "  it or is silent past --kafka-deadline it is written to the outbox and answered 202\n"
	 "  once committed. Topics that need processing always use the outbox. Neither path:\n"
	 "  503 with Retry-After. Serves /healthz, /readyz and /metrics on --listen too.\n"
	 "  Connect as a LOGIN member of wal_delivery_ingest.\n",
	 "  --listen ADDR:PORT   where to take records (default 127.0.0.1:8480; port 0: a\n"
	 "                       free one, logged as event=started port=N)\n"
	 "  --kafka-deadline MS  how long Kafka may take to acknowledge before the record\n"
	 "                       goes to the outbox (default 1000)\n"},
	{"console", "the on-call console: dead letters, destinations, replay, pause (a web page)",
	 "  Serves a page and a JSON API for on-call: topics' backlogs, destinations' pauses,\n"
	 "  dead letters (filter, inspect, replay, resolve, one or many), the archive and\n"
	 "  the audit log. People sign in with a Postgres role and its password; each one's\n"
	 "  queries run on a connection opened as that role, so the database's grants decide\n"
	 "  what they see and do (wal_delivery_oncall, wal_delivery_admin). --db names the\n"
	 "  database to sign in to (host, port, dbname, sslmode; its user is replaced). Roles\n"
	 "  the server lets in without a password are refused. Needs no Kafka.\n"
	 "  See docs/operations.md, \"The on-call console\".\n",
	 "  --listen ADDR:PORT   where to serve the page (default 127.0.0.1:8090; port 0: a\n"
	 "                       free one, logged as event=started port=N)\n"
	 "  --behind-tls         the console is reached through a TLS proxy: the session\n"
	 "                       cookie says Secure\n"
	 "  --session-idle S     end a session after S seconds without a request (default 1800)\n"
	 "  --session-max-age S  end a session S seconds after sign-in (default 43200)\n"
	 "  --max-sessions N     sessions signed in at once, at most (default 64)\n"},
};

static const char common_help[] =
	"Common options:\n"
	"  -d, --db CONNINFO    control-plane database as a libpq conninfo or URI\n"
	"                       (default: the PGHOST, PGPORT, PGDATABASE, PGUSER environment)\n"
	"  -X NAME=VALUE        a librdkafka property, passed unchanged (repeatable), e.g.\n"
	"                       -X bootstrap.servers=127.0.0.1:9092 -X security.protocol=ssl;\n"
	"                       bootstrap.servers defaults to the control plane's setting\n"
	"  --admin-port PORT    serve /metrics, /healthz, /readyz and /config on PORT\n"
	"                       (0: a free port, logged as event=admin_server_started)\n"
	"  --admin-listen ADDR  the numeric IP address the admin port listens on\n"
	"                       (default 127.0.0.1; 0.0.0.0 or :: for every interface);\n"
	"                       /config is served only with the WAL_PEER_TOKEN bearer token\n"
	"  --peer URL           a peer worker (or a load balancer in front of them) to ask\n"
	"                       for its cached config when the database is unreachable\n"
	"                       (repeatable), e.g. --peer http://10.0.0.7:9400; sends\n"
	"                       WAL_PEER_TOKEN from the environment as its bearer token\n"
	"  --otlp-endpoint URL  export a span per delivery attempt of a sampled trace over\n"
	"                       OTLP/HTTP to URL/v1/traces, e.g. http://127.0.0.1:4318\n"
	"                       (default: no export)\n"
	"  --time-scale N       run every delay, pause and probe interval N times faster\n"
	"                       (tests use 10; default 1)\n"
	"  -v, --verbose        log debug events too\n"
	"  -h, --help           this help\n";

bool
is_known_role(const char *role)
{
	for (size_t i = 0; i < sizeof(roles) / sizeof(roles[0]); i++)
		if (strcmp(roles[i].name, role) == 0)
			return true;
	return false;
}

void
print_main_help(void)
{
	printf("wal-worker: the delivery workers of wal_delivery\n\n"
		   "Usage: wal-worker ROLE [OPTIONS]\n"
		   "       wal-worker --version    print the version (wal_delivery's)\n\nRoles:\n");
	for (size_t i = 0; i < sizeof(roles) / sizeof(roles[0]); i++)
		printf("  %-9s %s\n", roles[i].name, roles[i].summary);
	printf("\n%s\nRun 'wal-worker ROLE --help' for a role's own options.\n", common_help);
}

void
print_role_help(const char *role)
{
	for (size_t i = 0; i < sizeof(roles) / sizeof(roles[0]); i++)
	{
		if (strcmp(roles[i].name, role) != 0)
			continue;
		printf("wal-worker %s: %s\n\nUsage: wal-worker %s [OPTIONS]\n\n", role, roles[i].summary,
			   role);
		printf("What it does:\n%s\n", roles[i].behaviour);
		if (roles[i].options[0] != '\0')
			printf("Options of %s:\n%s\n", role, roles[i].options);
		printf("%s", common_help);
	}
}

static int
usage_error(const char *role, const char *fmt, const char *arg)
{
	fprintf(stderr, "wal-worker %s: ", role);
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\nTry 'wal-worker %s --help'.\n", role);
	return 2;
}

enum
{
	OPT_ADMIN_PORT = 256,
	OPT_TIME_SCALE,
	OPT_DESTINATION,
	OPT_PEER,
	OPT_ADMIN_LISTEN,
	OPT_LISTEN,
	OPT_KAFKA_DEADLINE,
	OPT_BEHIND_TLS,
	OPT_SESSION_IDLE,
	OPT_SESSION_MAX_AGE,
	OPT_MAX_SESSIONS,
	OPT_OTLP_ENDPOINT
};

/* A console-only number option in [min, max]; 0 and *out set, or a usage error's code. */
static int
console_number(const char *role, const char *name, const char *arg, long min, long max, int *out)
{
	char *end;
	long v;

	if (strcmp(role, "console") != 0)
	{
		fprintf(stderr,
				"wal-worker %s: %s only applies to 'console'\nTry 'wal-worker %s --help'.\n", role,
				name, role);
		return 2;
	}
	errno = 0;
	v = strtol(arg, &end, 10);
	if (errno != 0 || *end != '\0' || arg[0] == '\0' || v < min || v > max)
	{
		fprintf(stderr,
				"wal-worker %s: %s must be %ld to %ld, got '%s'\nTry 'wal-worker %s --help'.\n",
				role, name, min, max, arg, role);
		return 2;
	}
	*out = (int) v;
	return 0;
}

int
parse_worker_options(int argc, char **argv, worker_options *opts, bool *help_requested)
{
	static const struct option long_options[] = {
		{"db", required_argument, NULL, 'd'},
		{"admin-port", required_argument, NULL, OPT_ADMIN_PORT},
		{"admin-listen", required_argument, NULL, OPT_ADMIN_LISTEN},
		{"time-scale", required_argument, NULL, OPT_TIME_SCALE},
		{"destination", required_argument, NULL, OPT_DESTINATION},
		{"peer", required_argument, NULL, OPT_PEER},
		{"listen", required_argument, NULL, OPT_LISTEN},
		{"kafka-deadline", required_argument, NULL, OPT_KAFKA_DEADLINE},
		{"behind-tls", no_argument, NULL, OPT_BEHIND_TLS},
		{"session-idle", required_argument, NULL, OPT_SESSION_IDLE},
		{"session-max-age", required_argument, NULL, OPT_SESSION_MAX_AGE},
		{"max-sessions", required_argument, NULL, OPT_MAX_SESSIONS},
		{"otlp-endpoint", required_argument, NULL, OPT_OTLP_ENDPOINT},
		{"verbose", no_argument, NULL, 'v'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *role = argv[0];
	int c, rc;
	char *end;

	memset(opts, 0, sizeof(*opts));
	opts->role = role;
	opts->conninfo = "";
	opts->admin_port = -1;
	opts->time_scale = 1.0;
	*help_requested = false;
	optind = 1;

	while ((c = getopt_long(argc, argv, "d:X:vh", long_options, NULL)) != -1)
	{
		switch (c)
		{
			case 'd':
				opts->conninfo = optarg;
				break;
			case 'X':
			{
				char *eq = strchr(optarg, '=');

				if (eq == NULL || eq == optarg)
					return usage_error(role, "-X needs NAME=VALUE, got '%s'", optarg);
				if (opts->n_kafka_props == MAX_KAFKA_PROPS)
					return usage_error(role, "too many -X properties (at most 64), at '%s'",
									   optarg);
				if ((size_t) (eq - optarg) >= MAX_KAFKA_PROP_NAME)
					return usage_error(role, "-X property name too long, at '%s'", optarg);
				memcpy(opts->kafka_props[opts->n_kafka_props].name, optarg, (size_t) (eq - optarg));
				opts->kafka_props[opts->n_kafka_props].name[eq - optarg] = '\0';
				opts->kafka_props[opts->n_kafka_props].value = eq + 1;
				opts->n_kafka_props++;
				break;
			}
			case OPT_ADMIN_PORT:
			{
				errno = 0;
				long port = strtol(optarg, &end, 10);

				if (errno != 0 || *end != '\0' || optarg[0] == '\0' || port < 0 || port > 65535)
					return usage_error(
						role,
						"--admin-port must be a port number 0-65535 (0: a free one), got '%s'",
						optarg);
				opts->admin_port = (int) port;
				break;
			}
			case OPT_ADMIN_LISTEN:
				if (optarg[0] == '\0')
					return usage_error(role, "--admin-listen needs a numeric IP address%s", "");
				opts->admin_listen = optarg;
				break;
			case OPT_TIME_SCALE:
				errno = 0;
				opts->time_scale = strtod(optarg, &end);
				if (errno != 0 || *end != '\0' || !(opts->time_scale >= 1.0))
					return usage_error(role, "--time-scale must be a number >= 1, got '%s'",
									   optarg);
				break;
			case OPT_DESTINATION:
				if (strcmp(role, "consume") != 0)
					return usage_error(role, "--destination only applies to 'consume'%s", "");
				if (optarg[0] == '\0')
					return usage_error(role, "--destination needs a destination name%s", "");
				opts->destination = optarg;
				break;
			case OPT_PEER:
				if (strncmp(optarg, "http://", 7) != 0 && strncmp(optarg, "https://", 8) != 0)
					return usage_error(role, "--peer must be an http:// or https:// URL, got '%s'",
									   optarg);
				if (opts->n_peers == MAX_PEERS)
					return usage_error(role, "too many --peer URLs (at most 16), at '%s'", optarg);
				opts->peers[opts->n_peers++] = optarg;
				break;
			case OPT_LISTEN:
				if (strcmp(role, "ingest") != 0 && strcmp(role, "console") != 0)
					return usage_error(role, "--listen only applies to 'ingest' and 'console'%s",
									   "");
				opts->listen = optarg;
				break;
			case OPT_BEHIND_TLS:
			{
				int ignored;

				if ((rc = console_number(role, "--behind-tls", "1", 1, 1, &ignored)) != 0)
					return rc;
				opts->behind_tls = true;
				break;
			}
			case OPT_SESSION_IDLE:
				if ((rc = console_number(role, "--session-idle", optarg, 10, 86400,
										 &opts->session_idle_s)) != 0)
					return rc;
				break;
			case OPT_SESSION_MAX_AGE:
				if ((rc = console_number(role, "--session-max-age", optarg, 10, 7 * 86400,
										 &opts->session_max_age_s)) != 0)
					return rc;
				break;
			case OPT_MAX_SESSIONS:
				if ((rc = console_number(role, "--max-sessions", optarg, 1, 10000,
										 &opts->max_sessions)) != 0)
					return rc;
				break;
			case OPT_KAFKA_DEADLINE:
				if (strcmp(role, "ingest") != 0)
					return usage_error(role, "--kafka-deadline only applies to 'ingest'%s", "");
				errno = 0;
				opts->kafka_deadline_ms = (int) strtol(optarg, &end, 10);
				if (errno != 0 || *end != '\0' || opts->kafka_deadline_ms < 1 ||
					opts->kafka_deadline_ms > 600000)
					return usage_error(role, "--kafka-deadline must be 1 to 600000 ms, got '%s'",
									   optarg);
				break;
			case OPT_OTLP_ENDPOINT:
			{
				char url[OTLP_URL_MAX];
				const char *problem = otlp_traces_url(optarg, url);

				if (problem != NULL)
					return usage_error(role, "--otlp-endpoint: %s", problem);
				opts->otlp_endpoint = optarg;
				break;
			}
			case 'v':
				opts->verbose = true;
				break;
			case 'h':
				*help_requested = true;
				return 0;
			default:
				fprintf(stderr, "Try 'wal-worker %s --help'.\n", role);
				return 2;
		}
	}
	if (optind < argc)
		return usage_error(role, "unexpected argument '%s'", argv[optind]);
	return 0;
}
