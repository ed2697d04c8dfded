/*
 * retry_lanes.c: the messages `wal-worker retry` holds per assigned partition (a lane,
 * kept in Kafka order), and its state per destination (see retry_state.h).
 */
#include <stdlib.h>
#include <string.h>

#include "retry/retry_state.h"

lane *
lane_find(retry_state *st, const char *topic, int32_t partition)
{
	for (int i = 0; i < st->n_lanes; i++)
		if (st->lanes[i]->partition == partition && strcmp(st->lanes[i]->topic, topic) == 0)
			return st->lanes[i];
	return NULL;
}

/* Lanes live until the worker stops, so a delivery in flight may point at a revoked one. */
lane *
lane_get(retry_state *st, const char *topic, int32_t partition)
{
	lane *l = lane_find(st, topic, partition);

	if (l)
		return l;
	l = calloc(1, sizeof(*l));
	l->topic = strdup(topic);
	l->partition = partition;
	l->step = retry_topic_step(topic, config_watch_current(st->watch)->retry_topic_prefix);
	st->lanes = realloc(st->lanes, sizeof(lane *) * (st->n_lanes + 1));
	st->lanes[st->n_lanes++] = l;
	return l;
}

dest_state *
dest_get(retry_state *st, const char *name)
{
	const destination_config *d;
	dest_state *ds;

	for (int i = 0; i < st->n_dests; i++)
		if (strcmp(st->dests[i]->name, name) == 0)
			return st->dests[i];
	ds = calloc(1, sizeof(*ds));
	ds->name = strdup(name);
	d = config_find_destination(config_watch_current(st->watch), name);
	ds->window = d ? d->max_in_flight : 1;
	ds->paused = pause_state_is_paused(st->pauses, name);
	st->dests = realloc(st->dests, sizeof(dest_state *) * (st->n_dests + 1));
	st->dests[st->n_dests++] = ds;
	return ds;
}

/* The destination whose retry partition this is, NULL when none. */
const destination_config *
partition_owner(const control_plane_config *config, int32_t partition)
{
	for (int i = 0; i < config->n_destinations; i++)
		if (config->destinations[i].retry_partition == partition)
			return &config->destinations[i];
	return NULL;
}

void
lane_push_tail(lane *l, queued *q)
{
	q->next = NULL;
	if (l->tail)
		l->tail->next = q;
	else
		l->head = q;
	l->tail = q;
	l->n++;
}

void
lane_push_head(lane *l, queued *q)
{
	q->next = l->head;
	l->head = q;
	if (l->tail == NULL)
		l->tail = q;
	l->n++;
}

/* Takes q, which follows prev (NULL: q is the head), out of the lane. */
queued *
lane_take(lane *l, queued *prev, queued *q)
{
	if (prev)
		prev->next = q->next;
	else
		l->head = q->next;
	if (l->tail == q)
		l->tail = prev;
	l->n--;
	q->next = NULL;
	return q;
}

queued *
lane_pop(lane *l)
{
	return lane_take(l, NULL, l->head);
}

void
queued_free(queued *q)
{
	retry_message_clear(&q->m);
	free(q);
}

/* The lane's first due message and the one before it; NULL when none is due. */
queued *
first_due(lane *l, int64_t now, queued **prev_out)
{
	queued *prev = NULL;

	for (queued *q = l->head; q; prev = q, q = q->next)
		if (q->m.due_ms <= now)
		{
			*prev_out = prev;
			return q;
		}
	return NULL;
}

void
drop_lane_messages(retry_state *st, lane *l)
{
	while (l->head)
		queued_free(lane_pop(l));
	(void) st;
}

void
free_lanes_and_dests(retry_state *st)
{
	for (int i = 0; i < st->n_lanes; i++)
	{
		drop_lane_messages(st, st->lanes[i]);
		free(st->lanes[i]->topic);
		free(st->lanes[i]);
	}
	free(st->lanes);
	for (int i = 0; i < st->n_dests; i++)
	{
		free(st->dests[i]->name);
		free(st->dests[i]);
	}
	free(st->dests);
}
