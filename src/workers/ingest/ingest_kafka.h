/*
 * ingest_kafka.h: the ingest service's direct path to Kafka.
 *
 * Two producers, as the relay has: acks=all with idempotence for topics with acks -1,
 * acks=1 for the others. A record is produced with the relay's headers (idempotency-key,
 * source-topic, content-type, created-at, then its own) and settled 201 when its
 * delivery report says it is stored. When Kafka refuses it, or has not acknowledged it
 * within the deadline, the record goes to the outbox instead (ingest_outbox).
 *
 * After a failure Kafka counts as down: records go straight to the outbox, except one
 * probe record every PROBE_INTERVAL_MS, whose acknowledgement brings Kafka back up.
 * A producer that failed fatally (idempotence) is replaced by a new one, and both are
 * when the bootstrap servers change (ingest_kafka.c).
 */
#ifndef WAL_INGEST_KAFKA_H
#define WAL_INGEST_KAFKA_H

#include <stdbool.h>
#include <stddef.h>

#include "common/options.h"
#include "ingest/ingest_record.h"

/* False with errbuf filled when the producers cannot be made (a bad -X, no bootstrap). */
bool ingest_kafka_start(const worker_options *opts, const char *bootstrap, int deadline_ms,
						char *errbuf, size_t errbuf_size);

/* Produces r, or hands it to the outbox at once when Kafka is down or refuses it. */
void ingest_kafka_submit(ingest_record *r);

bool ingest_kafka_up(void);

/*
 * The outbox could not take r (status, code, message say why). Settles r by what is known
 * of its Kafka copy: stored (201), never written or never produced (the outbox's failure),
 * or not known yet (504 outcome_unknown: a copy may still land).
 */
void ingest_kafka_outbox_failed(ingest_record *r, int status, const char *code,
								const char *message);

/*
 * The control plane's bootstrap servers (NULL: -X bootstrap.servers); when they differ
 * from the producers', the producers are replaced (-X bootstrap.servers, when given, still
 * wins over them).
 */
void ingest_kafka_set_bootstrap(const char *servers);

/* Waits for outstanding reports (at most deadline), then closes the producers. */
void ingest_kafka_stop(void);

#endif
