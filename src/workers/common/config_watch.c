/*
 * config_watch.c: load, cache and refresh the configuration (see config_watch.h).
 *
 * The current configuration is only replaced, never edited, and only from the worker's
 * own thread; the admin server's thread reads the JSON under a mutex.
 */
#include "config_watch.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "db_connect.h"
#include "log.h"
#include "peer_config.h"

#define POLL_INTERVAL_MS      30000
#define RECONNECT_INTERVAL_MS 5000
#define START_RETRY_MS        2000
#define PEER_ASK_INTERVAL_MS  5000 /* while the database is down: one peer asked this often */
#define CHECK_INTERVAL_MS     20   /* how often a worker's loop looks for a NOTIFY */

struct config_watch
{
	const worker_options *opts;
	long poll_interval_ms;       /* POLL_INTERVAL_MS shortened by --time-scale */
	int64_t waiting_for_version; /* unpublished version already logged */
	PGconn *conn;
	control_plane_config *current;
	int64_t next_poll_ms;
	int64_t next_check_ms;
	int64_t next_reconnect_ms;
	bool db_down_logged;
	peer_asker *peers;
	int64_t next_peer_ask_ms;
	pthread_mutex_t json_lock; /* guards current->json against the admin thread */
};

static bool
connect_db(config_watch *w, char *errbuf, size_t errbuf_size)
{
	PGresult *res;

	if (w->conn && PQstatus(w->conn) == CONNECTION_OK)
		return true;
	if (w->conn)
		PQfinish(w->conn);
	w->conn = db_connect(w->opts->conninfo, w->opts->role);
	if (PQstatus(w->conn) != CONNECTION_OK)
	{
		snprintf(errbuf, errbuf_size, "%s", PQerrorMessage(w->conn));
		/* libpq messages end with a newline */
		errbuf[strcspn(errbuf, "\n")] = '\0';
		PQfinish(w->conn);
		w->conn = NULL;
		return false;
	}
	res = PQexec(w->conn, "LISTEN wal_delivery_published");
	PQclear(res);
	return true;
}

static control_plane_config *
load_from_db(config_watch *w, char *errbuf, size_t errbuf_size)
{
	control_plane_config *config;

	if (!connect_db(w, errbuf, errbuf_size))
		return NULL;
	/* The ingest service reads its own document: token hashes and topics, no secrets. */
	config = config_load_document(
		w->conn, strcmp(w->opts->role, "ingest") == 0 ? "ingest_config" : "worker_config", errbuf,
		errbuf_size);
	if (config == NULL && PQstatus(w->conn) != CONNECTION_OK)
	{
		PQfinish(w->conn);
		w->conn = NULL;
	}
	return config;
}

static void
replace_current(config_watch *w, control_plane_config *config)
{
	control_plane_config *old;

	pthread_mutex_lock(&w->json_lock);
	old = w->current;
	w->current = config;
	pthread_mutex_unlock(&w->json_lock);
	config_free(old);
}

config_watch *
config_watch_start(const worker_options *opts, volatile sig_atomic_t *stop)
{
	config_watch *w = calloc(1, sizeof(*w));
	char errbuf[1024];

	w->opts = opts;
	w->peers = peer_asker_new(opts);
	w->poll_interval_ms = (long) (POLL_INTERVAL_MS / opts->time_scale);
	pthread_mutex_init(&w->json_lock, NULL);
	while (!*stop)
	{
		control_plane_config *config = load_from_db(w, errbuf, sizeof(errbuf));

		if (config == NULL)
			config = peer_config_at_start(w->peers, errbuf);
		if (config)
		{
			if (config->version != config->published_version)
				log_warn("event=config_unpublished version=%" PRId64 " published=%" PRId64
						 " msg=\"starting with a version Kafka may not match yet\"",
						 config->version, config->published_version);
			w->current = config;
			w->next_poll_ms = now_ms() + w->poll_interval_ms;
			w->next_peer_ask_ms = now_ms() + PEER_ASK_INTERVAL_MS;
			return w;
		}
		log_error("event=no_config error=\"%s\" peers=%d msg=\"no configuration yet: not from the "
				  "database (see error) and no peer answered; retrying in %d ms\"",
				  errbuf, opts->n_peers, START_RETRY_MS);
		for (int waited = 0; waited < START_RETRY_MS && !*stop; waited += 100)
			usleep(100 * 1000);
	}
	config_watch_stop(w);
	return NULL;
}

const control_plane_config *
config_watch_current(const config_watch *w)
{
	return w->current;
}

/* While the database is down: move up to a peer's newer version (peer_config.h). */
static bool
newer_from_peer(config_watch *w, int64_t now)
{
	control_plane_config *config;

	if (now < w->next_peer_ask_ms)
		return false;
	w->next_peer_ask_ms = now + PEER_ASK_INTERVAL_MS;
	config = peer_config_newer(w->peers, w->current->version);
	if (config == NULL)
		return false;
	replace_current(w, config);
	return true;
}

/* True when a notification on wal_delivery_published arrived. */
static bool
notified(config_watch *w)
{
	PGnotify *n;
	bool any = false;

	if (w->conn == NULL || !PQconsumeInput(w->conn))
		return false;
	while ((n = PQnotifies(w->conn)) != NULL)
	{
		any = true;
		PQfreemem(n);
	}
	return any;
}

bool
config_watch_poll(config_watch *w)
{
	char errbuf[1024];
	control_plane_config *config;
	int64_t now = now_ms();

	if (now < w->next_check_ms)
		return false;
	w->next_check_ms = now + CHECK_INTERVAL_MS;
	if (w->conn == NULL || PQstatus(w->conn) != CONNECTION_OK)
	{
		if (now < w->next_reconnect_ms)
			return false;
		w->next_reconnect_ms = now + RECONNECT_INTERVAL_MS;
		if (!connect_db(w, errbuf, sizeof(errbuf)))
		{
			if (!w->db_down_logged)
				log_warn("event=db_unreachable error=\"%s\" msg=\"keeping config version %" PRId64
						 "; retrying every %d ms\"",
						 errbuf, w->current->version, RECONNECT_INTERVAL_MS);
			w->db_down_logged = true;
			return newer_from_peer(w, now);
		}
		log_info("event=db_reachable msg=\"reloading config\"");
		w->db_down_logged = false;
		w->next_poll_ms = 0;
	}
	if (!notified(w) && now < w->next_poll_ms)
		return false;
	w->next_poll_ms = now + w->poll_interval_ms;
	config = load_from_db(w, errbuf, sizeof(errbuf));
	if (config == NULL)
	{
		log_warn("event=config_reload_failed error=\"%s\" msg=\"keeping version %" PRId64 "\"",
				 errbuf, w->current->version);
		return false;
	}
	if (config->version == w->current->version &&
		config->published_version == w->current->published_version)
	{
		config_free(config);
		return false;
	}
	if (config->version != config->published_version)
	{
		/* Workers follow published versions only: Kafka must match the config first. */
		if (w->waiting_for_version != config->version)
			log_info("event=config_waiting version=%" PRId64 " published=%" PRId64
					 " msg=\"keeping version %" PRId64 " until the reconciler publishes\"",
					 config->version, config->published_version, w->current->version);
		w->waiting_for_version = config->version;
		config_free(config);
		return false;
	}
	log_info("event=config_changed from=%" PRId64 " to=%" PRId64 " published=%" PRId64,
			 w->current->version, config->version, config->published_version);
	replace_current(w, config);
	return true;
}

char *
config_watch_json_for_peers(config_watch *w)
{
	json_t *root;
	json_t *destinations;
	json_t *d;
	size_t i;
	char *out;

	pthread_mutex_lock(&w->json_lock);
	root = w->current ? json_loads(w->current->json, 0, NULL) : NULL;
	pthread_mutex_unlock(&w->json_lock);
	if (root == NULL)
		return NULL;
	destinations = json_object_get(root, "destinations");
	json_array_foreach(destinations, i, d)
	{
		if (json_is_string(json_object_get(d, "signing_secret")))
			json_object_set_new(d, "signing_secret", json_string("redacted"));
	}
	out = json_dumps(root, JSON_COMPACT);
	json_decref(root);
	return out;
}

void
config_watch_stop(config_watch *w)
{
	if (w == NULL)
		return;
	if (w->conn)
		PQfinish(w->conn);
	config_free(w->current);
	peer_asker_free(w->peers);
	pthread_mutex_destroy(&w->json_lock);
	free(w);
}
