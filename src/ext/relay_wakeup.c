/*
 * relay_wakeup.c: wake the relay at commit of a transaction that enqueued (see
 * relay_wakeup.h). One latch set per committed transaction, however many records it
 * enqueued, so enqueue stays cheap; none for a relay that is not listening (it cannot
 * ship: no Kafka settings, no extension), so the commits of a busy database do not wake,
 * thousands of times a second, a relay that has nothing to do (bench/enqueue measures
 * what those wakeups cost the application). A relay that ships listens only while it
 * waits for work: the commits made during its pass or linger leave a mark, which it looks
 * for before it sleeps, and pay for no latch set.
 */
#include "postgres.h"

#include "access/xact.h"
#include "fmgr.h"
#include "funcapi.h"
#include "access/htup_details.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"

#include "settings.h"
#include "relay_wakeup.h"
#include "wal_delivery.h"

typedef struct RelayWakeupShared
{
	slock_t mutex; /* protects relay_latches */
	Latch *relay_latches[MAX_RELAY_WORKERS];
	pg_atomic_uint32 listening[MAX_RELAY_WORKERS]; /* 1: commits wake this slot's relay */
	/* What commits wrote since the slot's relay last took its marks (relay_wakeup.h). */
	pg_atomic_uint32 marks[MAX_RELAY_WORKERS];
	pg_atomic_uint64 commit_wakeups;      /* committed transactions that asked to wake the relay */
	pg_atomic_uint64 passes;              /* passes the relays ran */
	pg_atomic_uint64 lanes_read;          /* lanes of the log those passes read */
	pg_atomic_uint64 possible_duplicates; /* records perhaps stored, not acknowledged */
} RelayWakeupShared;

static RelayWakeupShared *relay_wakeup = NULL;
static uint32 slots_to_wake_at_commit = 0; /* bit i: wake relay slot i */
static uint32 marks_at_commit = 0;         /* what this transaction wrote, as marks */

PG_FUNCTION_INFO_V1(wal_delivery_wake_relay_at_commit);
PG_FUNCTION_INFO_V1(wal_delivery_relay_wakeups);
PG_FUNCTION_INFO_V1(wal_delivery_relay_passes);

void
relay_wakeup_request_shmem(void)
{
	RequestAddinShmemSpace(MAXALIGN(sizeof(RelayWakeupShared)));
}

void
relay_wakeup_init_shmem(void)
{
	bool found;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	relay_wakeup = ShmemInitStruct("wal_delivery relay wakeup", sizeof(RelayWakeupShared), &found);
	if (!found)
	{
		SpinLockInit(&relay_wakeup->mutex);
		memset(relay_wakeup->relay_latches, 0, sizeof(relay_wakeup->relay_latches));
		for (int i = 0; i < MAX_RELAY_WORKERS; i++)
		{
			pg_atomic_init_u32(&relay_wakeup->listening[i], 0);
			pg_atomic_init_u32(&relay_wakeup->marks[i], 0);
		}
		pg_atomic_init_u64(&relay_wakeup->commit_wakeups, 0);
		pg_atomic_init_u64(&relay_wakeup->passes, 0);
		pg_atomic_init_u64(&relay_wakeup->lanes_read, 0);
		pg_atomic_init_u64(&relay_wakeup->possible_duplicates, 0);
	}
	LWLockRelease(AddinShmemInitLock);
}

static void
set_slot_latch(int slot, Latch *latch)
{
	SpinLockAcquire(&relay_wakeup->mutex);
	relay_wakeup->relay_latches[slot] = latch;
	SpinLockRelease(&relay_wakeup->mutex);
	relay_wakeup_listen(slot, latch != NULL);
}

/* A relay that exits (or fails) leaves no latch behind for commits to set. */
static void
unregister_latch_at_exit(int code, Datum slot)
{
	set_slot_latch(DatumGetInt32(slot), NULL);
}

void
relay_wakeup_register_latch(int slot, Latch *latch)
{
	Assert(slot >= 0 && slot < MAX_RELAY_WORKERS);
	set_slot_latch(slot, latch);
	before_shmem_exit(unregister_latch_at_exit, Int32GetDatum(slot));
}

/*
 * The full barrier orders the flag before the relay's next snapshot: a commit whose
 * callback still read 0 is visible to the pass that follows a change to 1.
 */
void
relay_wakeup_listen(int slot, bool listen)
{
	Assert(slot >= 0 && slot < MAX_RELAY_WORKERS);
	(void) pg_atomic_exchange_u32(&relay_wakeup->listening[slot], listen ? 1 : 0);
}

/*
 * Marks each slot's relay first, listening or not (a relay that was not listening reads
 * everything when it starts listening again, but one that was must find the mark), then
 * sets the latches of those listening. The commit is visible to new snapshots before this
 * runs (XACT_EVENT_COMMIT comes after the transaction left the proc array), and the mark's
 * atomic OR is a full barrier: a relay that takes the mark sees the commit in its pass.
 */
static void
wake_relay_workers(uint32 slots, uint32 marks)
{
	Latch *latches[MAX_RELAY_WORKERS];
	bool listening[MAX_RELAY_WORKERS];
	bool any = false;

	pg_atomic_fetch_add_u64(&relay_wakeup->commit_wakeups, 1);
	for (int i = 0; i < Min(wal_delivery_relay_workers, MAX_RELAY_WORKERS); i++)
		if ((slots & (1u << i)) != 0)
			(void) pg_atomic_fetch_or_u32(&relay_wakeup->marks[i], marks);
	for (int i = 0; i < MAX_RELAY_WORKERS; i++)
	{
		listening[i] =
			(slots & (1u << i)) != 0 && pg_atomic_read_u32(&relay_wakeup->listening[i]) != 0;
		any |= listening[i];
	}
	if (!any)
		return;

	SpinLockAcquire(&relay_wakeup->mutex);
	memcpy(latches, relay_wakeup->relay_latches, sizeof(latches));
	SpinLockRelease(&relay_wakeup->mutex);

	for (int i = 0; i < MAX_RELAY_WORKERS; i++)
		if (listening[i] && latches[i] != NULL)
			SetLatch(latches[i]);
}

static void
relay_wakeup_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			if (slots_to_wake_at_commit != 0 && relay_wakeup != NULL)
				wake_relay_workers(slots_to_wake_at_commit, marks_at_commit);
			slots_to_wake_at_commit = marks_at_commit = 0;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			slots_to_wake_at_commit = marks_at_commit = 0;
			break;
		default:
			break;
	}
}

void
relay_wakeup_register_xact_callback(void)
{
	RegisterXactCallback(relay_wakeup_xact_callback, NULL);
}

void
relay_wake_at_commit(void)
{
	slots_to_wake_at_commit = ~0u;
	marks_at_commit = ~0u; /* any lane, and the row table */
}

/* Lanes are dealt out to the relay workers by number. */
int
relay_slot_of_lane(int lane)
{
	return lane % Max(wal_delivery_relay_workers, 1);
}

void
relay_wake_lane_at_commit(int lane)
{
	slots_to_wake_at_commit |= 1u << relay_slot_of_lane(lane);
	marks_at_commit |= RELAY_MARK_LANE(lane);
}

uint32
relay_wakeup_take_marks(int slot)
{
	Assert(slot >= 0 && slot < MAX_RELAY_WORKERS);
	if (relay_wakeup == NULL)
		return ~0u;
	return pg_atomic_exchange_u32(&relay_wakeup->marks[slot], 0);
}

/*
 * Whether commits marked the slot since its last pass took the marks. Read after
 * relay_wakeup_listen(slot, true), whose barrier pairs with the commit's: a commit that
 * read "not listening" left its mark for this read to see.
 */
bool
relay_wakeup_marks_pending(int slot)
{
	Assert(slot >= 0 && slot < MAX_RELAY_WORKERS);
	return relay_wakeup != NULL && pg_atomic_read_u32(&relay_wakeup->marks[slot]) != 0;
}

/* Called by wal_enqueue: the relay is woken when (and only if) this transaction commits. */
Datum
wal_delivery_wake_relay_at_commit(PG_FUNCTION_ARGS)
{
	relay_wake_at_commit();
	PG_RETURN_VOID();
}

/* The counters live in shared memory, which only shared_preload_libraries sets up. */
static void
require_shared_memory(void)
{
	if (relay_wakeup == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("wal_delivery is not in shared_preload_libraries"),
				 errhint("Add wal_delivery to shared_preload_libraries and restart the server.")));
}

/* How many committed transactions have woken the relay since the server started. */
Datum
wal_delivery_relay_wakeups(PG_FUNCTION_ARGS)
{
	require_shared_memory();
	PG_RETURN_INT64((int64) pg_atomic_read_u64(&relay_wakeup->commit_wakeups));
}

void
relay_count_pass(int lanes_read)
{
	if (relay_wakeup == NULL)
		return;
	pg_atomic_fetch_add_u64(&relay_wakeup->passes, 1);
	pg_atomic_fetch_add_u64(&relay_wakeup->lanes_read, lanes_read);
}

void
relay_count_possible_duplicates(int records)
{
	if (relay_wakeup == NULL || records <= 0)
		return;
	pg_atomic_fetch_add_u64(&relay_wakeup->possible_duplicates, records);
}

/*
 * The relays' passes, lane reads and possible duplicates since the server started
 * (relay_passes()).
 */
Datum
wal_delivery_relay_passes(PG_FUNCTION_ARGS)
{
	TupleDesc desc;
	Datum values[3];
	bool nulls[3] = {false, false, false};

	require_shared_memory();
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "relay_passes must return a record");
	values[0] = Int64GetDatum((int64) pg_atomic_read_u64(&relay_wakeup->passes));
	values[1] = Int64GetDatum((int64) pg_atomic_read_u64(&relay_wakeup->lanes_read));
	values[2] = Int64GetDatum((int64) pg_atomic_read_u64(&relay_wakeup->possible_duplicates));
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}
