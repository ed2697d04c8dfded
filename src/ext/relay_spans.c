/*
 * relay_spans.c: the relay's span of each record Kafka acknowledged (relay_spans.h).
 *
 * The span is the hand-off from enqueue to Kafka: it starts at the record's created_at
 * (the enqueueing transaction's time) and ends when the delivery report arrived, as a
 * child of the span in the record's traceparent header. Records without a valid, sampled
 * traceparent get none. Only called while export is on: with it off the relay reads no
 * header for this.
 */
#include "postgres.h"

#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/jsonb.h"

#include "kafka_producer.h"
#include "otlp_sender.h"
#include "relay_rows.h"
#include "relay_spans.h"
#include "shared/trace_context.h"

/* Days from 1970-01-01 to the proleptic Gregorian date y-m-d. */
static int64
days_since_epoch(int y, int m, int d)
{
	int era;
	int year_of_era;
	int day_of_year;
	int day_of_era;

	y -= m <= 2;
	era = (y >= 0 ? y : y - 399) / 400;
	year_of_era = y - era * 400;
	day_of_year = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
	day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
	return (int64) era * 146097 + day_of_era - 719468;
}

/*
 * The shipped created_at ("YYYY-MM-DDTHH:MI:SS.USZ", UTC, as SHIPPED_RECORD_COLUMNS
 * formats it) in nanoseconds since the epoch; 0 when it is not in that form.
 */
static uint64
created_at_unix_ns(const char *text)
{
	int y, mo, d, h, mi, s, us;
	int64 seconds;

	if (text == NULL ||
		sscanf(text, "%4d-%2d-%2dT%2d:%2d:%2d.%6dZ", &y, &mo, &d, &h, &mi, &s, &us) != 7)
		return 0;
	seconds = days_since_epoch(y, mo, d) * 86400 + h * 3600 + mi * 60 + s;
	return seconds < 0 ? 0 : (uint64) seconds * 1000000000 + (uint64) us * 1000;
}

/*
 * The record's trace context: its traceparent header (names ignore case, as the record
 * contract says), when valid. False when there is none or it is not a traceparent.
 */
static bool
record_trace_context(const char *headers_json, trace_context *tc)
{
	Jsonb *jb;
	JsonbIterator *it;
	JsonbValue v;
	JsonbIteratorToken tok;
	bool is_traceparent = false;

	if (headers_json == NULL)
		return false;
	jb = DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(headers_json)));
	it = JsonbIteratorInit(&jb->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY)
			is_traceparent =
				v.val.string.len == (int) strlen(TRACEPARENT_HEADER) &&
				pg_strncasecmp(v.val.string.val, TRACEPARENT_HEADER, v.val.string.len) == 0;
		else if (tok == WJB_VALUE && is_traceparent && v.type == jbvString)
			return trace_context_parse(v.val.string.val, (size_t) v.val.string.len, tc) == NULL;
	}
	return false;
}

void
relay_span_for_row(const ClaimedRows *rows, int i)
{
	HeapTuple tup = rows->tt->vals[i];
	TupleDesc desc = rows->tt->tupdesc;
	const KafkaDelivery *d = &rows->deliveries[i];
	trace_context parent;
	trace_context self;
	unsigned char random8[8];
	otlp_span span;
	char partition[16];

	if (!record_trace_context(SPI_getvalue(tup, desc, SHIPPED_HEADERS), &parent) ||
		!trace_context_sampled(&parent))
		return;
	if (!pg_strong_random(random8, sizeof(random8)))
		return; /* no span id to give it: the span is left out, the record goes on */
	trace_context_child(&parent, random8, &self);
	otlp_span_start(&span, &parent, self.span_id, "wal_delivery relay", OTLP_KIND_PRODUCER);
	span.start_unix_nano = created_at_unix_ns(SPI_getvalue(tup, desc, SHIPPED_CREATED_AT));
	span.end_unix_nano = (uint64) d->reported_unix_ns;
	if (span.start_unix_nano == 0 || span.start_unix_nano > span.end_unix_nano)
		span.start_unix_nano = span.end_unix_nano; /* clocks apart: never a negative span */
	snprintf(partition, sizeof(partition), "%d", d->partition);
	otlp_span_add_string(&span, "messaging.system", "kafka");
	otlp_span_add_string(&span, "messaging.operation.type", "send");
	otlp_span_add_string(&span, "messaging.destination.name",
						 SPI_getvalue(tup, desc, SHIPPED_TOPIC));
	otlp_span_add_string(&span, "messaging.destination.partition.id", partition);
	otlp_span_add_int(&span, "messaging.kafka.offset", d->offset);
	otlp_span_add_string(&span, "wal.idempotency_key",
						 SPI_getvalue(tup, desc, SHIPPED_IDEMPOTENCY_KEY));
	otlp_span_add_int(&span, "wal.outbox_id", d->outbox_id);
	otlp_span_set_status(&span, OTLP_STATUS_OK, NULL);
	otlp_sender_add(&span);
}
