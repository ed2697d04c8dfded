/*
 * delivery_request.h: the HTTP request that delivers one record to one destination, the
 * same from the main consumers and the retry consumer.
 *
 * Headers: Content-Type, Idempotency-Key, X-Wal-Topic, X-Wal-Outbox-Id (when known),
 * X-Wal-Attempt (1 from the main consumer, 1 + the step from a retry step), the
 * destination's own headers, and the Standard Webhooks signature when it has a secret.
 *
 * A record is identified to destinations by "<topic>:<idempotency key>": keys are unique
 * per topic only, and Kafka topic names cannot hold ':'. Idempotency-Key, webhook-id and
 * the consumer's dedupe all use that identity.
 */
#ifndef WAL_DELIVERY_REQUEST_H
#define WAL_DELIVERY_REQUEST_H

#include "control_plane.h"
#include "delivery_trace.h"
#include "handoff.h"
#include "header_lines.h"
#include "http_delivery.h"

/* Room for any identity a signed delivery can carry (see webhook_id_is_signable). */
#define RECORD_IDENTITY_SIZE 1024

/* Writes "<topic>:<key>" into out; false when it does not fit (the record is then refused). */
bool record_identity(const handoff_message *m, char *out, size_t size);

/*
 * Why this copy must not be sent to d at all (a permanent failure for the DLQ), or NULL.
 * A destination with a secret gets only signed copies: never one sent unsigned.
 */
const char *delivery_refusal(const destination_config *d, const handoff_message *m);

/*
 * The request. Its header text is built in *headers (initialised here), which must stay
 * in place until http_engine_submit has copied it; release it after the submit. *trace
 * gets the attempt's span (delivery_trace_begin): the caller keeps it with the attempt,
 * for whatever handles its answer.
 */
http_request delivery_request(const destination_config *d, const handoff_message *m, int attempt,
							  delivery_trace *trace, header_lines *headers);

#endif
