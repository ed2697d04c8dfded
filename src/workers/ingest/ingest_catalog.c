/*
 * ingest_catalog.c: the ingest service's topics and tokens (see ingest_catalog.h).
 */
#include "ingest_catalog.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <openssl/evp.h>
#include <openssl/sha.h>

#include "common/log.h"

static pthread_mutex_t current_lock = PTHREAD_MUTEX_INITIALIZER;
static ingest_catalog *current;
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;
static EVP_MD *sha256; /* NULL: SHA256() then */

static void
fetch_sha256(void)
{
	sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
}

static char *
must_strdup(const char *s)
{
	char *copy = strdup(s);

	if (copy == NULL)
		fatal("event=out_of_memory what=ingest_catalog");
	return copy;
}

static void
catalog_free(ingest_catalog *c)
{
	for (int i = 0; i < c->n_topics; i++)
		free(c->topics[i].name);
	for (int i = 0; i < c->n_tokens; i++)
	{
		free(c->tokens[i].name);
		for (int j = 0; j < c->tokens[i].n_topics; j++)
			free(c->tokens[i].topics[j]);
		free(c->tokens[i].topics);
	}
	free(c->topics);
	free(c->tokens);
	free(c);
}

static bool
parse_hex32(const char *hex, unsigned char *out)
{
	if (hex == NULL || strlen(hex) != 64)
		return false;
	for (int i = 0; i < 32; i++)
	{
		unsigned int byte;

		if (sscanf(hex + 2 * i, "%2x", &byte) != 1)
			return false;
		out[i] = (unsigned char) byte;
	}
	return true;
}

static void
parse_token(json_t *obj, ingest_token *t)
{
	json_t *topics = json_object_get(obj, "topics");
	size_t i;
	json_t *item;

	t->name = must_strdup(json_string_value(json_object_get(obj, "name")));
	t->topics = calloc(json_array_size(topics) + 1, sizeof(char *));
	json_array_foreach(topics, i, item)
	{
		const char *name = json_string_value(item);

		if (name == NULL)
			continue;
		if (strcmp(name, "*") == 0)
			t->all_topics = true;
		else
			t->topics[t->n_topics++] = must_strdup(name);
	}
}

ingest_catalog *
ingest_catalog_parse(const char *json, int64_t version, char *errbuf, size_t errbuf_size)
{
	json_t *root = json_loads(json, 0, NULL);
	json_t *topics = json_object_get(root, "topics");
	json_t *tokens = json_object_get(root, "tokens");
	ingest_catalog *c;
	size_t i;
	json_t *item;

	if (!json_is_array(topics) || !json_is_array(tokens))
	{
		snprintf(errbuf, errbuf_size,
				 "the config has no topics or tokens: it is not wal_delivery.ingest_config()'s");
		json_decref(root);
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	c->version = version;
	c->refs = 1;
	c->topics = calloc(json_array_size(topics) + 1, sizeof(ingest_topic));
	c->tokens = calloc(json_array_size(tokens) + 1, sizeof(ingest_token));
	json_array_foreach(topics, i, item)
	{
		const char *name = json_string_value(json_object_get(item, "name"));
		ingest_topic *t = &c->topics[c->n_topics];

		if (name == NULL)
			continue;
		t->name = must_strdup(name);
		t->acks = (int) json_integer_value(json_object_get(item, "acks"));
		t->record_limit = (int) json_integer_value(json_object_get(item, "record_limit"));
		t->needs_processing = json_is_true(json_object_get(item, "needs_processing"));
		t->writable = !json_is_false(json_object_get(item, "writable"));
		c->n_topics++;
	}
	json_array_foreach(tokens, i, item)
	{
		ingest_token *t = &c->tokens[c->n_tokens];

		if (!json_is_string(json_object_get(item, "name")) ||
			!parse_hex32(json_string_value(json_object_get(item, "sha256")), t->sha256))
			continue;
		parse_token(item, t);
		c->n_tokens++;
	}
	json_decref(root);
	return c;
}

void
ingest_catalog_install(ingest_catalog *catalog)
{
	ingest_catalog *old;

	pthread_mutex_lock(&current_lock);
	old = current;
	current = catalog;
	pthread_mutex_unlock(&current_lock);
	ingest_catalog_release(old);
}

ingest_catalog *
ingest_catalog_acquire(void)
{
	ingest_catalog *c;

	pthread_mutex_lock(&current_lock);
	c = current;
	if (c)
		c->refs++;
	pthread_mutex_unlock(&current_lock);
	return c;
}

void
ingest_catalog_release(ingest_catalog *catalog)
{
	bool last;

	if (catalog == NULL)
		return;
	pthread_mutex_lock(&current_lock);
	last = --catalog->refs == 0;
	pthread_mutex_unlock(&current_lock);
	if (last)
		catalog_free(catalog);
}

const ingest_topic *
ingest_catalog_topic(const ingest_catalog *catalog, const char *name)
{
	for (int i = 0; i < catalog->n_topics; i++)
		if (strcmp(catalog->topics[i].name, name) == 0)
			return &catalog->topics[i];
	return NULL;
}

const ingest_token *
ingest_catalog_token(const ingest_catalog *catalog, const char *bearer)
{
	unsigned char digest[SHA256_DIGEST_LENGTH];

	/* With the digest fetched once: SHA256() looks it up again on every call. */
	pthread_once(&sha256_once, fetch_sha256);
	if (sha256 == NULL || !EVP_Digest(bearer, strlen(bearer), digest, NULL, sha256, NULL))
		SHA256((const unsigned char *) bearer, strlen(bearer), digest);
	for (int i = 0; i < catalog->n_tokens; i++)
		if (memcmp(catalog->tokens[i].sha256, digest, sizeof(digest)) == 0)
			return &catalog->tokens[i];
	return NULL;
}

bool
ingest_token_allows(const ingest_token *token, const char *topic)
{
	if (token->all_topics)
		return true;
	for (int i = 0; i < token->n_topics; i++)
		if (strcmp(token->topics[i], topic) == 0)
			return true;
	return false;
}
