/*
 * kafka_inflight.c: deliveries that outlive their pass (see kafka_inflight.h).
 *
 * librdkafka keeps a pointer to each delivery until its report, so a pass's deliveries
 * live in blocks of the relay's top memory context, not in the pass's: a block is freed
 * when its pass ends, or, when some of its deliveries were handed off, at the last of
 * their reports. The outbox ids in flight are a hash table, which costs nothing while
 * every report comes within its pass.
 */
#include "postgres.h"

#include "lib/ilist.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "kafka_inflight.h"
#include "relay_wakeup.h"

typedef struct DeliveryBlock
{
	dlist_node node;
	int n;
	int handed_off_waiting; /* handed off, no report yet */
	bool pass_done;
	KafkaDelivery d[FLEXIBLE_ARRAY_MEMBER];
} DeliveryBlock;

typedef struct InflightEntry
{
	int64 outbox_id;     /* the key */
	KafkaDelivery *live; /* until its report */
	bool reported;
	rd_kafka_resp_err_t err;
	rd_kafka_msg_status_t status;
} InflightEntry;

static dlist_head pass_blocks = DLIST_STATIC_INIT(pass_blocks);
static dlist_head kept_blocks = DLIST_STATIC_INIT(kept_blocks);
static HTAB *inflight = NULL;
static int waiting = 0;

static HTAB *
inflight_table(void)
{
	if (inflight == NULL)
	{
		HASHCTL ctl = {0};

		ctl.keysize = sizeof(int64);
		ctl.entrysize = sizeof(InflightEntry);
		ctl.hcxt = TopMemoryContext;
		inflight = hash_create("wal_delivery relay deliveries in flight", 256, &ctl,
							   HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	return inflight;
}

KafkaDelivery *
kafka_deliveries_alloc(int n)
{
	DeliveryBlock *block = MemoryContextAllocZero(
		TopMemoryContext, offsetof(DeliveryBlock, d) + sizeof(KafkaDelivery) * Max(n, 1));

	block->n = n;
	for (int i = 0; i < n; i++)
		block->d[i].block = block;
	dlist_push_tail(&pass_blocks, &block->node);
	return block->d;
}

void
kafka_inflight_hand_off(void)
{
	dlist_iter it;

	dlist_foreach(it, &pass_blocks)
	{
		DeliveryBlock *block = dlist_container(DeliveryBlock, node, it.cur);

		for (int i = 0; i < block->n; i++)
		{
			KafkaDelivery *d = &block->d[i];
			InflightEntry *entry;

			if (!d->queued || d->reported || d->handed_off)
				continue;
			entry = hash_search(inflight_table(), &d->outbox_id, HASH_ENTER, NULL);
			entry->live = d;
			entry->reported = false;
			d->handed_off = true;
			block->handed_off_waiting++;
			waiting++;
		}
	}
}

int
kafka_inflight_waiting(void)
{
	return waiting;
}

int
kafka_inflight_count(void)
{
	return inflight == NULL ? 0 : (int) hash_get_num_entries(inflight);
}

static void
block_report_done(DeliveryBlock *block)
{
	block->handed_off_waiting--;
	waiting--;
	if (block->pass_done && block->handed_off_waiting == 0)
	{
		dlist_delete(&block->node);
		pfree(block);
	}
}

void
kafka_inflight_reported(KafkaDelivery *delivery)
{
	InflightEntry *entry = hash_search(inflight_table(), &delivery->outbox_id, HASH_FIND, NULL);

	if (entry != NULL && entry->live == delivery)
	{
		entry->reported = true;
		entry->err = delivery->err;
		entry->status = delivery->status;
		entry->live = NULL;
	}
	block_report_done(delivery->block);
}

InflightState
kafka_inflight_take(int64 outbox_id, KafkaDelivery *delivery)
{
	InflightEntry *entry;

	if (inflight == NULL || hash_get_num_entries(inflight) == 0)
		return INFLIGHT_NONE;
	entry = hash_search(inflight, &outbox_id, HASH_FIND, NULL);
	if (entry == NULL)
		return INFLIGHT_NONE;
	if (!entry->reported)
		return INFLIGHT_WAITING;
	delivery->reported = true;
	delivery->err = entry->err;
	delivery->status = entry->status;
	hash_search(inflight, &outbox_id, HASH_REMOVE, NULL);
	return INFLIGHT_REPORTED;
}

void
kafka_inflight_pass_done(void)
{
	dlist_mutable_iter it;

	dlist_foreach_modify(it, &pass_blocks)
	{
		DeliveryBlock *block = dlist_container(DeliveryBlock, node, it.cur);

		dlist_delete(&block->node);
		block->pass_done = true;
		if (block->handed_off_waiting == 0)
			pfree(block);
		else
			dlist_push_tail(&kept_blocks, &block->node);
	}
}

void
kafka_inflight_forget(void)
{
	HASH_SEQ_STATUS seq;
	InflightEntry *entry;
	int forgotten = 0;

	if (inflight == NULL)
		return;
	hash_seq_init(&seq, inflight);
	while ((entry = hash_seq_search(&seq)) != NULL)
	{
		if (entry->reported)
			continue;
		/* Sent, never answered: the record may be in Kafka. */
		entry->reported = true;
		entry->err = RD_KAFKA_RESP_ERR__PURGE_INFLIGHT;
		entry->status = RD_KAFKA_MSG_STATUS_POSSIBLY_PERSISTED;
		block_report_done(entry->live->block);
		entry->live = NULL;
		forgotten++;
	}
	relay_count_possible_duplicates(forgotten);
}
