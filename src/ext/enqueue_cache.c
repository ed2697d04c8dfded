/*
 * enqueue_cache.c: the control plane as enqueue reads it, kept per backend (see
 * enqueue_cache.h).
 *
 * Why: reading the topic's row and the generations on every call was a visible share of
 * an application's transaction (bench/enqueue/instructions counts it), for rows that
 * change a few times a day (topics) or once per idempotency window (the log's rotation).
 *
 * How it stays right: both tables have a statement trigger (forget_enqueue_cache) that
 * sends a relcache invalidation of the table, which Postgres delivers to every backend
 * after the change commits, and to the changing backend at once (and again if it rolls
 * back). Each look-up first takes what the backend was sent (a read of a shared flag when
 * nothing was), so a call sees every change committed before it began, as a query that
 * read the tables would; a transaction's snapshot does not hold a cached row back, nor
 * does a lock it already holds. A miss reads the latest committed rows, not
 * the caller's snapshot (an old repeatable-read snapshot could otherwise fill the cache
 * with rows older than an invalidation already processed), and keeps what it read only
 * if no invalidation arrived while it read.
 */
#include "postgres.h"

#include "commands/trigger.h"
#include "fmgr.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "enqueue_cache.h"

/* Kafka's longest topic name is 249 bytes; a longer name is never cached. */
#define TOPIC_NAME_BYTES 256

typedef struct CachedTopic
{
	char name[TOPIC_NAME_BYTES]; /* the hash key */
	EnqueueTopic topic;
} CachedTopic;

static MemoryContext cache_context = NULL;
static HTAB *topics = NULL;      /* NULL: empty */
static int generation = -2;      /* -2: not cached */
static uint64 invalidations = 0; /* how many times the cache was forgotten */
static Oid topics_oid = InvalidOid;
static Oid generations_oid = InvalidOid;

PG_FUNCTION_INFO_V1(wal_delivery_forget_enqueue_cache);

static void
forget(void)
{
	invalidations++;
	generation = -2;
	topics = NULL;
	if (cache_context != NULL)
		MemoryContextReset(cache_context);
}

/* relid InvalidOid: every relation (the invalidation queue overflowed). */
static void
forget_on_invalidation(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == topics_oid || relid == generations_oid)
		forget();
}

static void
register_callback(void)
{
	if (cache_context != NULL)
		return;
	cache_context = AllocSetContextCreate(CacheMemoryContext, "wal_delivery enqueue cache",
										  ALLOCSET_SMALL_SIZES);
	CacheRegisterRelcacheCallback(forget_on_invalidation, (Datum) 0);
}

/* The tables the callback watches; found again after a recreated extension. */
static void
watch_tables(void)
{
	topics_oid = enqueue_relation_oid("topics");
	generations_oid = enqueue_relation_oid("outbox_generations");
}

static bool
topic_key(text *name, char *key)
{
	int len = VARSIZE_ANY_EXHDR(name);

	if (len >= TOPIC_NAME_BYTES)
		return false;
	memset(key, 0, TOPIC_NAME_BYTES);
	memcpy(key, VARDATA_ANY(name), len);
	return true;
}

bool
enqueue_cached_topic(text *name, EnqueueTopic *topic)
{
	char key[TOPIC_NAME_BYTES];
	bool cacheable = topic_key(name, key);
	CachedTopic *entry;
	uint64 seen;
	bool found;

	register_callback();
	AcceptInvalidationMessages();
	if (cacheable && topics != NULL && (entry = hash_search(topics, key, HASH_FIND, NULL)) != NULL)
	{
		*topic = entry->topic;
		return true;
	}

	seen = invalidations;
	watch_tables();
	PushActiveSnapshot(GetLatestSnapshot());
	found = enqueue_find_topic(name, topic);
	PopActiveSnapshot();
	/* A missing topic is not cached: the SQL path raises its error. */
	if (!found || !cacheable || invalidations != seen)
		return found;
	if (topics == NULL)
	{
		HASHCTL ctl = {
			.keysize = TOPIC_NAME_BYTES, .entrysize = sizeof(CachedTopic), .hcxt = cache_context};

		topics = hash_create("wal_delivery enqueue topics", 64, &ctl,
							 HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}
	entry = hash_search(topics, key, HASH_ENTER, NULL);
	entry->topic = *topic;
	return true;
}

int
enqueue_cached_generation(void)
{
	uint64 seen;
	int gen;

	register_callback();
	AcceptInvalidationMessages();
	if (generation != -2)
		return generation;
	seen = invalidations;
	watch_tables();
	PushActiveSnapshot(GetLatestSnapshot());
	gen = enqueue_current_generation();
	PopActiveSnapshot();
	if (invalidations == seen)
		generation = gen;
	return gen;
}

/* The statement trigger on topics and outbox_generations: every backend forgets. */
Datum
wal_delivery_forget_enqueue_cache(PG_FUNCTION_ARGS)
{
	TriggerData *trigger = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo))
		elog(ERROR, "forget_enqueue_cache: not called as a trigger");
	CacheInvalidateRelcache(trigger->tg_relation);
	return PointerGetDatum(NULL);
}
