/*
 * kafka_prefetch.c: the consumer roles' prefetch bound (see kafka_prefetch.h).
 *
 * librdkafka fetches ahead into one queue per consumer until queued.max.messages.kbytes
 * (payload bytes) or queued.min.messages (messages) is reached; each queued message also
 * costs its own bookkeeping, and one fetch response per broker may land on top of a full
 * queue. fetch.max.bytes and max.partition.fetch.bytes bound that response whatever the
 * number of partitions (a record larger than them still comes whole). Measured on
 * bench/deliver's 500-byte records: RSS ~30 MB with a 1 MB queue, ~70 MB with 16 MB.
 *
 * Before librdkafka 2.1.0 a full queue stops fetching for up to a second (there is no
 * fetch.queue.backoff.ms), so the queue must hold about a second of records or the
 * consumer waits on it: 16 MB there (4 MB cost 0 ms deliveries more than half their rate
 * in bench/deliver). From 2.1.0 it is refilled 10 ms after it drops under the bound, and
 * 2 MB or 5000 messages lose nothing at 0 ms.
 */
#include "kafka_prefetch.h"

#include "log.h"

#include <stdbool.h>
#include <stdio.h>

#include <librdkafka/rdkafka.h>

#define RDKAFKA_2_1_0 0x020100ff

int
kafka_prefetch_defaults(kafka_default *out)
{
	bool backoff_settable = rd_kafka_version() >= RDKAFKA_2_1_0;
	int n = 0;

	out[n++] = (kafka_default){"queued.max.messages.kbytes", backoff_settable ? "2048" : "16384"};
	out[n++] = (kafka_default){"queued.min.messages", backoff_settable ? "5000" : "50000"};
	out[n++] = (kafka_default){"fetch.max.bytes", "1048576"};
	out[n++] = (kafka_default){"max.partition.fetch.bytes", "262144"};
	if (backoff_settable)
		out[n++] = (kafka_default){"fetch.queue.backoff.ms", "10"};
	return n;
}

static const char *
conf_value(const rd_kafka_conf_t *conf, const char *name, char *buf, size_t size)
{
	if (rd_kafka_conf_get(conf, name, buf, &size) != RD_KAFKA_CONF_OK)
		snprintf(buf, size, "unset");
	return buf;
}

void
kafka_prefetch_log(const rd_kafka_conf_t *conf)
{
	char kbytes[32], messages[32], fetch_max[32], partition_max[32], backoff[32];

	log_info("event=kafka_prefetch librdkafka=%s queued_max_kbytes=%s queued_min_messages=%s "
			 "fetch_max_bytes=%s partition_fetch_max_bytes=%s queue_backoff_ms=%s",
			 rd_kafka_version_str(),
			 conf_value(conf, "queued.max.messages.kbytes", kbytes, sizeof(kbytes)),
			 conf_value(conf, "queued.min.messages", messages, sizeof(messages)),
			 conf_value(conf, "fetch.max.bytes", fetch_max, sizeof(fetch_max)),
			 conf_value(conf, "max.partition.fetch.bytes", partition_max, sizeof(partition_max)),
			 conf_value(conf, "fetch.queue.backoff.ms", backoff, sizeof(backoff)));
}
