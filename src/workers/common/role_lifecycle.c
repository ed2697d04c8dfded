/*
 * role_lifecycle.c: the steps consume, retry and dlq share (see role_lifecycle.h).
 */
#include "role_lifecycle.h"

#include "log.h"

static rd_kafka_t *
create_consumer(const worker_options *opts, const config_watch *watch, const role_kafka *kafka,
				char *errbuf, size_t errbuf_size)
{
	rd_kafka_conf_t *conf = kafka_conf_build(kafka->consumer_defaults, kafka->n_consumer_defaults,
											 config_watch_current(watch)->kafka_bootstrap_servers,
											 opts, errbuf, errbuf_size);
	rd_kafka_t *rk;

	if (conf == NULL)
		return NULL;
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

void
role_close_consumer(rd_kafka_t *consumer)
{
	rd_kafka_consumer_close(consumer);
	rd_kafka_destroy(consumer);
}
