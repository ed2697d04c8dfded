/*
 * kafka_prefetch.h: the bound on what a consumer role's librdkafka fetches ahead of the
 * role (consume, retry, dlq), so a process's memory does not grow with the lag it drains.
 */
#ifndef WAL_KAFKA_PREFETCH_H
#define WAL_KAFKA_PREFETCH_H

#include "kafka_conf.h"

#define KAFKA_PREFETCH_N_DEFAULTS 5

/*
 * Fills out[0 .. KAFKA_PREFETCH_N_DEFAULTS - 1] with the prefetch settings for the
 * librdkafka this process runs with and returns how many it filled. A role's own defaults
 * and every -X come after them, so either can change them.
 */
int kafka_prefetch_defaults(kafka_default *out);

/* Logs the bound in effect (after -X) and the librdkafka version: event=kafka_prefetch. */
void kafka_prefetch_log(const rd_kafka_conf_t *conf);

#endif
