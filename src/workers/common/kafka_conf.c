/*
 * kafka_conf.c: build a librdkafka configuration (see kafka_conf.h).
 */
#include "kafka_conf.h"

#include <stdio.h>
#include <string.h>

#include "log.h"

static bool
set_one(rd_kafka_conf_t *conf, const char *name, const char *value, char *errbuf,
		size_t errbuf_size)
{
	char rderr[512];

	if (rd_kafka_conf_set(conf, name, value, rderr, sizeof(rderr)) == RD_KAFKA_CONF_OK)
		return true;
	snprintf(errbuf, errbuf_size, "librdkafka property %s=%s: %s", name, value, rderr);
	return false;
}

rd_kafka_conf_t *
kafka_conf_build(const kafka_default *defaults, int n_defaults, const char *bootstrap_from_config,
				 const worker_options *opts, char *errbuf, size_t errbuf_size)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	bool have_bootstrap = bootstrap_from_config != NULL && bootstrap_from_config[0] != '\0';

	for (int i = 0; i < n_defaults; i++)
		if (!set_one(conf, defaults[i].name, defaults[i].value, errbuf, errbuf_size))
			goto fail;
	if (have_bootstrap &&
		!set_one(conf, "bootstrap.servers", bootstrap_from_config, errbuf, errbuf_size))
		goto fail;
	for (int i = 0; i < opts->n_kafka_props; i++)
	{
		if (!set_one(conf, opts->kafka_props[i].name, opts->kafka_props[i].value, errbuf,
					 errbuf_size))
			goto fail;
		if (strcmp(opts->kafka_props[i].name, "bootstrap.servers") == 0 ||
			strcmp(opts->kafka_props[i].name, "metadata.broker.list") == 0)
			have_bootstrap = true;
	}
	if (!have_bootstrap)
	{
		snprintf(errbuf, errbuf_size,
				 "no Kafka bootstrap servers: set wal_delivery.settings.kafka_bootstrap_servers "
				 "or pass -X bootstrap.servers=HOST:PORT");
		goto fail;
	}
	return conf;

fail:
	rd_kafka_conf_destroy(conf);
	return NULL;
}

void
kafka_take_assignment(rd_kafka_t *rk, rd_kafka_topic_partition_list_t *parts)
{
	log_info("event=assigned partitions=%d", parts->cnt);
	rd_kafka_assign(rk, parts);
	rd_kafka_resume_partitions(rk, parts);
}
