/*
 * partition_backlog.c: see partition_backlog.h.
 */
#include "retry/partition_backlog.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define QUERY_TIMEOUT_MS 2000

typedef struct watched
{
	char *topic;
	int32_t partition;
	bool on;
	int64_t backlog;
} watched;

struct partition_backlog
{
	rd_kafka_t *rk;
	long interval_ms;
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t wake;
	bool stopping;
	watched *items;
	int n_items;
};

static watched *
find(partition_backlog *pb, const char *topic, int32_t partition)
{
	for (int i = 0; i < pb->n_items; i++)
		if (pb->items[i].partition == partition && strcmp(pb->items[i].topic, topic) == 0)
			return &pb->items[i];
	return NULL;
}

/* One round: asks the broker outside the lock, stores the answers under it. */
static void
measure(partition_backlog *pb)
{
	rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new(8);

	pthread_mutex_lock(&pb->lock);
	for (int i = 0; i < pb->n_items; i++)
		if (pb->items[i].on)
			rd_kafka_topic_partition_list_add(list, pb->items[i].topic, pb->items[i].partition);
	pthread_mutex_unlock(&pb->lock);
	if (list->cnt > 0 && rd_kafka_committed(pb->rk, list, QUERY_TIMEOUT_MS) == 0)
		for (int i = 0; i < list->cnt; i++)
		{
			rd_kafka_topic_partition_t *tp = &list->elems[i];
			int64_t low = 0, high = 0, from;
			watched *w;

			if (rd_kafka_query_watermark_offsets(pb->rk, tp->topic, tp->partition, &low, &high,
												 QUERY_TIMEOUT_MS) != 0)
				continue;
			from = tp->offset > low ? tp->offset : low;
			pthread_mutex_lock(&pb->lock);
			w = find(pb, tp->topic, tp->partition);
			if (w && w->on)
				w->backlog = high > from ? high - from : 0;
			pthread_mutex_unlock(&pb->lock);
		}
	rd_kafka_topic_partition_list_destroy(list);
}

static void *
run(void *arg)
{
	partition_backlog *pb = arg;

	pthread_mutex_lock(&pb->lock);
	while (!pb->stopping)
	{
		struct timespec until;

		pthread_mutex_unlock(&pb->lock);
		measure(pb);
		pthread_mutex_lock(&pb->lock);
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += pb->interval_ms / 1000;
		until.tv_nsec += (pb->interval_ms % 1000) * 1000000L;
		if (until.tv_nsec >= 1000000000L)
		{
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		if (!pb->stopping)
			pthread_cond_timedwait(&pb->wake, &pb->lock, &until);
	}
	pthread_mutex_unlock(&pb->lock);
	return NULL;
}

partition_backlog *
partition_backlog_start(rd_kafka_t *consumer, long interval_ms)
{
	partition_backlog *pb = calloc(1, sizeof(*pb));

	pb->rk = consumer;
	pb->interval_ms = interval_ms > 0 ? interval_ms : 1000;
	pthread_mutex_init(&pb->lock, NULL);
	pthread_cond_init(&pb->wake, NULL);
	pthread_create(&pb->thread, NULL, run, pb);
	return pb;
}

void
partition_backlog_watch(partition_backlog *pb, const char *topic, int32_t partition, bool on)
{
	watched *w;

	pthread_mutex_lock(&pb->lock);
	w = find(pb, topic, partition);
	if (w == NULL)
	{
		pb->items = realloc(pb->items, sizeof(watched) * (pb->n_items + 1));
		w = &pb->items[pb->n_items++];
		w->topic = strdup(topic);
		w->partition = partition;
	}
	w->on = on;
	w->backlog = -1;
	pthread_mutex_unlock(&pb->lock);
}

int64_t
partition_backlog_get(partition_backlog *pb, const char *topic, int32_t partition)
{
	int64_t backlog = -1;
	watched *w;

	pthread_mutex_lock(&pb->lock);
	w = find(pb, topic, partition);
	if (w && w->on)
		backlog = w->backlog;
	pthread_mutex_unlock(&pb->lock);
	return backlog;
}

void
partition_backlog_stop(partition_backlog *pb)
{
	pthread_mutex_lock(&pb->lock);
	pb->stopping = true;
	pthread_cond_signal(&pb->wake);
	pthread_mutex_unlock(&pb->lock);
	pthread_join(pb->thread, NULL);
	for (int i = 0; i < pb->n_items; i++)
		free(pb->items[i].topic);
	free(pb->items);
	pthread_mutex_destroy(&pb->lock);
	pthread_cond_destroy(&pb->wake);
	free(pb);
}
