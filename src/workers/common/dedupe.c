/*
 * dedupe.c: a bounded TTL set (see dedupe.h). Open hashing for look-ups and a FIFO ring
 * of insertion order for eviction: the oldest entry goes first, whether it expired or the
 * set is full, so memory never grows past max_entries.
 */
#include "dedupe.h"

#include <stdlib.h>
#include <string.h>

typedef struct dedupe_entry
{
	char *pair; /* "key\x1fdestination" */
	uint64_t hash;
	int64_t expires_ms;
	struct dedupe_entry *next_in_bucket;
} dedupe_entry;

struct dedupe_set
{
	size_t max_entries;
	long ttl_ms;
	size_t n_buckets;
	dedupe_entry **buckets;
	dedupe_entry **ring; /* insertion order */
	size_t ring_head;    /* oldest */
	size_t count;
};

/* FNV-1a over "key\x1fdestination", computed without building that string. */
static uint64_t
hash_pair(const char *key, const char *destination)
{
	uint64_t h = 1469598103934665603ULL;

	for (const char *s = key; *s; s++)
		h = (h ^ (unsigned char) *s) * 1099511628211ULL;
	h = (h ^ 0x1f) * 1099511628211ULL;
	for (const char *s = destination; *s; s++)
		h = (h ^ (unsigned char) *s) * 1099511628211ULL;
	return h;
}

static bool
pair_equals(const char *pair, const char *key, const char *destination)
{
	size_t kl = strlen(key);

	return strncmp(pair, key, kl) == 0 && pair[kl] == '\x1f' &&
		   strcmp(pair + kl + 1, destination) == 0;
}

static char *
make_pair(const char *key, const char *destination)
{
	size_t kl = strlen(key), dl = strlen(destination);
	char *pair = malloc(kl + dl + 2);

	memcpy(pair, key, kl);
	pair[kl] = '\x1f';
	memcpy(pair + kl + 1, destination, dl + 1);
	return pair;
}

dedupe_set *
dedupe_new(size_t max_entries, long ttl_ms)
{
	dedupe_set *set = calloc(1, sizeof(*set));

	set->max_entries = max_entries > 0 ? max_entries : 1;
	set->ttl_ms = ttl_ms;
	set->n_buckets = set->max_entries * 2 + 1;
	set->buckets = calloc(set->n_buckets, sizeof(dedupe_entry *));
	set->ring = calloc(set->max_entries, sizeof(dedupe_entry *));
	return set;
}

void
dedupe_set_ttl(dedupe_set *set, long ttl_ms)
{
	set->ttl_ms = ttl_ms;
}

static void
unlink_entry(dedupe_set *set, dedupe_entry *e)
{
	dedupe_entry **p = &set->buckets[e->hash % set->n_buckets];

	while (*p != e)
		p = &(*p)->next_in_bucket;
	*p = e->next_in_bucket;
	free(e->pair);
	free(e);
}

static void
evict_oldest(dedupe_set *set)
{
	dedupe_entry *oldest = set->ring[set->ring_head];

	set->ring[set->ring_head] = NULL;
	set->ring_head = (set->ring_head + 1) % set->max_entries;
	set->count--;
	unlink_entry(set, oldest);
}

static void
evict_expired(dedupe_set *set, int64_t now_ms)
{
	while (set->count > 0 && set->ring[set->ring_head]->expires_ms <= now_ms)
		evict_oldest(set);
}

/* The hot path: no allocation, one hash, one bucket walk. */
bool
dedupe_seen(dedupe_set *set, const char *key, const char *destination, int64_t now_ms)
{
	uint64_t h = hash_pair(key, destination);

	evict_expired(set, now_ms);
	for (dedupe_entry *e = set->buckets[h % set->n_buckets]; e; e = e->next_in_bucket)
		if (e->hash == h && pair_equals(e->pair, key, destination))
			return true;
	return false;
}

void
dedupe_remember(dedupe_set *set, const char *key, const char *destination, int64_t now_ms)
{
	dedupe_entry *e;
	size_t slot;

	if (set->ttl_ms <= 0 || dedupe_seen(set, key, destination, now_ms))
		return;
	if (set->count == set->max_entries)
		evict_oldest(set);
	e = calloc(1, sizeof(*e));
	e->pair = make_pair(key, destination);
	e->hash = hash_pair(key, destination);
	e->expires_ms = now_ms + set->ttl_ms;
	e->next_in_bucket = set->buckets[e->hash % set->n_buckets];
	set->buckets[e->hash % set->n_buckets] = e;
	slot = (set->ring_head + set->count) % set->max_entries;
	set->ring[slot] = e;
	set->count++;
}

size_t
dedupe_size(const dedupe_set *set)
{
	return set->count;
}

void
dedupe_free(dedupe_set *set)
{
	while (set->count > 0)
		evict_oldest(set);
	free(set->buckets);
	free(set->ring);
	free(set);
}
