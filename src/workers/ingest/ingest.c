/*
 * ingest.c: `wal-worker ingest`, the HTTP entry point for services that do not write to
 * this database.
 *
 * A record of a plain topic is produced straight to Kafka and answered 201 once Kafka
 * acknowledged it with the topic's acks; when Kafka refuses it or does not acknowledge it
 * within --kafka-deadline, it is written to the outbox instead and answered 202 once
 * committed (the relay ships it later). Records of topics that need processing always go
 * to the outbox. No record is answered 2xx before it is durable on one of the two paths;
 * when neither works the answer is 503 with Retry-After.
 *
 * The configuration (topics, token hashes) comes from wal_delivery.ingest_config() and
 * follows the published version like every role's (config_watch); the database being
 * down stops neither the configuration nor the direct path.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/config_watch.h"
#include "common/log.h"
#include "common/role_setup.h"
#include "common/sd_notify.h"
#include "common/stop_signal.h"
#include "ingest/ingest_catalog.h"
#include "ingest/ingest_http.h"
#include "ingest/ingest_kafka.h"
#include "ingest/ingest_metrics.h"
#include "ingest/ingest_outbox.h"
#include "roles.h"

#define OUTBOX_WRITERS   2
#define LOOP_MS          20
#define STOP_EXTRA_MS    5000
#define DEFAULT_LISTEN   "127.0.0.1:8480"
#define DEFAULT_DEADLINE 1000

/* A durable path works (the configuration is loaded before the server starts). */
static bool
ingest_ready(void)
{
	return ingest_kafka_up() || ingest_outbox_up();
}

static bool
admin_ready(void *arg)
{
	(void) arg;
	return ingest_ready();
}

static char *
admin_config_json(void *arg)
{
	return config_watch_json_for_peers(arg);
}

static bool
install_catalog(const control_plane_config *config)
{
	char errbuf[256];
	ingest_catalog *catalog =
		ingest_catalog_parse(config->json, config->version, errbuf, sizeof(errbuf));

	if (catalog == NULL)
	{
		log_error("event=config_unusable version=%" PRId64 " error=\"%s\"", config->version,
				  errbuf);
		return false;
	}
	ingest_catalog_install(catalog);
	log_info("event=catalog_loaded version=%" PRId64 " topics=%d tokens=%d", config->version,
			 catalog->n_topics, catalog->n_tokens);
	return true;
}

int
run_ingest(const worker_options *opts)
{
	const char *listen = opts->listen ? opts->listen : DEFAULT_LISTEN;
	int deadline = opts->kafka_deadline_ms > 0 ? opts->kafka_deadline_ms : DEFAULT_DEADLINE;
	config_watch *watch;
	admin_server *admin = NULL;
	ingest_http *http;
	char errbuf[512];

	stop_on_signals();
	ingest_metrics_register();
	watch = config_watch_start(opts, &stop_requested);
	if (watch == NULL)
		return 0;
	if (!install_catalog(config_watch_current(watch)))
		return 1;
	if (!ingest_kafka_start(opts, config_watch_current(watch)->kafka_bootstrap_servers, deadline,
							errbuf, sizeof(errbuf)))
	{
		log_error("event=kafka_config_failed error=\"%s\"", errbuf);
		return 1;
	}
	ingest_outbox_start(opts, OUTBOX_WRITERS);
	{
		admin_handlers handlers = {admin_ready, admin_config_json, watch};

		if (!role_start_admin(opts, &handlers, &admin))
			return 1;
	}
	http = ingest_http_start(listen, ingest_ready, errbuf, sizeof(errbuf));
	if (http == NULL)
	{
		log_error("event=listen_failed error=\"%s\"", errbuf);
		return 1;
	}
	log_info("event=started listen=%s port=%d kafka_deadline_ms=%d", listen, ingest_http_port(http),
			 deadline);
	while (!stop_requested)
	{
		sd_notify_loop();
		if (config_watch_poll(watch))
		{
			install_catalog(config_watch_current(watch));
			ingest_kafka_set_bootstrap(config_watch_current(watch)->kafka_bootstrap_servers);
		}
		usleep(LOOP_MS * 1000);
	}

	/* Answer what is in flight (each record settles within the deadline), then close. */
	log_info("event=stopping");
	ingest_http_stop(http, deadline + STOP_EXTRA_MS);
	ingest_kafka_stop();
	ingest_outbox_stop();
	admin_server_stop(admin);
	config_watch_stop(watch);
	log_info("event=stopped");
	return 0;
}
