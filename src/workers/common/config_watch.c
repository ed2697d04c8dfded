/*
 * config_watch.c: load, cache and refresh the configuration (see config_watch.h).
 *
 * Everything that waits on the database or a peer (a connect, the LISTEN, a reload that
 * a DBA's lock holds up, a peer's answer) happens on a watcher thread of its own, so a
 * worker's loop never stops delivering for it. The watcher hands each new configuration
 * over through one slot; the worker's thread takes it in config_watch_poll and is the
 * only one to replace (never edit) the current configuration. The admin server's thread
 * reads the current JSON under a mutex.
 */
#include "config_watch.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "db_connect.h"
#include "log.h"
#include "peer_config.h"

#define POLL_INTERVAL_MS      30000
#define RECONNECT_INTERVAL_MS 5000
#define START_RETRY_MS        2000
#define PEER_ASK_INTERVAL_MS  5000 /* while the database is down: one peer asked this often */
#define NAP_MS                100  /* how often the watcher looks at its stop flag */
/* What a stop waits for the watcher (a connect's timeout is 5 s, a peer's ask 2 s). */
#define STOP_WAIT_MS 8000

struct config_watch
{
	const worker_options *opts;
	long poll_interval_ms; /* POLL_INTERVAL_MS shortened by --time-scale */
	control_plane_config *current;
	pthread_mutex_t json_lock; /* guards current against the admin thread */

	/* The watcher thread's own, once it runs. */
	pthread_t watcher;
	bool watcher_started;
	PGconn *conn;
	int64_t known_version; /* of the latest configuration handed over */
	int64_t known_published;
	int64_t waiting_for_version; /* unpublished version already logged */
	int64_t next_poll_ms;
	int64_t next_reconnect_ms;
	int64_t next_peer_ask_ms;
	bool db_down_logged;
	peer_asker *peers;

	/* From the watcher to the worker's thread. */
	pthread_mutex_t handoff_lock;
	control_plane_config *pending; /* a newer configuration not taken yet */
	atomic_bool has_pending;
	atomic_bool stopping;
	bool watcher_done; /* under handoff_lock */
	pthread_cond_t watcher_exited;
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

/* The watcher's: a newer configuration for the worker's thread to take. */
static void
hand_over(config_watch *w, control_plane_config *config)
{
	control_plane_config *superseded;

	pthread_mutex_lock(&w->handoff_lock);
	superseded = w->pending;
	w->pending = config;
	w->known_version = config->version;
	w->known_published = config->published_version;
	atomic_store(&w->has_pending, true);
	pthread_mutex_unlock(&w->handoff_lock);
	config_free(superseded);
}

/* Sleeps up to ms, less when a stop is asked for. */
static void
nap(config_watch *w, long ms)
{
	for (long slept = 0; slept < ms && !atomic_load(&w->stopping); slept += NAP_MS)
		usleep((useconds_t) (ms - slept < NAP_MS ? ms - slept : NAP_MS) * 1000);
}

/* While the database is down: move up to a peer's newer version (peer_config.h). */
static void
newer_from_peer(config_watch *w, int64_t now)
{
	control_plane_config *config;

	if (now < w->next_peer_ask_ms)
		return;
	w->next_peer_ask_ms = now + PEER_ASK_INTERVAL_MS;
	config = peer_config_newer(w->peers, w->known_version);
	if (config != NULL)
		hand_over(w, config);
}

/* Database down: reconnect every RECONNECT_INTERVAL_MS, and ask peers meanwhile. */
static void
watch_without_db(config_watch *w)
{
	char errbuf[1024];
	int64_t now = now_ms();

	if (now >= w->next_reconnect_ms)
	{
		w->next_reconnect_ms = now + RECONNECT_INTERVAL_MS;
		if (connect_db(w, errbuf, sizeof(errbuf)))
		{
			log_info("event=db_reachable msg=\"reloading config\"");
			w->db_down_logged = false;
			w->next_poll_ms = 0;
			return;
		}
		if (!w->db_down_logged)
			log_warn("event=db_unreachable error=\"%s\" msg=\"keeping config version %" PRId64
					 "; retrying every %d ms\"",
					 errbuf, w->known_version, RECONNECT_INTERVAL_MS);
		w->db_down_logged = true;
		newer_from_peer(w, now_ms());
	}
	nap(w, NAP_MS);
}

/*
 * True when a notification on wal_delivery_published arrived within timeout_ms. A
 * broken connection is closed (the watcher reconnects).
 */
static bool
wait_for_notify(config_watch *w, long timeout_ms)
{
	struct pollfd pfd = {.fd = PQsocket(w->conn), .events = POLLIN};
	PGnotify *n;
	bool any = false;

	if (pfd.fd >= 0 && poll(&pfd, 1, (int) timeout_ms) < 0 && errno != EINTR)
		log_warn("event=config_watch_poll_failed error=\"%s\"", strerror(errno));
	if (!PQconsumeInput(w->conn))
	{
		PQfinish(w->conn);
		w->conn = NULL;
		return false;
	}
	while ((n = PQnotifies(w->conn)) != NULL)
	{
		any = true;
		PQfreemem(n);
	}
	return any;
}

/* One reload: a published version other than the one the worker has is handed over. */
static void
reload(config_watch *w)
{
	char errbuf[1024];
	control_plane_config *config;

	w->next_poll_ms = now_ms() + w->poll_interval_ms;
	config = load_from_db(w, errbuf, sizeof(errbuf));
	if (config == NULL)
	{
		log_warn("event=config_reload_failed error=\"%s\" msg=\"keeping version %" PRId64 "\"",
				 errbuf, w->known_version);
		return;
	}
	if (config->version == w->known_version && config->published_version == w->known_published)
	{
		config_free(config);
		return;
	}
	if (config->version != config->published_version)
	{
		/* Workers follow published versions only: Kafka must match the config first. */
		if (w->waiting_for_version != config->version)
			log_info("event=config_waiting version=%" PRId64 " published=%" PRId64
					 " msg=\"keeping version %" PRId64 " until the reconciler publishes\"",
					 config->version, config->published_version, w->known_version);
		w->waiting_for_version = config->version;
		config_free(config);
		return;
	}
	hand_over(w, config);
}

static void *
watch(void *arg)
{
	config_watch *w = arg;

	while (!atomic_load(&w->stopping))
	{
		long until_poll;

		if (w->conn == NULL || PQstatus(w->conn) != CONNECTION_OK)
		{
			watch_without_db(w);
			continue;
		}
		/* A NOTIFY reloads at once; the poll catches one that was missed. */
		until_poll = (long) (w->next_poll_ms - now_ms());
		if (until_poll < 0)
			until_poll = 0;
		if (wait_for_notify(w, until_poll < NAP_MS ? until_poll : NAP_MS) ||
			(w->conn != NULL && now_ms() >= w->next_poll_ms))
			reload(w);
	}
	pthread_mutex_lock(&w->handoff_lock);
	w->watcher_done = true;
	pthread_cond_signal(&w->watcher_exited);
	pthread_mutex_unlock(&w->handoff_lock);
	return NULL;
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
	pthread_mutex_init(&w->handoff_lock, NULL);
	pthread_cond_init(&w->watcher_exited, NULL);
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
			w->known_version = config->version;
			w->known_published = config->published_version;
			w->next_poll_ms = now_ms() + w->poll_interval_ms;
			w->next_peer_ask_ms = now_ms() + PEER_ASK_INTERVAL_MS;
			w->next_reconnect_ms = now_ms() + RECONNECT_INTERVAL_MS;
			w->watcher_started = pthread_create(&w->watcher, NULL, watch, w) == 0;
			if (!w->watcher_started)
				log_error("event=config_watch_not_started msg=\"cannot start the config "
						  "watcher thread: keeping version %" PRId64 " for this run\"",
						  config->version);
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

bool
config_watch_poll(config_watch *w)
{
	control_plane_config *config;

	if (!atomic_load(&w->has_pending))
		return false;
	pthread_mutex_lock(&w->handoff_lock);
	config = w->pending;
	w->pending = NULL;
	atomic_store(&w->has_pending, false);
	pthread_mutex_unlock(&w->handoff_lock);
	if (config == NULL)
		return false;
	/* Logged here, not when the watcher loaded it: what is taken after this line uses it. */
	log_info("event=config_changed from=%" PRId64 " to=%" PRId64 " published=%" PRId64,
			 w->current ? w->current->version : 0, config->version, config->published_version);
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

/*
 * Waits up to STOP_WAIT_MS for the watcher (it may be in a connect or a peer's ask). One
 * that does not end by then is left to the process's exit, with what it uses.
 */
static bool
stop_watcher(config_watch *w)
{
	struct timespec until;
	bool done;

	if (!w->watcher_started)
		return true;
	atomic_store(&w->stopping, true);
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += STOP_WAIT_MS / 1000;
	pthread_mutex_lock(&w->handoff_lock);
	while (!w->watcher_done &&
		   pthread_cond_timedwait(&w->watcher_exited, &w->handoff_lock, &until) == 0)
		;
	done = w->watcher_done;
	pthread_mutex_unlock(&w->handoff_lock);
	if (!done)
	{
		log_warn("event=config_watch_stop_late msg=\"the config watcher is still waiting on "
				 "the database or a peer; leaving it to the exit\"");
		return false;
	}
	pthread_join(w->watcher, NULL);
	return true;
}

void
config_watch_stop(config_watch *w)
{
	if (w == NULL || !stop_watcher(w))
		return;
	if (w->conn)
		PQfinish(w->conn);
	config_free(w->pending);
	config_free(w->current);
	peer_asker_free(w->peers);
	pthread_cond_destroy(&w->watcher_exited);
	pthread_mutex_destroy(&w->handoff_lock);
	pthread_mutex_destroy(&w->json_lock);
	free(w);
}
