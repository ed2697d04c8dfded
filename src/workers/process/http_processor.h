/*
 * http_processor.h: running HTTP processors (transform services). Each claimed row's
 * original payload is POSTed to its topic's processor URL, with its content type and
 * idempotency key; a 2xx answer's body is the processed payload. Anything else (another
 * status, a timeout, a connection error, an answer longer than the topic's
 * max_payload_bytes, which is read no further) is the error that fails the attempt.
 */
#ifndef WAL_HTTP_PROCESSOR_H
#define WAL_HTTP_PROCESSOR_H

#include "process/processing_rows.h"

/* Called with the attempts that completed since the last call (payload or error set). */
typedef void (*attempts_done_fn)(void *arg, attempt_result *const *done, int n);

/*
 * Sends every results[i].row at once (curl multi), each bounded by its topic's
 * processing_timeout, fills in payload or error of each result and hands the completed
 * ones to done as they come, so a slow answer does not hold back the others' results
 * (nor let their leases run out). Returns when every one was handed over.
 */
void run_http_processors(attempt_result *results, int n, attempts_done_fn done, void *arg);

#endif
