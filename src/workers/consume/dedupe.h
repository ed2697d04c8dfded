/*
 * dedupe.h: remembers which (record, destination) pairs were delivered, for a
 * time-to-live and up to a fixed number of entries, so a redelivered record is not sent
 * to the same destination again. Best effort by design: once an entry expires or is
 * evicted the record may be sent again, which is why destinations dedupe too.
 */
#ifndef WAL_DEDUPE_H
#define WAL_DEDUPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct dedupe_set dedupe_set;

dedupe_set *dedupe_new(size_t max_entries, long ttl_ms);
void dedupe_free(dedupe_set *set);
void dedupe_set_ttl(dedupe_set *set, long ttl_ms);

/* True when (key, destination) was delivered within the TTL. */
bool dedupe_seen(dedupe_set *set, const char *key, const char *destination, int64_t now_ms);
void dedupe_remember(dedupe_set *set, const char *key, const char *destination, int64_t now_ms);

/*
 * The same in two steps, for a record delivered to several destinations: its key is
 * hashed once, then each destination on top (a pair is kept as two 64-bit hashes).
 */
typedef struct dedupe_key_hash
{
	uint64_t a, b;
} dedupe_key_hash;
typedef struct dedupe_pair
{
	uint64_t h1, h2;
} dedupe_pair;

dedupe_key_hash dedupe_hash_key(const char *key);
/* A record's identity: its topic and its idempotency key (unique per topic only). */
dedupe_key_hash dedupe_hash_record(const char *topic, const char *key);
dedupe_pair dedupe_hash_pair(dedupe_key_hash key, const char *destination);
bool dedupe_seen_pair(dedupe_set *set, dedupe_pair pair, int64_t now_ms);
void dedupe_remember_pair(dedupe_set *set, dedupe_pair pair, int64_t now_ms);
size_t dedupe_size(const dedupe_set *set);

#endif
