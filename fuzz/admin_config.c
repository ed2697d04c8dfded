/*
 * admin_config.c (fuzz target): config_from_json (src/workers/common/control_plane.c),
 * which parses the configuration document a worker reads from a peer's admin port
 * (/config, config_load_from_peer) when the database is down, and from the database.
 *
 * Input: the body a peer answered (config_load_from_peer hands it on as a C string, so
 * it ends at its first NUL).
 *
 * Invariants: a refused document leaves an error message; an accepted one has its
 * retry topic prefix and DLQ topic, destinations with a name, an endpoint, a method,
 * header object, a timeout and max_in_flight above 0, every destination findable by its
 * name, the document kept as it came, and parsing that kept copy gives the same.
 */
#define _GNU_SOURCE
#include <jansson.h>

#include "common/control_plane.h"
#include "fuzz_util.h"

static void
check_config(const control_plane_config *c, const char *text)
{
	FUZZ_CHECK(c->retry_topic_prefix != NULL && c->dlq_topic != NULL);
	FUZZ_CHECK(c->json != NULL && strcmp(c->json, text) == 0);
	FUZZ_CHECK(c->n_destinations >= 0);
	FUZZ_CHECK(c->n_destinations == 0 || c->destinations != NULL);
	for (int i = 0; i < c->n_destinations; i++)
	{
		const destination_config *d = &c->destinations[i];
		const destination_config *found = config_find_destination(c, d->name);

		FUZZ_CHECK(d->name != NULL && d->endpoint != NULL && d->method != NULL);
		FUZZ_CHECK(json_is_object(d->headers));
		FUZZ_CHECK(d->timeout_ms > 0 && d->max_in_flight > 0);
		FUZZ_CHECK(d->n_transient_statuses >= 0 && d->n_topics >= 0);
		for (int s = 0; s < d->n_transient_statuses; s++)
			FUZZ_CHECK(d->transient_statuses[s] != NULL);
		/* The first destination of that name. */
		FUZZ_CHECK(found != NULL && found <= d && strcmp(found->name, d->name) == 0);
		for (int t = 0; t < d->n_topics; t++)
			FUZZ_CHECK(d->topics[t] != NULL && destination_subscribes(d, d->topics[t]));
		FUZZ_CHECK(d->secret_unavailable ==
				   (d->signing_secret != NULL && strcmp(d->signing_secret, "redacted") == 0));
	}
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = malloc(size + 1);
	char errbuf[512];
	control_plane_config *config, *again;

	memcpy(text, data, size);
	text[size] = '\0';
	memset(errbuf, 0, sizeof(errbuf));
	config = config_from_json(text, errbuf, sizeof(errbuf));
	if (config == NULL)
	{
		FUZZ_CHECK(fuzz_terminated(errbuf, sizeof(errbuf)) && errbuf[0] != '\0');
		free(text);
		return 0;
	}
	check_config(config, text);
	/* What a worker keeps is what it serves to its peers: the same document again. */
	again = config_from_json(config->json, errbuf, sizeof(errbuf));
	FUZZ_CHECK(again != NULL);
	FUZZ_CHECK(again->version == config->version &&
			   again->n_destinations == config->n_destinations);
	config_free(again);
	config_free(config);
	free(text);
	return 0;
}
