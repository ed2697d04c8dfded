/*
 * kafka_producer.h: the relay's librdkafka producers.
 *
 * Two producers, because acks is per producer for an idempotent one: "all" is
 * idempotent with acks=all (topics with acks -1), "leader" has acks=1 (topics that
 * allow it). A delivery is one produced outbox row; its report arrives only from
 * kafka_wait_for_deliveries(), on the caller's thread.
 */
#ifndef KAFKA_PRODUCER_H
#define KAFKA_PRODUCER_H

#include <librdkafka/rdkafka.h>

typedef struct KafkaDelivery
{
	int64 outbox_id;
	bool queued; /* librdkafka took it: a report will come */
	bool reported;
	bool handed_off; /* its pass ended first (kafka_inflight.h) */
	struct DeliveryBlock *block;
	rd_kafka_resp_err_t err;
	rd_kafka_msg_status_t status; /* only PERSISTED counts as stored */
	/* Only while kafka_report_details is on (spans are exported): */
	int32 partition;
	int64 offset;
	int64 reported_unix_ns; /* when the report arrived */
} KafkaDelivery;

/*
 * Whether delivery reports keep the partition, offset and time of each record (for the
 * relay's spans); off, a report costs nothing more than its verdict.
 */
extern bool kafka_report_details;

typedef struct KafkaRecord
{
	const char *topic;
	int acks; /* -1 or 1 */
	const char *key;
	const char *value;
	size_t value_len;
	const char *idempotency_key;
	const char *content_type;
	const char *created_at;
	const char *headers_json; /* extra headers: a JSON object of strings, or NULL */
} KafkaRecord;

/*
 * Sets bootstrap.servers and the "name=value;name=value" passthrough properties on conf,
 * unchanged; false with errbuf filled when librdkafka refuses one.
 */
bool kafka_conf_apply(rd_kafka_conf_t *conf, const char *bootstrap, const char *properties,
					  char *errbuf, size_t errbuf_size);

/* Creates both producers from the settings; false with errbuf filled when it cannot. */
bool kafka_producers_create(const char *bootstrap, const char *properties, int delivery_timeout_ms,
							char *errbuf, size_t errbuf_size);
void kafka_producers_destroy(int flush_timeout_ms);
bool kafka_producers_exist(void);

/* Queues one record; its report lands in *delivery. Returns a local error, or 0. */
rd_kafka_resp_err_t kafka_produce(const KafkaRecord *record, KafkaDelivery *delivery);

/*
 * Serves reports until every delivery this pass queued has one or timeout_ms passed.
 * Deliveries still without a report then are handed off (kafka_inflight.h): their first
 * attempt may still be acknowledged. Once a shutdown is requested, it waits at most
 * shutdown_timeout_ms more and then purges what is left, so each has its report.
 */
void kafka_wait_for_deliveries(int timeout_ms, int shutdown_timeout_ms);

/*
 * True when a producer raised a fatal error (for example the idempotent producer after
 * messages timed out); it can produce nothing more and must be destroyed and created anew.
 */
bool kafka_producers_failed(char *errbuf, size_t errbuf_size);

/* True when a broker answered a metadata request within timeout_ms. */
bool kafka_reachable(int timeout_ms);

#endif
