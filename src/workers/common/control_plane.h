/*
 * control_plane.h: the configuration the workers read from the control-plane database.
 *
 * The database hands it over as one JSON document (wal_delivery.worker_config()); the
 * workers keep that document as their cache, serve it to peers on /config, and parse
 * the same document from a peer when the database is down. A worker never runs on an
 * empty configuration: until one is loaded it says so and retries.
 */
#ifndef WAL_CONTROL_PLANE_H
#define WAL_CONTROL_PLANE_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>
#include <libpq-fe.h>

#define RETRY_STEPS 3

typedef struct destination_config
{
	char *name;
	char *endpoint;
	char *method;
	json_t *headers; /* object of strings, owned */
	long timeout_ms;
	int max_in_flight;
	bool dedicated;
	bool verify_tls;
	char **transient_statuses;
	int n_transient_statuses;
	long retry_delays_ms[RETRY_STEPS];
	double retry_jitter;
	int pause_after_failures;
	long probe_interval_ms;
	int retry_partition;
	char *signing_secret;    /* NULL when the destination signs nothing */
	bool secret_unavailable; /* config came from a peer, which never shares secrets */
	char **topics;           /* the topics it subscribes to */
	int n_topics;
} destination_config;

typedef struct control_plane_config
{
	int64_t version;
	int64_t published_version;
	char *kafka_bootstrap_servers; /* NULL: take -X bootstrap.servers */
	char *retry_topic_prefix;
	char *dlq_topic;
	char *dlq_alert_url; /* NULL: alerts are a metric only */
	long consumer_dedupe_ttl_ms;
	destination_config *destinations;
	int n_destinations;
	char *json; /* the document it was parsed from */
} control_plane_config;

/* Parses the worker_config() document; NULL with errbuf filled when it is malformed. */
control_plane_config *config_from_json(const char *json, char *errbuf, size_t errbuf_size);
void config_free(control_plane_config *config);

/* Reads it from the database; NULL with errbuf filled on any error. */
control_plane_config *config_load_from_db(PGconn *conn, char *errbuf, size_t errbuf_size);
/* The same from another document of that shape (ingest reads ingest_config()). */
control_plane_config *config_load_document(PGconn *conn, const char *function, char *errbuf,
										   size_t errbuf_size);

/*
 * Reads it from a peer's /config (base URL such as http://10.0.0.5:9400), waiting at most
 * timeout_ms. *http_status is the peer's HTTP status, 0 when none answered.
 */
control_plane_config *config_load_from_peer(const char *base_url, const char *peer_token,
											long timeout_ms, long *http_status, char *errbuf,
											size_t errbuf_size);

const destination_config *config_find_destination(const control_plane_config *config,
												  const char *name);
bool destination_subscribes(const destination_config *destination, const char *topic);

#endif
