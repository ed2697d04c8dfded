/*
 * delivery_request.h: the HTTP request that delivers one record to one destination, the
 * same from the main consumers and the retry consumer.
 *
 * Headers: Content-Type, Idempotency-Key, X-Wal-Topic, X-Wal-Outbox-Id (when known),
 * X-Wal-Attempt (1 from the main consumer, 1 + the step from a retry step), the
 * destination's own headers, and the Standard Webhooks signature when it has a secret.
 */
#ifndef WAL_DELIVERY_REQUEST_H
#define WAL_DELIVERY_REQUEST_H

#include "control_plane.h"
#include "handoff.h"
#include "header_lines.h"
#include "http_delivery.h"

/*
 * The request. Its header text is built in *headers (initialised here), which must stay
 * in place until http_engine_submit has copied it; release it after the submit.
 */
http_request delivery_request(const destination_config *d, const handoff_message *m, int attempt,
							  header_lines *headers);

#endif
