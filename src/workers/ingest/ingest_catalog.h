/*
 * ingest_catalog.h: what the ingest service knows from its configuration
 * (wal_delivery.ingest_config()): each topic's acks, record limit and whether it needs
 * processing, and the live tokens (SHA-256 only) with the topics each may write.
 *
 * The current catalog is replaced whole when a new configuration is published; request
 * threads hold a reference for as long as a request runs, so a swap never frees what one
 * of them reads.
 */
#ifndef WAL_INGEST_CATALOG_H
#define WAL_INGEST_CATALOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ingest_topic
{
	char *name;
	int acks;
	int record_limit;
	bool needs_processing;
	bool writable; /* the login may write it (topics.writers); if not, the outbox refuses it */
} ingest_topic;

typedef struct ingest_token
{
	char *name;
	unsigned char sha256[32];
	bool all_topics;
	int n_topics;
	char **topics;
} ingest_token;

typedef struct ingest_catalog
{
	int64_t version;
	int n_topics;
	ingest_topic *topics;
	int n_tokens;
	ingest_token *tokens;
	int refs;
} ingest_catalog;

/* NULL with errbuf filled when the document lacks topics or tokens. */
ingest_catalog *ingest_catalog_parse(const char *json, int64_t version, char *errbuf,
									 size_t errbuf_size);

/* Makes catalog the current one (taking the caller's reference). */
void ingest_catalog_install(ingest_catalog *catalog);
/* The current catalog with a reference the caller releases; NULL before the first. */
ingest_catalog *ingest_catalog_acquire(void);
void ingest_catalog_release(ingest_catalog *catalog);

const ingest_topic *ingest_catalog_topic(const ingest_catalog *catalog, const char *name);

/* The token whose SHA-256 the bearer token has, or NULL. */
const ingest_token *ingest_catalog_token(const ingest_catalog *catalog, const char *bearer);
bool ingest_token_allows(const ingest_token *token, const char *topic);

#endif
