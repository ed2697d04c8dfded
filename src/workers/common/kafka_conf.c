/*
 * kafka_conf.c: build a librdkafka configuration (see kafka_conf.h).
 */
#include "kafka_conf.h"

#include <stdio.h>
#include <string.h>

#include "log.h"
#include "stop_signal.h"

/*
 * librdkafka's own log lines (printed raw to stderr by default) become events of ours,
 * one line each with its values escaped. Called from librdkafka's threads: log_event is
 * one write per line.
 */
static void
log_kafka_message(const rd_kafka_t *rk, int level, const char *facility, const char *message)
{
	log_level ours = level <= 3   ? LOG_ERROR
					 : level == 4 ? LOG_WARN
					 : level <= 6 ? LOG_INFO
								  : LOG_DEBUG;

	log_event(ours, __FILE__, __LINE__, "event=kafka_log client=%s facility=%s msg=\"%s\"",
			  rk ? rd_kafka_name(rk) : "", facility, message);
}

/*
 * Errors librdkafka reports beside a request: one clear event when no broker answers. A
 * fatal error leaves the client unable to do anything more: for a consumer (a static
 * member fenced by another with its group.instance.id) the worker stops for its
 * supervisor to start it afresh instead of staying up idle; records it had not finished
 * are not committed and come again. The hand-off producer replaces itself instead.
 */
static void
stop_on_fatal_error(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	(void) opaque;
	if (err == RD_KAFKA_RESP_ERR__FATAL)
	{
		char why[512];
		rd_kafka_resp_err_t cause = rd_kafka_fatal_error(rk, why, sizeof(why));

		log_error("event=kafka_fatal_error client=%s code=%s error=\"%s\" msg=\"this Kafka "
				  "client can do nothing more; the worker stops and exits %d for its supervisor "
				  "to start it again; unfinished records are delivered after the restart\"",
				  rd_kafka_name(rk), rd_kafka_err2name(cause), why, STOP_STATUS_FATAL);
		stop_with_failure(STOP_STATUS_FATAL);
	}
	else
		kafka_log_error(rk, err, reason);
}

void
kafka_log_error(rd_kafka_t *rk, int err, const char *reason)
{
	if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN)
		log_warn("event=kafka_unreachable client=%s error=\"%s\" msg=\"no broker answers; records "
				 "wait and every write is tried again\"",
				 rd_kafka_name(rk), reason);
	else
		log_warn("event=kafka_error client=%s code=%s error=\"%s\"", rd_kafka_name(rk),
				 rd_kafka_err2name((rd_kafka_resp_err_t) err), reason);
}

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

	rd_kafka_conf_set_log_cb(conf, log_kafka_message);
	rd_kafka_conf_set_error_cb(conf, stop_on_fatal_error);

	/*
	 * A fetch returns a message larger than fetch.max.bytes whole (KIP-74), and the
	 * response must fit librdkafka's receive limit (100,000,000 by default): 1 MiB over
	 * the largest message.
	 */
	if (!set_one(conf, "receive.message.max.bytes", "102097152", errbuf, errbuf_size))
		goto fail;
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
