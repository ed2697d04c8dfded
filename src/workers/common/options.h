/*
 * options.h: the command line every wal-worker role shares (see `wal-worker --help`).
 *
 * kafka_props holds the -X name=value pairs exactly as given; they are passed to
 * librdkafka unchanged, never renamed.
 */
#ifndef WAL_OPTIONS_H
#define WAL_OPTIONS_H

#include <stdbool.h>

#define MAX_KAFKA_PROPS 64
#define MAX_PEERS       16

/* librdkafka's property names are short; a longer -X name is refused. */
#define MAX_KAFKA_PROP_NAME 128

typedef struct
{
	char name[MAX_KAFKA_PROP_NAME]; /* a copy: argv stays as typed, so ps shows it */
	const char *value;              /* in argv */
} kafka_prop;

typedef struct
{
	const char *role;         /* consume, retry, dlq, process, ingest, console */
	const char *conninfo;     /* libpq conninfo; "" means the PG* environment */
	const char *destination;  /* consume --destination NAME: a dedicated consumer */
	int admin_port;           /* -1: no admin HTTP server; 0: a free port */
	const char *admin_listen; /* --admin-listen ADDRESS; NULL: 127.0.0.1 */
	double time_scale;        /* every delay is divided by this */
	bool verbose;
	int n_peers;
	const char *peers[MAX_PEERS]; /* --peer URL: where to fetch config when the db is down */
	int n_kafka_props;
	kafka_prop kafka_props[MAX_KAFKA_PROPS];
	const char *listen;        /* ingest, console --listen ADDRESS:PORT; NULL: the role's default */
	int kafka_deadline_ms;     /* ingest --kafka-deadline MS; 0: 1000 */
	bool behind_tls;           /* console --behind-tls: session cookies say Secure */
	int session_idle_s;        /* console --session-idle SECONDS; 0: 1800 */
	int session_max_age_s;     /* console --session-max-age SECONDS; 0: 43200 */
	int max_sessions;          /* console --max-sessions N; 0: 64 */
	const char *otlp_endpoint; /* --otlp-endpoint URL: export spans there; NULL: off */
} worker_options;

/* Returns 0 and fills opts, or prints what is wrong and returns the exit code to use. */
int parse_worker_options(int argc, char **argv, worker_options *opts, bool *help_requested);

void print_main_help(void);
void print_role_help(const char *role);
bool is_known_role(const char *role);

#endif
