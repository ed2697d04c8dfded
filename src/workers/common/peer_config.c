/*
 * peer_config.c: ask peers for their config and keep the newest (see peer_config.h).
 */
#include "peer_config.h"

#include <inttypes.h>
#include <stdlib.h>

#include "log.h"
#include "metrics.h"

#define START_ASK_TIMEOUT_MS 5000
/* Asked from a role's loop: an unanswering peer must not stall delivery for long. */
#define RUNNING_ASK_TIMEOUT_MS 2000

struct peer_asker
{
	const worker_options *opts;
	const char *token;
	metric *asks;
	int next_peer;                /* the peer peer_config_newer asks next */
	int64_t last_ignored_version; /* an older version already logged */
	int last_ignored_peer;
};

peer_asker *
peer_asker_new(const worker_options *opts)
{
	static const char *const labels[] = {"peer", "outcome"};
	peer_asker *a = calloc(1, sizeof(*a));

	a->opts = opts;
	a->token = getenv("WAL_PEER_TOKEN");
	a->asks = metric_counter("wal_peer_config_total",
							 "Asks for a peer's config while the database is unreachable, by "
							 "outcome (loaded, same, older, unpublished, refused, failed).",
							 2, labels);
	a->last_ignored_version = -1;
	a->last_ignored_peer = -1;
	return a;
}

void
peer_asker_free(peer_asker *a)
{
	free(a);
}

static void
count(peer_asker *a, int peer, const char *outcome)
{
	metric_add(a->asks, 1, (const char *const[]){a->opts->peers[peer], outcome});
}

/* One ask; NULL (logged and counted) when the peer gave no usable config. */
static control_plane_config *
ask(peer_asker *a, int peer, long timeout_ms)
{
	char err[1024];
	long status = 0;
	const char *url = a->opts->peers[peer];
	control_plane_config *config =
		config_load_from_peer(url, a->token, timeout_ms, &status, err, sizeof(err));

	if (config)
		return config;
	if (status == 401 || status == 403)
	{
		count(a, peer, "refused");
		log_warn("event=peer_refused peer=%s status=%ld error=\"%s\" msg=\"the peer wants the "
				 "fleet's WAL_PEER_TOKEN as a bearer token; set it on this worker\"",
				 url, status, err);
	}
	else
	{
		count(a, peer, "failed");
		log_warn("event=peer_failed peer=%s error=\"%s\"", url, err);
	}
	return NULL;
}

static void
ignore_older(peer_asker *a, int peer, const control_plane_config *older, int64_t kept)
{
	count(a, peer, "older");
	/* Logged once per peer and version: a peer left behind answers the same every time. */
	if (older->version != a->last_ignored_version || peer != a->last_ignored_peer)
		log_info("event=peer_config_older peer=%s version=%" PRId64 " current=%" PRId64
				 " msg=\"ignored: a worker never moves back to an older version\"",
				 a->opts->peers[peer], older->version, kept);
	a->last_ignored_version = older->version;
	a->last_ignored_peer = peer;
}

control_plane_config *
peer_config_at_start(peer_asker *a, const char *why_db)
{
	control_plane_config *best = NULL;
	int best_peer = -1;
	int answers = 0;

	for (int p = 0; p < a->opts->n_peers; p++)
	{
		for (int i = 0; i < PEER_ASKS_AT_START; i++)
		{
			control_plane_config *config = ask(a, p, START_ASK_TIMEOUT_MS);

			if (config == NULL)
				break; /* a peer that failed once is not asked again this round */
			answers++;
			if (best == NULL || config->version > best->version)
			{
				if (best)
					ignore_older(a, best_peer, best, config->version);
				config_free(best);
				best = config;
				best_peer = p;
			}
			else
			{
				if (config->version < best->version)
					ignore_older(a, p, config, best->version);
				else
					count(a, p, "same");
				config_free(config);
			}
		}
	}
	if (best)
	{
		count(a, best_peer, "loaded");
		log_warn("event=config_from_peer peer=%s version=%" PRId64 " published=%" PRId64
				 " answers=%d db_error=\"%s\" msg=\"database unreachable; using the newest "
				 "config the peers hold\"",
				 a->opts->peers[best_peer], best->version, best->published_version, answers,
				 why_db);
	}
	return best;
}

control_plane_config *
peer_config_newer(peer_asker *a, int64_t current_version)
{
	int p;
	control_plane_config *config;

	if (a->opts->n_peers == 0)
		return NULL;
	p = a->next_peer;
	a->next_peer = (p + 1) % a->opts->n_peers;
	config = ask(a, p, RUNNING_ASK_TIMEOUT_MS);
	if (config == NULL)
		return NULL;
	/* A running worker follows published versions only, from peers as from the database. */
	if (config->version < current_version)
		ignore_older(a, p, config, current_version);
	else if (config->version == current_version)
		count(a, p, "same");
	else if (config->version != config->published_version)
		count(a, p, "unpublished");
	if (config->version <= current_version || config->version != config->published_version)
	{
		config_free(config);
		return NULL;
	}
	count(a, p, "loaded");
	log_warn("event=config_from_peer peer=%s version=%" PRId64 " published=%" PRId64
			 " from=%" PRId64 " msg=\"database still unreachable; a peer holds a newer config\"",
			 a->opts->peers[p], config->version, config->published_version, current_version);
	return config;
}
