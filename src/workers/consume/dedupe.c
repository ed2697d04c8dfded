/*
 * dedupe.c: a bounded TTL set (see dedupe.h) whose memory is all allocated, and touched,
 * when it is created: max_entries slots used as a ring in insertion order (the oldest goes
 * first, whether it expired or the set is full) plus a chained hash index of slot numbers.
 * A pair is kept as two independent 64-bit hashes, not as its text: a false "seen" needs
 * a 128-bit collision, and nothing is allocated per delivery. Memory: about 40 bytes per
 * entry whether the set is empty or full, so a worker's footprint does not grow with the
 * backlog it drains.
 */
#include "consume/dedupe.h"

#include <stdlib.h>
#include <string.h>

#define NO_SLOT UINT32_MAX

typedef struct dedupe_slot
{
	uint64_t h1, h2;
	int64_t expires_ms;
	uint32_t next_in_bucket; /* NO_SLOT ends the chain */
} dedupe_slot;

struct dedupe_set
{
	uint32_t max_entries;
	long ttl_ms;
	uint32_t bucket_mask; /* buckets: a power of two >= 2 x max_entries */
	uint32_t *buckets;
	dedupe_slot *slots; /* the ring, in insertion order */
	uint32_t head;      /* oldest */
	uint32_t count;
};

/* FNV-1a (h1) and a differently seeded multiply-xorshift (h2) over "key\x1fdestination\x1f",
 * in two steps so a record's key is hashed once for all its destinations. */
static void
hash_part(uint64_t *a, uint64_t *b, const char *part)
{
	for (const unsigned char *s = (const unsigned char *) part; *s; s++)
	{
		*a = (*a ^ *s) * 1099511628211ULL;
		*b = (*b ^ *s) * 0xff51afd7ed558ccdULL;
		*b ^= *b >> 29;
	}
	*a = (*a ^ 0x1f) * 1099511628211ULL;
	*b = (*b ^ 0x1f) * 0xc4ceb9fe1a85ec53ULL;
}

dedupe_key_hash
dedupe_hash_key(const char *key)
{
	dedupe_key_hash k = {1469598103934665603ULL, 0x9e3779b97f4a7c15ULL};

	hash_part(&k.a, &k.b, key);
	return k;
}

dedupe_key_hash
dedupe_hash_record(const char *topic, const char *key)
{
	dedupe_key_hash k = {1469598103934665603ULL, 0x9e3779b97f4a7c15ULL};

	/* Keys are unique per topic only: the topic is part of what identifies a record. */
	hash_part(&k.a, &k.b, topic);
	hash_part(&k.a, &k.b, key);
	return k;
}

dedupe_pair
dedupe_hash_pair(dedupe_key_hash key, const char *destination)
{
	hash_part(&key.a, &key.b, destination);
	return (dedupe_pair){key.a, key.b ^ (key.b >> 32)};
}

dedupe_set *
dedupe_new(size_t max_entries, long ttl_ms)
{
	dedupe_set *set = calloc(1, sizeof(*set));
	uint32_t n_buckets = 2;

	set->max_entries = max_entries > 0 && max_entries < UINT32_MAX / 4 ? (uint32_t) max_entries : 1;
	set->ttl_ms = ttl_ms;
	while (n_buckets < set->max_entries * 2)
		n_buckets *= 2;
	set->bucket_mask = n_buckets - 1;
	set->buckets = malloc(sizeof(uint32_t) * n_buckets);
	set->slots = malloc(sizeof(dedupe_slot) * set->max_entries);
	/* Touch every page now, so the footprint is the same empty or full (a zero fill could
	 * be turned into calloc, which leaves fresh pages untouched). Slots are read only
	 * once written. */
	memset(set->buckets, 0xff, sizeof(uint32_t) * n_buckets);
	memset(set->slots, 0xff, sizeof(dedupe_slot) * set->max_entries);
	return set;
}

void
dedupe_set_ttl(dedupe_set *set, long ttl_ms)
{
	set->ttl_ms = ttl_ms;
}

static void
evict_oldest(dedupe_set *set)
{
	uint32_t slot = set->head;
	uint32_t *p = &set->buckets[set->slots[slot].h1 & set->bucket_mask];

	while (*p != slot)
		p = &set->slots[*p].next_in_bucket;
	*p = set->slots[slot].next_in_bucket;
	set->head = (set->head + 1) % set->max_entries;
	set->count--;
}

static void
evict_expired(dedupe_set *set, int64_t now_ms)
{
	while (set->count > 0 && set->slots[set->head].expires_ms <= now_ms)
		evict_oldest(set);
}

static bool
contains(const dedupe_set *set, uint64_t h1, uint64_t h2)
{
	for (uint32_t s = set->buckets[h1 & set->bucket_mask]; s != NO_SLOT;
		 s = set->slots[s].next_in_bucket)
		if (set->slots[s].h1 == h1 && set->slots[s].h2 == h2)
			return true;
	return false;
}

bool
dedupe_seen_pair(dedupe_set *set, dedupe_pair pair, int64_t now_ms)
{
	evict_expired(set, now_ms);
	return contains(set, pair.h1, pair.h2);
}

void
dedupe_remember_pair(dedupe_set *set, dedupe_pair pair, int64_t now_ms)
{
	uint32_t slot;
	uint32_t *bucket;

	if (set->ttl_ms <= 0)
		return;
	evict_expired(set, now_ms);
	if (contains(set, pair.h1, pair.h2))
		return;
	if (set->count == set->max_entries)
		evict_oldest(set);
	slot = (set->head + set->count) % set->max_entries;
	bucket = &set->buckets[pair.h1 & set->bucket_mask];
	set->slots[slot] = (dedupe_slot){pair.h1, pair.h2, now_ms + set->ttl_ms, *bucket};
	*bucket = slot;
	set->count++;
}

bool
dedupe_seen(dedupe_set *set, const char *key, const char *destination, int64_t now_ms)
{
	return dedupe_seen_pair(set, dedupe_hash_pair(dedupe_hash_key(key), destination), now_ms);
}

void
dedupe_remember(dedupe_set *set, const char *key, const char *destination, int64_t now_ms)
{
	dedupe_remember_pair(set, dedupe_hash_pair(dedupe_hash_key(key), destination), now_ms);
}

size_t
dedupe_size(const dedupe_set *set)
{
	return set->count;
}

void
dedupe_free(dedupe_set *set)
{
	free(set->buckets);
	free(set->slots);
	free(set);
}
