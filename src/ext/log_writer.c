/*
 * log_writer.c: the log's inserts without a query (see log_writer.h).
 *
 * Why: an INSERT through SPI, even with a kept plan, starts and ends an executor for a
 * ModifyTable on every call and checks the partition constraint; that was most of what
 * wal_enqueue's transaction cost over an application's plain INSERT (bench/enqueue). Here
 * a record is a heap insert and its index inserts, as logical replication's apply worker
 * writes rows: an executor state holds the open indexes for the call (one record or a
 * batch), nothing is planned.
 *
 * What a query would have done and this does itself: the column defaults (xid is the top
 * transaction's id, as pg_current_xact_id(); created_at is now()), and ON CONFLICT DO
 * NOTHING on the dedupe index for a caller's key, by the executor's speculative insertion
 * (insert with a token, insert the index entries, confirm or kill; check and wait).
 * What it does not: triggers, CHECK constraints and row security. The log has none: it
 * is the extension's own table, which no other role may write. wal_enqueue runs as its
 * caller (SECURITY INVOKER), and this library writes the table by oid, checking no
 * privilege, so a caller gets no right to the table itself. log_writer_open refuses a
 * generation that has grown triggers or checks rather than skipping them. The partition
 * constraint holds by construction (gen is the partition's).
 */
#include "postgres.h"

#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "storage/lmgr.h"
#include "utils/rel.h"
#include "utils/timestamp.h"
#include "utils/xid8.h"

#include "enqueue_lookup.h"
#include "log_writer.h"
#include "outbox_log_layout.h"
#include "pg_compat.h"
#include "relay_wakeup.h"

PG_FUNCTION_INFO_V1(wal_delivery_log_lane);
PG_FUNCTION_INFO_V1(wal_delivery_log_order);

static const char *const column_names[LOG_COLUMNS] = LOG_COLUMN_NAMES;

struct LogWriter
{
	int gen;
	Relation rel;
	EState *estate;
	ResultRelInfo *rri;
	TupleTableSlot *slot;
	List *arbiters; /* the dedupe index: ON CONFLICT's arbiter for a caller's key */
	CommandId cid;
};

/* The generation's columns are the ones this library writes, and nothing runs on insert. */
static void
check_shape(Relation rel)
{
	TupleDesc desc = RelationGetDescr(rel);
	bool same = desc->natts == LOG_COLUMNS;

	for (int i = 0; same && i < LOG_COLUMNS; i++)
		same = !TupleDescAttr(desc, i)->attisdropped &&
			   strcmp(NameStr(TupleDescAttr(desc, i)->attname), column_names[i]) == 0;
	if (!same)
		ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						errmsg("%s does not have the columns this wal_delivery library writes",
							   RelationGetRelationName(rel)),
						errhint("Run ALTER EXTENSION wal_delivery UPDATE, or install the library "
								"of the schema's version.")));
	if (rel->trigdesc != NULL || (desc->constr != NULL && desc->constr->num_check > 0) ||
		rel->rd_rel->relrowsecurity)
		ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						errmsg("%s has triggers, CHECK constraints or row security, which "
							   "wal_enqueue does not run",
							   RelationGetRelationName(rel)),
						errhint("The outbox log is wal_delivery's own table: drop what was "
								"added to it.")));
}

LogWriter *
log_writer_open(int gen)
{
	static const char *const names[LOG_GENERATIONS] = LOG_GENERATION_TABLES;
	LogWriter *w = palloc0(sizeof(LogWriter));
	MemoryContext old;

	Assert(gen >= 0 && gen < LOG_GENERATIONS);
	w->gen = gen;
	w->rel = table_open(enqueue_relation_oid(names[gen]), RowExclusiveLock);
	check_shape(w->rel);
	w->estate = CreateExecutorState();
	old = MemoryContextSwitchTo(w->estate->es_query_cxt);
	w->rri = makeNode(ResultRelInfo);
	InitResultRelInfo(w->rri, w->rel, 1, NULL, 0);
	ExecOpenIndices(w->rri, true);
	for (int i = 0; i < w->rri->ri_NumIndices; i++)
		if (w->rri->ri_IndexRelationDescs[i]->rd_index->indisunique)
			w->arbiters =
				lappend_oid(w->arbiters, RelationGetRelid(w->rri->ri_IndexRelationDescs[i]));
	if (list_length(w->arbiters) != 1)
		elog(ERROR, "%s has %d unique indexes, not its dedupe index alone",
			 RelationGetRelationName(w->rel), list_length(w->arbiters));
	w->slot = ExecInitExtraTupleSlot(w->estate, RelationGetDescr(w->rel), &TTSOpsVirtual);
	MemoryContextSwitchTo(old);
	w->cid = GetCurrentCommandId(true);
	return w;
}

static void
store_record(LogWriter *w, const LogRecord *r)
{
	TupleTableSlot *slot = w->slot;
	Datum *v = slot->tts_values;
	bool *isnull = slot->tts_isnull;

	ExecClearTuple(slot);
	memset(isnull, 0, sizeof(bool) * LOG_COLUMNS);
	v[LOG_COL_GEN] = Int16GetDatum((int16) w->gen);
	v[LOG_COL_LANE] = Int16GetDatum((int16) log_lane_of(r->id));
	v[LOG_COL_CALLER_KEY] = BoolGetDatum(r->caller_key);
	v[LOG_COL_XID] = FullTransactionIdGetDatum(GetTopFullTransactionId());
	v[LOG_COL_ID] = Int64GetDatum(r->id);
	v[LOG_COL_CREATED_AT] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	v[LOG_COL_ENQUEUED_BY] = ObjectIdGetDatum(GetOuterUserId());
	v[LOG_COL_ENQUEUED_BY_SESSION] = ObjectIdGetDatum(GetSessionUserId());
	v[LOG_COL_TOPIC] = PointerGetDatum(r->topic);
	v[LOG_COL_IDEMPOTENCY_KEY] = PointerGetDatum(r->idempotency_key);
	v[LOG_COL_MESSAGE_KEY] = PointerGetDatum(r->message_key);
	isnull[LOG_COL_MESSAGE_KEY] = r->message_key == NULL;
	v[LOG_COL_CONTENT_TYPE] = PointerGetDatum(r->content_type);
	v[LOG_COL_HEADERS] = PointerGetDatum(r->headers);
	isnull[LOG_COL_HEADERS] = r->headers == NULL;
	v[LOG_COL_PAYLOAD] = PointerGetDatum(r->payload);
	ExecStoreVirtualTuple(slot);
}

/*
 * Inserts the slot's record as a speculative insertion (the executor's ON CONFLICT
 * protocol): heap tuple with a token, index entries, then confirmed, or killed when the
 * dedupe index already had the key; true when confirmed. Without waiting: a transaction
 * in progress that wrote the key is a conflict too.
 */
static bool
insert_speculatively(LogWriter *w)
{
	TransactionId xid = GetCurrentTransactionId();
	uint32 token = SpeculativeInsertionLockAcquire(xid);
	bool conflict = false;

	table_tuple_insert_speculative(w->rel, w->slot, w->cid, 0, NULL, token);
	list_free(compat_ExecInsertIndexTuples(w->rri, w->slot, w->estate, false, true, &conflict,
										   w->arbiters));
	table_tuple_complete_speculative(w->rel, w->slot, token, !conflict);
	SpeculativeInsertionLockRelease(xid);
	return !conflict;
}

/*
 * ON CONFLICT DO NOTHING on the dedupe index. The executor checks the index before it
 * inserts; here the insert goes first, since a key this generation already has is rare
 * (the caller's lookup found the other generations' keys) and the check cost as much as
 * an index insert. After a conflict, the executor's loop: check (which waits for a
 * transaction in progress that wrote the key, and says whether it committed), insert.
 */
static bool
insert_unless_key_exists(LogWriter *w)
{
	if (insert_speculatively(w))
		return true;
	for (;;)
	{
		ItemPointerData conflict;

		CHECK_FOR_INTERRUPTS();
		if (!ExecCheckIndexConstraints(w->rri, w->slot, w->estate, &conflict, w->arbiters))
			return false;
		/* The other writer rolled back, or its key went between the check and ours. */
		if (insert_speculatively(w))
			return true;
	}
}

bool
log_writer_insert(LogWriter *w, const LogRecord *r)
{
	bool inserted = true;

	store_record(w, r);
	if (r->caller_key)
		inserted = insert_unless_key_exists(w);
	else
	{
		/* A generated key is outside the partial dedupe index: a plain insert. */
		table_tuple_insert(w->rel, w->slot, w->cid, 0, NULL);
		list_free(
			compat_ExecInsertIndexTuples(w->rri, w->slot, w->estate, false, false, NULL, NIL));
	}
	ResetPerTupleExprContext(w->estate);
	if (inserted)
		relay_wake_lane_at_commit(log_lane_of(r->id));
	return inserted;
}

void
log_writer_close(LogWriter *w)
{
	ExecCloseIndices(w->rri);
	ExecResetTupleTable(w->estate->es_tupleTable, false);
	FreeExecutorState(w->estate);
	table_close(w->rel, NoLock);
	pfree(w);
}

/* wal_delivery.log_lane(id): the lane of a log record, for the SQL that writes or finds one. */
Datum
wal_delivery_log_lane(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT16((int16) log_lane_of(PG_GETARG_INT64(0)));
}

/*
 * wal_delivery.log_order(lane, xid): the log's index key (log_order_of), for SQL. Lane
 * LOG_LANES is allowed: log_order(lane + 1, '0') is where a lane's range ends.
 */
Datum
wal_delivery_log_order(PG_FUNCTION_ARGS)
{
	int16 lane = PG_GETARG_INT16(0);
	uint64 xid = U64FromFullTransactionId(PG_GETARG_FULLTRANSACTIONID(1));

	if (lane < 0 || lane > LOG_LANES)
		ereport(ERROR, (errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
						errmsg("log lane %d is out of range", lane),
						errhint("A log lane is between 0 and %d (%d: the end of the last one).",
								LOG_LANES - 1, LOG_LANES)));
	if (xid >> LOG_ORDER_XID_BITS != 0)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("transaction id " UINT64_FORMAT " does not fit the log's order", xid),
				 errhint("The log's order holds transaction ids below 2^%d.", LOG_ORDER_XID_BITS)));
	PG_RETURN_INT64(log_order_of(lane, xid));
}
