/*
 * kafka_conf.h: librdkafka configuration for the workers: the worker's own defaults,
 * then bootstrap.servers from the control plane, then every -X property unchanged, so
 * an operator's -X always wins. Also the assignment step every consumer's rebalance
 * callback shares.
 */
#ifndef WAL_KAFKA_CONF_H
#define WAL_KAFKA_CONF_H

#include <stddef.h>

#include <librdkafka/rdkafka.h>

#include "options.h"

typedef struct
{
	const char *name;
	const char *value;
} kafka_default;

/*
 * The largest message the workers' producers send (librdkafka refuses a larger one before
 * sending; its default is 1 MB): above the largest max.message.bytes the reconciler gives
 * a topic (max_payload_bytes, at most 100,000,000, plus 64 KiB), so each topic's limit in
 * Kafka is the one that judges, and under a broker's default socket.request.max.bytes.
 */
#define KAFKA_MESSAGE_MAX_BYTES "101048576"

/*
 * NULL with errbuf filled when a property is refused or no bootstrap server is known.
 * Every client may receive a response holding one message of KAFKA_MESSAGE_MAX_BYTES.
 */
rd_kafka_conf_t *kafka_conf_build(const kafka_default *defaults, int n_defaults,
								  const char *bootstrap_from_config, const worker_options *opts,
								  char *errbuf, size_t errbuf_size);

/*
 * The one event for a non-fatal client error. kafka_conf_build's error callback logs
 * with it and stops the worker (exit 70) on a fatal error; a client that replaces
 * itself after one sets its own callback and calls this for the rest.
 */
void kafka_log_error(rd_kafka_t *rk, int err, const char *reason);

/*
 * Takes the assigned partitions (logged) and resumes them: librdkafka may keep a partition
 * paused from an earlier assignment, so every assignment starts unpaused.
 */
void kafka_take_assignment(rd_kafka_t *rk, rd_kafka_topic_partition_list_t *parts);

#endif
