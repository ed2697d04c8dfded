/*
 * enqueue_lookup.c: enqueue's reads (see enqueue_lookup.h). Relations are found by name
 * once per session (and again after a catalog change: a dropped and recreated extension
 * is found again); they are locked as a query would (AccessShareLock, kept to the end of
 * the transaction).
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/relscan.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/namespace.h"
#include "catalog/pg_index.h"
#include "catalog/pg_type.h"
#include "executor/tuptable.h"
#include "storage/bufmgr.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "enqueue_lookup.h"
#include "outbox_log_layout.h"

/*
 * Relation oids by name (and a generation's dedupe index by the generation's oid), kept
 * for the session: two catalog lookups per relation on every enqueue were a tenth of
 * its cost over a plain INSERT. Any change to pg_class or pg_namespace (a dropped and
 * recreated extension) forgets them all.
 */
#define CACHED_OIDS 16

typedef struct CachedOid
{
	const char *name; /* a relation's name (a string constant), or NULL: key is an oid */
	Oid key;
	Oid oid;
} CachedOid;

static CachedOid cached_oids[CACHED_OIDS];
static int n_cached_oids;

static void
forget_cached_oids(Datum arg, int cache_id, uint32 hash_value)
{
	n_cached_oids = 0;
}

static const CachedOid *
find_cached_oid(const char *name, Oid key)
{
	for (int i = 0; i < n_cached_oids; i++)
		if (name != NULL ? cached_oids[i].name != NULL && strcmp(cached_oids[i].name, name) == 0
						 : cached_oids[i].name == NULL && cached_oids[i].key == key)
			return &cached_oids[i];
	return NULL;
}

static void
cache_oid(const char *name, Oid key, Oid oid)
{
	static bool callbacks_registered = false;

	if (!callbacks_registered)
	{
		CacheRegisterSyscacheCallback(RELOID, forget_cached_oids, (Datum) 0);
		CacheRegisterSyscacheCallback(NAMESPACEOID, forget_cached_oids, (Datum) 0);
		callbacks_registered = true;
	}
	if (n_cached_oids < CACHED_OIDS)
		cached_oids[n_cached_oids++] = (CachedOid){name, key, oid};
}

Oid
enqueue_relation_oid(const char *name)
{
	const CachedOid *cached = find_cached_oid(name, InvalidOid);
	Oid oid;

	if (cached != NULL)
		return cached->oid;
	oid = get_relname_relid(name, get_namespace_oid("wal_delivery", false));
	if (!OidIsValid(oid))
		elog(ERROR, "wal_delivery.%s does not exist", name);
	cache_oid(name, InvalidOid, oid);
	return oid;
}

static AttrNumber
column_number(Relation rel, const char *column)
{
	AttrNumber attno = get_attnum(RelationGetRelid(rel), column);

	if (attno == InvalidAttrNumber)
		elog(ERROR, "column %s of %s does not exist", column, RelationGetRelationName(rel));
	return attno;
}

/* An equality key on column attno (1-based) of index for a value of type typid. */
static void
equality_key(ScanKey key, Relation index, AttrNumber attno, Oid typid, Datum value)
{
	RegProcedure eq = typid == INT2OID ? F_INT2EQ : F_TEXTEQ;

	ScanKeyEntryInitialize(key, 0, attno, BTEqualStrategyNumber, InvalidOid,
						   index->rd_indcollation[attno - 1], eq, value);
}

/*
 * The first row of heap visible in the active snapshot that index finds for keys, into
 * slot; false when none.
 */
static bool
index_first(Relation heap, Relation index, ScanKey keys, int nkeys, TupleTableSlot *slot)
{
	IndexScanDesc scan = index_beginscan(heap, index, GetActiveSnapshot(), nkeys, 0);
	bool found;

	index_rescan(scan, keys, nkeys, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	index_endscan(scan);
	return found;
}

bool
enqueue_find_topic(text *name, EnqueueTopic *topic)
{
	Relation heap = table_open(enqueue_relation_oid("topics"), AccessShareLock);
	Relation index = index_open(RelationGetPrimaryKeyIndex(heap), AccessShareLock);
	TupleTableSlot *slot = table_slot_create(heap, NULL);
	ScanKeyData key;
	bool found;

	equality_key(&key, index, 1, TEXTOID, PointerGetDatum(name));
	found = index_first(heap, index, &key, 1, slot);
	if (found)
	{
		bool isnull;

		topic->max_payload_bytes =
			DatumGetInt32(slot_getattr(slot, column_number(heap, "max_payload_bytes"), &isnull));
		slot_getattr(slot, column_number(heap, "processor"), &isnull);
		topic->has_processor = !isnull;
		slot_getattr(slot, column_number(heap, "writers"), &isnull);
		topic->has_writers = !isnull;
	}
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, NoLock);
	table_close(heap, NoLock);
	return found;
}

int
enqueue_current_generation(void)
{
	Relation heap = table_open(enqueue_relation_oid("outbox_generations"), AccessShareLock);
	AttrNumber gen_attno = column_number(heap, "gen");
	AttrNumber sealed_attno = column_number(heap, "sealed_at");
	TupleTableSlot *slot = table_slot_create(heap, NULL);
	TableScanDesc scan = table_beginscan(heap, GetActiveSnapshot(), 0, NULL);
	int gen = -1;
	int current = 0;

	while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
	{
		bool isnull;

		slot_getattr(slot, sealed_attno, &isnull);
		if (isnull)
		{
			gen = DatumGetInt16(slot_getattr(slot, gen_attno, &isnull));
			current++;
		}
	}
	table_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	table_close(heap, NoLock);
	return current == 1 ? gen : -1;
}

/* The unique index of a log generation: its share of outbox_log_topic_idempotency_key. */
static Oid
dedupe_index_of(Relation partition)
{
	const CachedOid *cached = find_cached_oid(NULL, RelationGetRelid(partition));
	List *indexes;
	ListCell *lc;
	Oid found = InvalidOid;

	if (cached != NULL)
		return cached->oid;
	indexes = RelationGetIndexList(partition);
	foreach (lc, indexes)
	{
		Relation index = index_open(lfirst_oid(lc), AccessShareLock);

		if (index->rd_index->indisunique)
			found = RelationGetRelid(index);
		index_close(index, NoLock);
	}
	list_free(indexes);
	if (!OidIsValid(found))
		elog(ERROR, "%s has no dedupe index", RelationGetRelationName(partition));
	cache_oid(NULL, RelationGetRelid(partition), found);
	return found;
}

/* One relation a key is looked up in, through its unique index on ([gen,] topic, key). */
typedef struct KeyTarget
{
	Relation heap;
	Relation index;
	int gen; /* the generation (the index's first column), or -1: the row table */
	AttrNumber id_attno;
	IndexScanDesc scan; /* opened on the first key */
	TupleTableSlot *slot;
} KeyTarget;

#define KEY_TARGETS (1 + LOG_GENERATIONS) /* the row table and the log's generations */

struct KeyLookup
{
	KeyTarget targets[KEY_TARGETS];
};

/*
 * Opens a relation to look keys up in; a log generation without a page is left closed.
 * It holds no key, visible or not, and a key a transaction writes into it from now on is
 * invisible to the snapshot the lookup reads under (taken before this). That skips the
 * generation truncated and waiting for its turn: one of the three probes in steady
 * state, two on a fresh install.
 */
static void
open_target(KeyTarget *target, const char *name, Oid index_oid, int gen)
{
	Relation heap = table_open(enqueue_relation_oid(name), AccessShareLock);

	if (gen >= 0 && RelationGetNumberOfBlocks(heap) == 0)
	{
		table_close(heap, NoLock);
		return;
	}
	target->heap = heap;
	if (!OidIsValid(index_oid))
		index_oid = dedupe_index_of(heap);
	target->index = index_open(index_oid, AccessShareLock);
	target->gen = gen;
	target->id_attno = column_number(heap, "id");
	target->scan = NULL;
	target->slot = NULL;
}

KeyLookup *
enqueue_key_lookup_begin(int skip_gen)
{
	static const char *const generations[LOG_GENERATIONS] = LOG_GENERATION_TABLES;
	KeyLookup *lookup = palloc0(sizeof(KeyLookup));

	open_target(&lookup->targets[0], "outbox_rows",
				enqueue_relation_oid("outbox_rows_topic_idempotency_key"), -1);
	for (int gen = 0; gen < (int) lengthof(generations); gen++)
		if (gen != skip_gen)
			open_target(&lookup->targets[gen + 1], generations[gen], InvalidOid, gen);
	return lookup;
}

static bool
probe(KeyTarget *target, text *topic, text *key, int64 *id)
{
	ScanKeyData keys[3];
	int n = 0;

	if (target->gen >= 0)
	{
		equality_key(&keys[n], target->index, n + 1, INT2OID, Int16GetDatum((int16) target->gen));
		n++;
	}
	equality_key(&keys[n], target->index, n + 1, TEXTOID, PointerGetDatum(topic));
	n++;
	equality_key(&keys[n], target->index, n + 1, TEXTOID, PointerGetDatum(key));
	n++;
	if (target->scan == NULL)
	{
		target->scan = index_beginscan(target->heap, target->index, GetActiveSnapshot(), n, 0);
		target->slot = table_slot_create(target->heap, NULL);
	}
	index_rescan(target->scan, keys, n, NULL, 0);
	if (!index_getnext_slot(target->scan, ForwardScanDirection, target->slot))
		return false;
	*id = DatumGetInt64(slot_getattr(target->slot, target->id_attno, &(bool){false}));
	return true;
}

bool
enqueue_key_lookup(KeyLookup *lookup, text *topic, text *key, int64 *id)
{
	for (int i = 0; i < KEY_TARGETS; i++)
		if (lookup->targets[i].heap != NULL && probe(&lookup->targets[i], topic, key, id))
			return true;
	return false;
}

void
enqueue_key_lookup_end(KeyLookup *lookup)
{
	for (int i = 0; i < KEY_TARGETS; i++)
	{
		KeyTarget *target = &lookup->targets[i];

		if (target->heap == NULL)
			continue;
		if (target->scan != NULL)
		{
			index_endscan(target->scan);
			ExecDropSingleTupleTableSlot(target->slot);
		}
		index_close(target->index, NoLock);
		table_close(target->heap, NoLock);
	}
	pfree(lookup);
}
