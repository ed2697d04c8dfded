/*
 * role_lifecycle.c: the steps consume, retry and dlq share (see role_lifecycle.h).
 */
#include "role_lifecycle.h"

#include "clock.h"
#include "kafka_prefetch.h"
#include "log.h"
#include "stop_signal.h"

#include <stdio.h>
#include <stdlib.h>

static rd_kafka_t *
create_consumer(const worker_options *opts, const config_watch *watch, const role_kafka *kafka,
				char *errbuf, size_t errbuf_size)
{
	/* The prefetch bound first: the role's defaults, then -X, may change it. */
	kafka_default *defaults =
		malloc(sizeof(*defaults) * (KAFKA_PREFETCH_N_DEFAULTS + kafka->n_consumer_defaults));
	int n;
	rd_kafka_conf_t *conf;
	rd_kafka_t *rk;

	if (defaults == NULL)
	{
		snprintf(errbuf, errbuf_size, "out of memory");
		return NULL;
	}
	n = kafka_prefetch_defaults(defaults);
	for (int i = 0; i < kafka->n_consumer_defaults; i++)
		defaults[n++] = kafka->consumer_defaults[i];
	conf = kafka_conf_build(defaults, n, config_watch_current(watch)->kafka_bootstrap_servers, opts,
							errbuf, errbuf_size);
	free(defaults);
	if (conf == NULL)
		return NULL;
	kafka_prefetch_log(conf);
	rd_kafka_conf_set_rebalance_cb(conf, kafka->on_rebalance);
	rd_kafka_conf_set_opaque(conf, kafka->state);
	rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errbuf, errbuf_size);
	if (rk != NULL)
		rd_kafka_poll_set_consumer(rk);
	return rk;
}

bool
role_connect_kafka(const worker_options *opts, const config_watch *watch, const role_kafka *kafka,
				   rd_kafka_t **consumer, handoff_producer **producer)
{
	char errbuf[512];

	*consumer = create_consumer(opts, watch, kafka, errbuf, sizeof(errbuf));
	*producer = *consumer
					? handoff_producer_new(opts, config_watch_current(watch), kafka->on_handed_off,
										   kafka->state, errbuf, sizeof(errbuf))
					: NULL;
	if (*consumer == NULL || *producer == NULL)
	{
		log_error("event=kafka_setup_failed msg=\"%s\"", errbuf);
		return false;
	}
	return true;
}

rd_kafka_resp_err_t
role_subscribe(rd_kafka_t *consumer, char *const *topics, int n)
{
	rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new(n);
	rd_kafka_resp_err_t err;

	for (int i = 0; i < n; i++)
		rd_kafka_topic_partition_list_add(list, topics[i], RD_KAFKA_PARTITION_UA);
	err = rd_kafka_subscribe(consumer, list);
	rd_kafka_topic_partition_list_destroy(list);
	return err;
}

bool
role_is_record(const rd_kafka_message_t *rkm)
{
	if (rkm->err == RD_KAFKA_RESP_ERR_NO_ERROR)
		return true;
	if (rkm->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
		log_warn("event=consume_error error=\"%s\"", rd_kafka_message_errstr(rkm));
	return false;
}

void
role_pause_fetching(rd_kafka_t *consumer)
{
	rd_kafka_topic_partition_list_t *assignment = NULL;

	if (rd_kafka_assignment(consumer, &assignment) == RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		rd_kafka_pause_partitions(consumer, assignment);
		rd_kafka_topic_partition_list_destroy(assignment);
	}
}

bool
role_drain_begins(int64_t *deadline)
{
	if (!stop_requested || *deadline != 0)
		return false;
	*deadline = now_ms() + ROLE_DRAIN_MS;
	return true;
}

bool
role_drained(int64_t deadline, int in_hand)
{
	return deadline && (in_hand == 0 || now_ms() > deadline);
}

void
role_close_consumer(rd_kafka_t *consumer)
{
	rd_kafka_consumer_close(consumer);
	rd_kafka_destroy(consumer);
}
