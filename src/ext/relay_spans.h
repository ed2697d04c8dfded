/*
 * relay_spans.h: the relay's span ("wal_delivery relay", kind PRODUCER) of each record
 * Kafka acknowledged, for a record whose traceparent is sampled (relay_spans.c).
 */
#ifndef RELAY_SPANS_H
#define RELAY_SPANS_H

#include "relay_rows.h"

/*
 * Builds row i's span (Kafka persisted it) and hands it to the sender. Call only while
 * otlp_sender_enabled: it reads the record's headers.
 */
void relay_span_for_row(const ClaimedRows *rows, int i);

#endif
