/*
 * offset_tracker.c: per-partition queues of open records (see offset_tracker.h).
 * Records arrive in offset order within a partition, so each partition is a FIFO and
 * the low watermark is its head.
 */
#include "offset_tracker.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "metrics.h"

typedef struct partition_state partition_state;

struct tracked_record
{
	partition_state *partition;
	int64_t offset;
	int copies_left;
	bool withdrawn; /* a copy was taken back unsent: never committable */
	tracked_record *next;
};

struct partition_state
{
	char *topic;
	int32_t partition;
	bool forgotten;       /* revoked: its records no longer count */
	int records;          /* tracked_record structs still allocated */
	tracked_record *head; /* oldest still queued */
	tracked_record *tail;
	int64_t committable; /* next offset to consume; -1 until known */
	int64_t committed;   /* last value handed out */
	int64_t next_read;   /* one past the last offset opened; -1 until the first */
	partition_state *next;
};

struct offset_tracker
{
	partition_state *partitions;
	int open_records;
	metric *skipped;
};

offset_tracker *
tracker_new(void)
{
	static const char *const topic[] = {"topic"};
	offset_tracker *t = calloc(1, sizeof(offset_tracker));

	t->skipped = metric_counter("wal_consumer_offsets_skipped_total",
								"Offsets the consumer never read between two it read.", 1, topic);
	return t;
}

static partition_state *
find_partition(offset_tracker *t, const char *topic, int32_t partition, bool create)
{
	partition_state *p;

	for (p = t->partitions; p; p = p->next)
		if (!p->forgotten && p->partition == partition && strcmp(p->topic, topic) == 0)
			return p;
	if (!create)
		return NULL;
	p = calloc(1, sizeof(*p));
	p->topic = strdup(topic);
	p->partition = partition;
	p->committable = -1;
	p->committed = -1;
	p->next_read = -1;
	p->next = t->partitions;
	t->partitions = p;
	return p;
}

static void
free_partition_if_unused(offset_tracker *t, partition_state *p)
{
	partition_state **pp;

	if (!p->forgotten || p->records > 0)
		return;
	for (pp = &t->partitions; *pp != p; pp = &(*pp)->next)
		;
	*pp = p->next;
	free(p->topic);
	free(p);
}

/* Pops done records off the head; the watermark follows the head (and stops at a
 * withdrawn one, which the partition's next owner must read again). */
static void
advance(partition_state *p)
{
	while (p->head && p->head->copies_left == 0 && !p->head->withdrawn)
	{
		tracked_record *done = p->head;

		p->committable = done->offset + 1;
		p->head = done->next;
		if (p->head == NULL)
			p->tail = NULL;
		p->records--;
		free(done);
	}
}

/*
 * Wal_delivery's producers write every offset of its topics, so offsets a consumer jumps
 * over within a partition are records it never read: removed by retention before they
 * were, or a client fault; on a topic another producer writes, also the markers of its
 * transactions. The jump would be committed like any read: say so, once per jump.
 */
static void
note_skipped(offset_tracker *t, partition_state *p, int64_t offset)
{
	if (p->next_read >= 0 && offset > p->next_read)
	{
		const char *labels[] = {p->topic};

		metric_add(t->skipped, (double) (offset - p->next_read), labels);
		log_warn("event=offsets_skipped topic=%s partition=%" PRId32 " from=%" PRId64 " to=%" PRId64
				 " count=%" PRId64
				 " msg=\"never read: records removed by retention, transaction markers of "
				 "another producer, or a client fault\"",
				 p->topic, p->partition, p->next_read, offset - 1, offset - p->next_read);
	}
	p->next_read = offset + 1;
}

tracked_record *
tracker_open(offset_tracker *t, const char *topic, int32_t partition, int64_t offset, int copies)
{
	partition_state *p = find_partition(t, topic, partition, true);
	tracked_record *r = calloc(1, sizeof(*r));

	note_skipped(t, p, offset);

	r->partition = p;
	r->offset = offset;
	r->copies_left = copies;
	if (p->tail)
		p->tail->next = r;
	else
		p->head = r;
	p->tail = r;
	p->records++;
	if (copies > 0)
		t->open_records++;
	advance(p);
	return copies > 0 ? r : NULL;
}

void
tracker_copy_done(offset_tracker *t, tracked_record *r)
{
	partition_state *p;

	if (r == NULL || r->copies_left <= 0)
		return;
	p = r->partition;
	if (--r->copies_left > 0)
		return;
	if (p->forgotten)
	{
		/* Its queue was dropped at revoke; only this record still pointed at it. */
		p->records--;
		free(r);
		free_partition_if_unused(t, p);
		return;
	}
	t->open_records--;
	advance(p);
}

static rd_kafka_topic_partition_list_t *
collect(offset_tracker *t, bool only_moved)
{
	rd_kafka_topic_partition_list_t *list = NULL;

	for (partition_state *p = t->partitions; p; p = p->next)
	{
		if (p->forgotten || p->committable < 0 || (only_moved && p->committable == p->committed))
			continue;
		if (list == NULL)
			list = rd_kafka_topic_partition_list_new(8);
		rd_kafka_topic_partition_list_add(list, p->topic, p->partition)->offset = p->committable;
		p->committed = p->committable;
	}
	return list;
}

rd_kafka_topic_partition_list_t *
tracker_take_committable(offset_tracker *t)
{
	return collect(t, true);
}

rd_kafka_topic_partition_list_t *
tracker_all_committable(offset_tracker *t)
{
	return collect(t, false);
}

void
tracker_forget(offset_tracker *t, const rd_kafka_topic_partition_list_t *partitions)
{
	for (int i = 0; i < partitions->cnt; i++)
	{
		partition_state *p =
			find_partition(t, partitions->elems[i].topic, partitions->elems[i].partition, false);
		tracked_record *r;
		tracked_record *next;

		if (p == NULL)
			continue;
		p->forgotten = true;
		/* Done records go now; open ones stay until their copies finish. */
		for (r = p->head; r; r = next)
		{
			next = r->next;
			if (r->copies_left == 0)
			{
				p->records--;
				free(r);
			}
			else
			{
				r->next = NULL;
				t->open_records--;
			}
		}
		p->head = p->tail = NULL;
		free_partition_if_unused(t, p);
	}
}

bool
tracker_has_open(const offset_tracker *t, const rd_kafka_topic_partition_list_t *partitions)
{
	for (int i = 0; i < partitions->cnt; i++)
		for (partition_state *p = t->partitions; p; p = p->next)
		{
			if (p->forgotten || p->partition != partitions->elems[i].partition ||
				strcmp(p->topic, partitions->elems[i].topic) != 0)
				continue;
			for (tracked_record *r = p->head; r; r = r->next)
				if (r->copies_left > 0)
					return true;
		}
	return false;
}

void
tracker_copy_withdrawn(offset_tracker *t, tracked_record *r)
{
	if (r == NULL)
		return;
	r->withdrawn = true;
	tracker_copy_done(t, r);
}

bool
tracker_record_in(const tracked_record *r, const rd_kafka_topic_partition_list_t *partitions)
{
	if (r == NULL)
		return false;
	for (int i = 0; i < partitions->cnt; i++)
		if (r->partition->partition == partitions->elems[i].partition &&
			strcmp(r->partition->topic, partitions->elems[i].topic) == 0)
			return true;
	return false;
}

int
tracker_open_records(const offset_tracker *t)
{
	return t->open_records;
}

void
tracker_free(offset_tracker *t)
{
	partition_state *p = t->partitions;

	while (p)
	{
		partition_state *next = p->next;
		tracked_record *r = p->head;

		while (r)
		{
			tracked_record *rn = r->next;

			free(r);
			r = rn;
		}
		free(p->topic);
		free(p);
		p = next;
	}
	free(t);
}

void
tracker_commit(offset_tracker *tracker, rd_kafka_t *consumer, bool all)
{
	rd_kafka_topic_partition_list_t *list =
		all ? tracker_all_committable(tracker) : tracker_take_committable(tracker);
	rd_kafka_resp_err_t err;

	if (list == NULL)
		return;
	err = rd_kafka_commit(consumer, list, all ? 0 : 1);
	if (err && err != RD_KAFKA_RESP_ERR__NO_OFFSET)
		log_warn("event=commit_failed error=\"%s\" msg=\"will commit again later\"",
				 rd_kafka_err2str(err));
	rd_kafka_topic_partition_list_destroy(list);
}

void
tracker_revoke(offset_tracker *tracker, rd_kafka_t *consumer,
			   const rd_kafka_topic_partition_list_t *partitions)
{
	tracker_commit(tracker, consumer, true);
	tracker_forget(tracker, partitions);
}
