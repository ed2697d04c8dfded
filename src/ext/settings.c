/*
 * settings.c: every setting (GUC) of the extension, in one place.
 *
 * Settings that need a restart (the database, the number of relays) are PGC_POSTMASTER;
 * the rest take effect at the next reload, which each background worker handles itself.
 * MarkGUCPrefixReserved makes a misspelt wal_delivery.* setting an error.
 */
#include "postgres.h"

#include "utils/guc.h"

#include "shared/otlp_span.h"
#include "settings.h"
#include "shared/trace_context.h"

char *wal_delivery_database = NULL;
int wal_delivery_relay_workers = 1;
char *kafka_bootstrap_servers = NULL;
char *kafka_properties = NULL;
char *otlp_endpoint = NULL;
int relay_batch_size = 500;
int relay_idle_interval_ms = 1000;
int relay_linger_ms = 10;
int relay_delivery_timeout_ms = 30000;
int relay_max_backoff_ms = 60000;
int relay_shutdown_flush_ms = 5000;
int maintenance_interval_ms = 10000;
int reconcile_interval_ms = 30000;
bool wal_delivery_force_delete = false;
char *wal_delivery_traceparent = NULL;
char *wal_delivery_tracestate = NULL;

/* The parser's problem as a DETAIL sentence: capitalised, with a full stop. */
static void
trace_detail(const char *problem)
{
	char *detail = psprintf("%s.", problem);

	detail[0] = (char) pg_toupper((unsigned char) detail[0]);
	GUC_check_errdetail("%s", detail);
}

/* SET refuses a context the workers could not continue: the record would carry it. */
static bool
check_traceparent(char **newval, void **extra, GucSource source)
{
	trace_context tc;
	const char *problem;

	if (*newval == NULL || (*newval)[0] == '\0')
		return true;
	problem = trace_context_parse(*newval, strlen(*newval), &tc);
	if (problem == NULL)
		return true;
	trace_detail(problem);
	GUC_check_errhint("W3C Trace Context: version-traceid-parentid-flags in lowercase hex, for "
					  "example 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01; '' for "
					  "none.");
	return false;
}

static bool
check_tracestate(char **newval, void **extra, GucSource source)
{
	const char *problem;

	if (*newval == NULL || (*newval)[0] == '\0')
		return true;
	problem = tracestate_check(*newval, strlen(*newval));
	if (problem == NULL)
		return true;
	trace_detail(problem);
	GUC_check_errhint("A tracestate is at most 512 printable ASCII characters; '' for none.");
	return false;
}

static void
define_trace_settings(void)
{
	DefineCustomStringVariable(
		"wal_delivery.traceparent",
		"W3C traceparent that records enqueued by this session carry when they bring none.",
		"Set it in the traced transaction (SET LOCAL); every delivery attempt continues "
		"this trace. Empty: none.",
		&wal_delivery_traceparent, "", PGC_USERSET, 0, check_traceparent, NULL, NULL);
	DefineCustomStringVariable(
		"wal_delivery.tracestate",
		"W3C tracestate that goes with wal_delivery.traceparent into enqueued records.",
		"Only used while wal_delivery.traceparent is set. Empty: none.", &wal_delivery_tracestate,
		"", PGC_USERSET, 0, check_tracestate, NULL, NULL);
}

static void
define_worker_settings(void)
{
	DefineCustomStringVariable("wal_delivery.database", "Database the relay workers connect to.",
							   "The database where CREATE EXTENSION wal_delivery ran.",
							   &wal_delivery_database, "postgres", PGC_POSTMASTER, 0, NULL, NULL,
							   NULL);
	DefineCustomIntVariable("wal_delivery.relay_workers", "Number of relay background workers.",
							"0 disables the relay.", &wal_delivery_relay_workers, 1, 0,
							MAX_RELAY_WORKERS, PGC_POSTMASTER, 0, NULL, NULL, NULL);
}

static void
define_kafka_settings(void)
{
	DefineCustomStringVariable("wal_delivery.kafka_bootstrap_servers",
							   "Kafka bootstrap servers (host:port,...) for the relay.", NULL,
							   &kafka_bootstrap_servers, "", PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomStringVariable(
		"wal_delivery.kafka_properties",
		"librdkafka properties for the relay, passed unchanged: name=value;name=value.",
		"For security, SASL, TLS, compression, linger and the like, e.g. "
		"'security.protocol=ssl;compression.type=lz4'.",
		&kafka_properties, "", PGC_SIGHUP, 0, NULL, NULL, NULL);
}

static void
define_relay_settings(void)
{
	DefineCustomIntVariable("wal_delivery.relay_batch_size", "Rows one relay pass claims.", NULL,
							&relay_batch_size, 500, 1, 100000, PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("wal_delivery.relay_idle_interval",
							"How long an idle relay sleeps when no commit wakes it.", NULL,
							&relay_idle_interval_ms, 1000, 10, 600000, PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);
	DefineCustomIntVariable("wal_delivery.relay_linger",
							"How soon after its last pass a relay woken by a commit runs the "
							"next one.",
							"Commits that come meanwhile share that pass and its produce "
							"request; 0 runs a pass for every wake-up.",
							&relay_linger_ms, 10, 0, 1000, PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL,
							NULL);
	DefineCustomIntVariable(
		"wal_delivery.relay_delivery_timeout",
		"How long a pass waits for Kafka's acknowledgements; an acks=all record "
		"not acknowledged by then stays in flight.",
		NULL, &relay_delivery_timeout_ms, 30000, 1000, 3600000, PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL,
		NULL);
	DefineCustomIntVariable(
		"wal_delivery.relay_max_backoff", "Longest wait between passes while Kafka fails.", NULL,
		&relay_max_backoff_ms, 60000, 100, 3600000, PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomIntVariable("wal_delivery.relay_shutdown_flush",
							"How long a stopping relay waits for outstanding acknowledgements.",
							NULL, &relay_shutdown_flush_ms, 5000, 0, 60000, PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);
}

/* An OTLP endpoint the relay could not use is refused when it is set, not ignored later. */
static bool
check_otlp_endpoint(char **newval, void **extra, GucSource source)
{
	char url[OTLP_URL_MAX];
	const char *problem;

	if (*newval == NULL || (*newval)[0] == '\0')
		return true;
	problem = otlp_traces_url(*newval, url);
	if (problem == NULL)
		return true;
	/* A DETAIL is a sentence: the problem, capitalised. */
	GUC_check_errdetail("%c%s.", pg_toupper((unsigned char) problem[0]), problem + 1);
	GUC_check_errhint("Name the collector's OTLP/HTTP base URL, for example "
					  "http://127.0.0.1:4318; spans go to its /v1/traces. Empty turns export off.");
	return false;
}

static void
define_span_settings(void)
{
	DefineCustomStringVariable(
		"wal_delivery.otlp_endpoint",
		"OTLP/HTTP collector the relay exports its spans to; empty: no export.",
		"The base URL, e.g. http://127.0.0.1:4318: spans are POSTed to its /v1/traces.",
		&otlp_endpoint, "", PGC_SIGHUP, 0, check_otlp_endpoint, NULL, NULL);
}

static void
define_periodic_settings(void)
{
	DefineCustomIntVariable("wal_delivery.maintenance_interval",
							"How often relay 0 expires processing leases and purges finished rows.",
							NULL, &maintenance_interval_ms, 10000, 100, 3600000, PGC_SIGHUP,
							GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomIntVariable("wal_delivery.reconcile_interval",
							"How often the reconciler checks Kafka even without a config change.",
							NULL, &reconcile_interval_ms, 30000, 1000, 86400000, PGC_SIGHUP,
							GUC_UNIT_MS, NULL, NULL, NULL);
}

void
define_settings(void)
{
	DefineCustomBoolVariable(
		"wal_delivery.force_delete",
		"Allows deleting a topic or destination that still has undelivered records.",
		"The undelivered records of a deleted topic are removed with it. Set it only for "
		"the transaction that deletes (SET LOCAL).",
		&wal_delivery_force_delete, false, PGC_USERSET, 0, NULL, NULL, NULL);
	define_worker_settings();
	define_kafka_settings();
	define_relay_settings();
	define_span_settings();
	define_periodic_settings();
	define_trace_settings();
	MarkGUCPrefixReserved("wal_delivery");
}
