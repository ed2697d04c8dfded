/*
 * reconcile_topics.h: the topics the reconciler wants in Kafka, shared by its loop
 * (reconcile.c) and its requests to Kafka (reconcile_kafka.c).
 */
#ifndef RECONCILE_TOPICS_H
#define RECONCILE_TOPICS_H

#include "postgres.h"

/* The topic settings the system owns; AlterConfigs keeps every other override. */
#define N_OWNED_CONFIGS 3

typedef struct ConfigOverride
{
	char *name;
	char *value;
} ConfigOverride;

typedef struct DesiredTopic
{
	char *name;
	char *role;
	int partitions;
	int replication_factor;
	int min_insync_replicas;
	int64 retention_ms;
	int max_message_bytes;
	bool managed; /* wal_delivery created it or its row adopts it: its settings are ours */
	char *owned_values[N_OWNED_CONFIGS]; /* the owned settings as Kafka writes them */
	/* what Kafka has */
	int exists;                /* 1, 0, or -1 when Kafka did not say */
	int kafka_partitions;      /* when it exists */
	ConfigOverride *overrides; /* its own settings, from DescribeConfigs */
	int n_overrides;
	bool config_differs; /* an owned setting is not what we ask for */
	bool compacted;      /* its cleanup.policy compacts: records without a key are refused */
	int64 kafka_max_message_bytes; /* Kafka's max.message.bytes, -1 when not read */
	bool created;                  /* created by this round (not by someone else meanwhile) */
	/* outcome */
	bool ready;
	bool permanent;
	char *error;
} DesiredTopic;

/*
 * Brings Kafka in line with topics[]; each topic's outcome lands in its exists, ready and
 * error. A failure on one topic is that topic's only. before_create is called with the
 * topics Kafka does not have, before they are created, and must have recorded them
 * durably as wal_delivery's by the time it returns.
 */
typedef void (*BeforeCreateTopics)(DesiredTopic **missing, int n);
void apply_to_kafka(DesiredTopic *topics, int count, BeforeCreateTopics before_create);

/* Drops the admin client (the Kafka settings changed, or the worker stops). */
void reconcile_kafka_disconnect(void);

#endif
