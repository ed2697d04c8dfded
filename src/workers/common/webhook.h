/*
 * webhook.h: what a delivery sends and how its answer is judged.
 *
 * Signing follows Standard Webhooks (https://www.standardwebhooks.com): three headers,
 *   webhook-id         the message id; we use the record's idempotency key, so a retried
 *                      record keeps its id and the destination can dedupe on it
 *   webhook-timestamp  unix seconds when this attempt was signed
 *   webhook-signature  "v1," + base64(HMAC-SHA256(key, "<id>.<timestamp>.<body>"))
 * where key is the base64-decoded part after "whsec_" of the destination's signing secret
 * (a secret without that prefix is used as raw bytes).
 *
 * Outcome: what a delivery attempt means for the record.
 *   success    a 2xx answer
 *   transient  worth trying again later: no verdict from the destination (any curl error,
 *              timeouts and refused connections included) or a status on the destination's
 *              transient list
 *   permanent  any other answer: the destination refused this record; it goes to the DLQ
 */
#ifndef WAL_WEBHOOK_H
#define WAL_WEBHOOK_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include <curl/curl.h>

#include "header_lines.h"

/* "v1," + 44 base64 characters + NUL. */
#define WEBHOOK_SIGNATURE_SIZE 48

typedef enum
{
	DELIVERY_SUCCESS,
	DELIVERY_TRANSIENT,
	DELIVERY_PERMANENT
} delivery_outcome;

/* The transient list of a destination that does not set one: {408,425,429,5xx}. */
extern const char *const default_transient_statuses[];
extern const int n_default_transient_statuses;

/*
 * Writes "v1,<signature>" into out (at least WEBHOOK_SIGNATURE_SIZE bytes). Returns false,
 * leaving out empty, when the secret is empty or its whsec_ part is not valid base64, when
 * out is too small, or when OpenSSL fails.
 */
bool webhook_sign(const char *secret, const char *msg_id, long timestamp, const char *body,
				  size_t body_len, char *out, size_t out_size);

/* The longest webhook-id signed: a record identity (topic:key) stays well inside it. */
#define WEBHOOK_ID_MAX 512

/*
 * Whether msg_id can be a webhook-id: not empty, shorter than WEBHOOK_ID_MAX, no control
 * character (it goes into a header line, so CR/LF would inject headers).
 */
bool webhook_id_is_signable(const char *msg_id);

/* Adds the three webhook-* headers; false, adding nothing, when msg_id is not signable or
 * signing fails. */
bool webhook_add_header_lines(header_lines *headers, const char *secret, const char *msg_id,
							  long timestamp, const char *body, size_t body_len);

/*
 * Judges one attempt. transient_statuses holds exact codes ("429") and classes ("5xx");
 * NULL means the default list, while a non-NULL list with n == 0 means no status is
 * transient. Entries that are neither are ignored.
 */
delivery_outcome classify_http_result(CURLcode curl_result, long http_status,
									  const char *const *transient_statuses, int n);

const char *delivery_outcome_name(delivery_outcome outcome);

/*
 * Seconds to wait from now as a Retry-After header asks (delta-seconds or an HTTP-date; a
 * date in the past gives 0), or -1 when the value is absent or not valid. Huge values are
 * clamped to INT32_MAX; callers cap them to their own retry policy.
 */
long parse_retry_after(const char *header_value, time_t now);

#endif
