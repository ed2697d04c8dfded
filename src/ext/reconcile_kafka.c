/*
 * reconcile_kafka.c: the reconciler's requests to Kafka's admin API.
 *
 * Outside any transaction: metadata says which desired topics are missing, short of
 * partitions or existing; the missing are created with the owned settings, the short
 * grow, and the owned settings of the existing are read and set where they differ,
 * keeping every other override a topic has. A topic wal_delivery did not create and its
 * row does not adopt is left alone. Each request has a timeout and is waited for in short
 * steps, so a shutdown is never held up by Kafka.
 */
#include "postgres.h"

#include "lib/stringinfo.h"
#include "postmaster/interrupt.h"

#include <librdkafka/rdkafka.h>

#include "kafka_producer.h"
#include "reconcile_topics.h"
#include "settings.h"

static const int admin_timeout_ms = 15000;
static const int metadata_timeout_ms = 3000;

static rd_kafka_t *admin = NULL;

/* Their names, in the order of DesiredTopic.owned_values. */
static const char *const owned_config_names[N_OWNED_CONFIGS] = {
	"retention.ms", "min.insync.replicas", "max.message.bytes"};

/*
 * Errors that no retry can fix: the request itself is unacceptable to Kafka. Not an
 * invalid replication factor: Kafka says so when fewer brokers are up than it needs.
 */
static bool
is_permanent_admin_error(rd_kafka_resp_err_t err)
{
	switch (err)
	{
		case RD_KAFKA_RESP_ERR_INVALID_PARTITIONS:
		case RD_KAFKA_RESP_ERR_INVALID_CONFIG:
		case RD_KAFKA_RESP_ERR_POLICY_VIOLATION:
		case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
		case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
		case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
		case RD_KAFKA_RESP_ERR_INVALID_REPLICA_ASSIGNMENT:
			return true;
		default:
			return false;
	}
}

static void
fail_topic(DesiredTopic *t, rd_kafka_resp_err_t err, const char *what, const char *detail)
{
	t->ready = false;
	t->permanent = is_permanent_admin_error(err);
	t->error = psprintf("%s: %s", what, detail && detail[0] ? detail : rd_kafka_err2str(err));
}

static bool
ensure_admin_client(char *errbuf, size_t errbuf_size)
{
	rd_kafka_conf_t *conf;

	if (admin != NULL)
		return true;
	if (kafka_bootstrap_servers == NULL || kafka_bootstrap_servers[0] == '\0')
	{
		snprintf(errbuf, errbuf_size, "wal_delivery.kafka_bootstrap_servers is not set");
		return false;
	}
	conf = rd_kafka_conf_new();
	if (!kafka_conf_apply(conf, kafka_bootstrap_servers, kafka_properties, errbuf, errbuf_size))
	{
		rd_kafka_conf_destroy(conf);
		return false;
	}
	admin = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errbuf, errbuf_size);
	if (admin == NULL)
		rd_kafka_conf_destroy(conf); /* rd_kafka_new frees it only on success */
	return admin != NULL;
}

/* One admin request: the queue its reply comes to, its options, and the reply. */
typedef struct AdminRequest
{
	rd_kafka_queue_t *queue;
	rd_kafka_AdminOptions_t *options;
	rd_kafka_event_t *reply;
} AdminRequest;

static void
admin_request_start(AdminRequest *req, rd_kafka_admin_op_t op)
{
	char errstr[256];

	req->queue = rd_kafka_queue_new(admin);
	req->options = rd_kafka_AdminOptions_new(admin, op);
	req->reply = NULL;
	rd_kafka_AdminOptions_set_request_timeout(req->options, admin_timeout_ms, errstr,
											  sizeof(errstr));
	if (op == RD_KAFKA_ADMIN_OP_CREATETOPICS || op == RD_KAFKA_ADMIN_OP_CREATEPARTITIONS)
		rd_kafka_AdminOptions_set_operation_timeout(req->options, admin_timeout_ms, errstr,
													sizeof(errstr));
}

/*
 * Waits for the reply in short steps, so a shutdown is never held up by Kafka. False when
 * the whole request failed, got no reply or the worker is stopping: then every topic in
 * it that was still ready has failed with what.
 */
static bool
admin_request_answered(AdminRequest *req, DesiredTopic **topics, int n, const char *what)
{
	for (int waited = 0;
		 req->reply == NULL && waited < admin_timeout_ms + 5000 && !ShutdownRequestPending;
		 waited += 200)
		req->reply = rd_kafka_queue_poll(req->queue, 200);
	if (req->reply != NULL && !rd_kafka_event_error(req->reply))
		return true;
	for (int i = 0; i < n; i++)
		if (topics[i]->ready)
			fail_topic(topics[i],
					   req->reply ? rd_kafka_event_error(req->reply) : RD_KAFKA_RESP_ERR__TIMED_OUT,
					   what, req->reply ? rd_kafka_event_error_string(req->reply) : NULL);
	return false;
}

static void
admin_request_end(AdminRequest *req)
{
	if (req->reply)
		rd_kafka_event_destroy(req->reply);
	rd_kafka_AdminOptions_destroy(req->options);
	rd_kafka_queue_destroy(req->queue);
}

static DesiredTopic *
find_topic(DesiredTopic **topics, int n, const char *name)
{
	for (int i = 0; i < n; i++)
		if (strcmp(topics[i]->name, name) == 0)
			return topics[i];
	return NULL;
}

/* One topic's result within an admin request: an error marks that topic failed. */
static void
admin_topic_result(DesiredTopic **topics, int n, const char *name, rd_kafka_resp_err_t err,
				   const char *what, const char *detail)
{
	DesiredTopic *t = find_topic(topics, n, name);

	if (err != RD_KAFKA_RESP_ERR_NO_ERROR && t != NULL)
		fail_topic(t, err, what, detail);
}

/*
 * Kafka's "invalid replication factor" names neither count when brokers are down; say
 * how many it has, which is what an operator decides on.
 */
static void
explain_replication_failure(DesiredTopic *t, int live_brokers)
{
	if (t->error != NULL && strstr(t->error, "eplication factor") != NULL)
		t->error =
			psprintf("%s (replication_factor %d, %d broker%s up: start brokers or lower the "
					 "replication factor; its records wait in the outbox)",
					 t->error, t->replication_factor, live_brokers, live_brokers == 1 ? "" : "s");
}

static void
create_topics(DesiredTopic **missing, int n, int live_brokers)
{
	rd_kafka_NewTopic_t **requests = palloc(sizeof(rd_kafka_NewTopic_t *) * n);
	AdminRequest req;
	char errstr[256];
	int sent = 0;

	for (int i = 0; i < n; i++)
	{
		rd_kafka_NewTopic_t *nt =
			rd_kafka_NewTopic_new(missing[i]->name, missing[i]->partitions,
								  missing[i]->replication_factor, errstr, sizeof(errstr));

		if (nt == NULL)
		{
			fail_topic(missing[i], RD_KAFKA_RESP_ERR_INVALID_CONFIG, "cannot create topic", errstr);
			continue;
		}
		for (int c = 0; c < N_OWNED_CONFIGS; c++)
			rd_kafka_NewTopic_set_config(nt, owned_config_names[c], missing[i]->owned_values[c]);
		requests[sent++] = nt;
		missing[i]->ready = true; /* until the result says otherwise */
	}
	if (sent > 0)
	{
		admin_request_start(&req, RD_KAFKA_ADMIN_OP_CREATETOPICS);
		rd_kafka_CreateTopics(admin, requests, sent, req.options, req.queue);
		if (admin_request_answered(&req, missing, n, "cannot create topic"))
		{
			size_t cnt;
			const rd_kafka_topic_result_t **results = rd_kafka_CreateTopics_result_topics(
				rd_kafka_event_CreateTopics_result(req.reply), &cnt);

			for (size_t r = 0; r < cnt; r++)
			{
				rd_kafka_resp_err_t err = rd_kafka_topic_result_error(results[r]);

				DesiredTopic *t = find_topic(missing, n, rd_kafka_topic_result_name(results[r]));

				/*
				 * It was missing when this round looked: ours, even if it appeared in the
				 * meantime (a broker that auto-creates topics on a client's metadata request
				 * does that). A topic that existed before is not (keep_foreign_topic).
				 */
				if (t != NULL)
					t->created = err == RD_KAFKA_RESP_ERR_NO_ERROR ||
								 err == RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS;
				if (err == RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS)
					err = RD_KAFKA_RESP_ERR_NO_ERROR;
				admin_topic_result(missing, n, rd_kafka_topic_result_name(results[r]), err,
								   "cannot create topic",
								   rd_kafka_topic_result_error_string(results[r]));
			}
		}
		admin_request_end(&req);
		rd_kafka_NewTopic_destroy_array(requests, sent);
	}
	for (int i = 0; i < n; i++)
	{
		missing[i]->exists = missing[i]->ready ? 1 : 0;
		if (missing[i]->exists)
			missing[i]->kafka_partitions = missing[i]->partitions;
		explain_replication_failure(missing[i], live_brokers);
	}
}

static void
grow_partitions(DesiredTopic **short_topics, int n)
{
	rd_kafka_NewPartitions_t **requests = palloc(sizeof(rd_kafka_NewPartitions_t *) * n);
	AdminRequest req;
	char errstr[256];

	for (int i = 0; i < n; i++)
		requests[i] = rd_kafka_NewPartitions_new(short_topics[i]->name, short_topics[i]->partitions,
												 errstr, sizeof(errstr));
	admin_request_start(&req, RD_KAFKA_ADMIN_OP_CREATEPARTITIONS);
	rd_kafka_CreatePartitions(admin, requests, n, req.options, req.queue);
	if (admin_request_answered(&req, short_topics, n, "cannot add partitions"))
	{
		size_t cnt;
		const rd_kafka_topic_result_t **results = rd_kafka_CreatePartitions_result_topics(
			rd_kafka_event_CreatePartitions_result(req.reply), &cnt);

		for (size_t r = 0; r < cnt; r++)
		{
			DesiredTopic *t = find_topic(short_topics, n, rd_kafka_topic_result_name(results[r]));

			if (t == NULL)
				continue;
			if (rd_kafka_topic_result_error(results[r]) != RD_KAFKA_RESP_ERR_NO_ERROR)
				fail_topic(t, rd_kafka_topic_result_error(results[r]), "cannot add partitions",
						   rd_kafka_topic_result_error_string(results[r]));
			else
				t->kafka_partitions = t->partitions;
		}
	}
	admin_request_end(&req);
	rd_kafka_NewPartitions_destroy_array(requests, n);
}

/*
 * Keeps what DescribeConfigs says of one topic: its own overrides (to send back
 * unchanged) and whether an owned setting differs from what we ask for.
 */
static void
read_topic_configs(DesiredTopic *t, const rd_kafka_ConfigResource_t *resource)
{
	size_t cnt;
	const rd_kafka_ConfigEntry_t **entries = rd_kafka_ConfigResource_configs(resource, &cnt);

	t->overrides = palloc0(sizeof(ConfigOverride) * Max(cnt, 1));
	for (size_t e = 0; e < cnt; e++)
	{
		const char *name = rd_kafka_ConfigEntry_name(entries[e]);
		const char *value = rd_kafka_ConfigEntry_value(entries[e]);
		bool owned = false;

		if (strcmp(name, "cleanup.policy") == 0 && value != NULL)
			t->compacted = strstr(value, "compact") != NULL;
		if (strcmp(name, "max.message.bytes") == 0 && value != NULL)
			t->kafka_max_message_bytes = strtoll(value, NULL, 10);

		for (int c = 0; c < N_OWNED_CONFIGS; c++)
			if (strcmp(name, owned_config_names[c]) == 0)
			{
				owned = true;
				if (value == NULL || strcmp(value, t->owned_values[c]) != 0)
					t->config_differs = true;
			}
		if (owned ||
			rd_kafka_ConfigEntry_source(entries[e]) != RD_KAFKA_CONFIG_SOURCE_DYNAMIC_TOPIC_CONFIG)
			continue;
		if (value == NULL)
		{
			/* A sensitive override Kafka will not show: altering would drop it. */
			fail_topic(t, RD_KAFKA_RESP_ERR_INVALID_CONFIG, "cannot set topic config",
					   psprintf("its setting %s is sensitive and would be lost; set %s, %s and %s "
								"by hand",
								name, owned_config_names[0], owned_config_names[1],
								owned_config_names[2]));
			return;
		}
		t->overrides[t->n_overrides].name = pstrdup(name);
		t->overrides[t->n_overrides].value = pstrdup(value);
		t->n_overrides++;
	}
}

/* Reads the settings of existing topics (DescribeConfigs). */
static void
describe_topic_configs(DesiredTopic **topics, int n)
{
	rd_kafka_ConfigResource_t **resources = palloc(sizeof(rd_kafka_ConfigResource_t *) * n);
	AdminRequest req;

	for (int i = 0; i < n; i++)
		resources[i] = rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, topics[i]->name);
	admin_request_start(&req, RD_KAFKA_ADMIN_OP_DESCRIBECONFIGS);
	rd_kafka_DescribeConfigs(admin, resources, n, req.options, req.queue);
	if (admin_request_answered(&req, topics, n, "cannot read topic config"))
	{
		size_t cnt;
		const rd_kafka_ConfigResource_t **results = rd_kafka_DescribeConfigs_result_resources(
			rd_kafka_event_DescribeConfigs_result(req.reply), &cnt);

		for (size_t r = 0; r < cnt; r++)
		{
			DesiredTopic *t = find_topic(topics, n, rd_kafka_ConfigResource_name(results[r]));

			if (t == NULL)
				continue;
			if (rd_kafka_ConfigResource_error(results[r]) != RD_KAFKA_RESP_ERR_NO_ERROR)
				fail_topic(t, rd_kafka_ConfigResource_error(results[r]), "cannot read topic config",
						   rd_kafka_ConfigResource_error_string(results[r]));
			else
				read_topic_configs(t, results[r]);
		}
	}
	admin_request_end(&req);
	rd_kafka_ConfigResource_destroy_array(resources, n);
}

/*
 * Sets the owned settings where they differ. AlterConfigs (librdkafka 2.0 has no
 * IncrementalAlterConfigs) replaces a topic's whole set of overrides, so each request
 * carries the topic's own overrides, unchanged, with ours.
 */
static void
alter_topic_configs(DesiredTopic **topics, int n)
{
	rd_kafka_ConfigResource_t **resources = palloc(sizeof(rd_kafka_ConfigResource_t *) * n);
	AdminRequest req;

	for (int i = 0; i < n; i++)
	{
		resources[i] = rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, topics[i]->name);
		for (int o = 0; o < topics[i]->n_overrides; o++)
			rd_kafka_ConfigResource_set_config(resources[i], topics[i]->overrides[o].name,
											   topics[i]->overrides[o].value);
		for (int c = 0; c < N_OWNED_CONFIGS; c++)
			rd_kafka_ConfigResource_set_config(resources[i], owned_config_names[c],
											   topics[i]->owned_values[c]);
	}
	admin_request_start(&req, RD_KAFKA_ADMIN_OP_ALTERCONFIGS);
	rd_kafka_AlterConfigs(admin, resources, n, req.options, req.queue);
	if (admin_request_answered(&req, topics, n, "cannot set topic config"))
	{
		size_t cnt;
		const rd_kafka_ConfigResource_t **results = rd_kafka_AlterConfigs_result_resources(
			rd_kafka_event_AlterConfigs_result(req.reply), &cnt);

		for (size_t r = 0; r < cnt; r++)
			admin_topic_result(topics, n, rd_kafka_ConfigResource_name(results[r]),
							   rd_kafka_ConfigResource_error(results[r]), "cannot set topic config",
							   rd_kafka_ConfigResource_error_string(results[r]));
	}
	admin_request_end(&req);
	rd_kafka_ConfigResource_destroy_array(resources, n);
}

/*
 * A topic that exists in Kafka, which wal_delivery did not create and its row does not
 * adopt: another application's, perhaps. Nothing is altered and nothing is shipped into it
 * (reported as not in Kafka, so its records wait); the row's status says why and what
 * contradicts the row.
 */
static void
keep_foreign_topic(DesiredTopic *t)
{
	StringInfoData why;

	initStringInfo(&why);
	appendStringInfoString(&why,
						   "exists in Kafka but wal_delivery did not create it: its settings are "
						   "left alone and nothing is shipped into it until its row in "
						   "wal_delivery.topics says adopt = true");
	if (t->compacted)
		appendStringInfoString(&why, "; it is compacted (cleanup.policy), which drops records "
									 "and refuses those without a message key");
	if (t->kafka_max_message_bytes >= 0 && t->kafka_max_message_bytes < t->max_message_bytes)
		appendStringInfo(&why,
						 "; its max.message.bytes is " INT64_FORMAT ", under the %d the row needs",
						 t->kafka_max_message_bytes, t->max_message_bytes);
	t->ready = false;
	t->permanent = true;
	t->exists = 0;
	t->error = why.data;
}

/* A compacted topic would drop records and refuse keyless ones: nothing is shipped there. */
static void
refuse_compacted_topic(DesiredTopic *t)
{
	t->ready = false;
	t->permanent = true;
	t->exists = 0;
	t->error = pstrdup("its cleanup.policy compacts, which drops records and refuses those "
					   "without a message key: set cleanup.policy=delete in Kafka (wal_delivery "
					   "does not change it)");
}

/* The owned settings of existing topics, changed only where Kafka differs. */
static void
apply_topic_configs(DesiredTopic **existing, int n)
{
	DesiredTopic **differing = palloc(sizeof(DesiredTopic *) * Max(n, 1));
	int n_differing = 0;

	describe_topic_configs(existing, n);
	for (int i = 0; i < n; i++)
	{
		DesiredTopic *t = existing[i];

		if (!t->ready)
			continue;
		if (!t->managed)
			keep_foreign_topic(t);
		else if (t->compacted)
			refuse_compacted_topic(t);
		else if (t->config_differs)
		{
			/* Adopted from another application: never lower a limit its messages need. */
			if (t->kafka_max_message_bytes > t->max_message_bytes)
				t->owned_values[2] = psprintf(INT64_FORMAT, t->kafka_max_message_bytes);
			differing[n_differing++] = t;
		}
	}
	if (n_differing > 0)
		alter_topic_configs(differing, n_differing);
}

/* Sorts the desired topics by what Kafka has: missing, short of partitions, existing. */
static void
compare_with_metadata(DesiredTopic *topics, int count, const struct rd_kafka_metadata *md,
					  DesiredTopic **missing, int *n_missing, DesiredTopic **short_topics,
					  int *n_short, DesiredTopic **existing, int *n_existing)
{
	for (int i = 0; i < count; i++)
	{
		const struct rd_kafka_metadata_topic *found = NULL;

		topics[i].ready = true;
		for (int m = 0; m < md->topic_cnt; m++)
			if (strcmp(md->topics[m].topic, topics[i].name) == 0 &&
				md->topics[m].err != RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART)
				found = &md->topics[m];
		topics[i].exists = found != NULL;
		if (found == NULL)
		{
			missing[(*n_missing)++] = &topics[i];
			continue;
		}
		topics[i].kafka_partitions = found->partition_cnt;
		existing[(*n_existing)++] = &topics[i];
		if (found->partition_cnt < topics[i].partitions && topics[i].managed)
			short_topics[(*n_short)++] = &topics[i];
		else if (found->partition_cnt > 0 &&
				 found->partitions[0].replica_cnt != topics[i].replication_factor)
			/* Kafka cannot change this in place; records still flow, so it is a note. */
			topics[i].error = psprintf(
				"replication factor is %d in Kafka, %d configured: change it with a partition "
				"reassignment",
				found->partitions[0].replica_cnt, topics[i].replication_factor);
	}
}

/*
 * Brings Kafka in line with topics[]; each topic's outcome lands in its exists, ready and
 * error. A failure on one topic is that topic's only.
 */
void
apply_to_kafka(DesiredTopic *topics, int count, BeforeCreateTopics before_create)
{
	const struct rd_kafka_metadata *md = NULL;
	DesiredTopic **missing = palloc(sizeof(DesiredTopic *) * Max(count, 1));
	DesiredTopic **short_topics = palloc(sizeof(DesiredTopic *) * Max(count, 1));
	DesiredTopic **existing = palloc(sizeof(DesiredTopic *) * Max(count, 1));
	int n_missing = 0, n_short = 0, n_existing = 0;
	int live_brokers;
	char errbuf[512];
	rd_kafka_resp_err_t err;

	if (!ensure_admin_client(errbuf, sizeof(errbuf)))
	{
		for (int i = 0; i < count; i++)
			fail_topic(&topics[i], RD_KAFKA_RESP_ERR__INVALID_ARG, "no Kafka client", errbuf);
		return;
	}
	/* Short: a shutdown waits for this call. */
	err = rd_kafka_metadata(admin, 1, NULL, &md, metadata_timeout_ms);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		for (int i = 0; i < count; i++)
			fail_topic(&topics[i], err, "Kafka unreachable", NULL);
		return;
	}
	compare_with_metadata(topics, count, md, missing, &n_missing, short_topics, &n_short, existing,
						  &n_existing);
	live_brokers = md->broker_cnt;
	rd_kafka_metadata_destroy(md);

	if (n_missing > 0)
	{
		before_create(missing, n_missing);
		create_topics(missing, n_missing, live_brokers);
	}
	if (n_short > 0)
		grow_partitions(short_topics, n_short);
	if (n_existing > 0)
		apply_topic_configs(existing, n_existing);
}

void
reconcile_kafka_disconnect(void)
{
	if (admin != NULL)
		rd_kafka_destroy(admin);
	admin = NULL;
}
