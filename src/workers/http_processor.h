/*
 * http_processor.h: running HTTP processors (transform services). Each claimed row's
 * original payload is POSTed to its topic's processor URL, with its content type and
 * idempotency key; a 2xx answer's body is the processed payload. Anything else (another
 * status, a timeout, a connection error) is the error that fails the attempt.
 */
#ifndef WAL_HTTP_PROCESSOR_H
#define WAL_HTTP_PROCESSOR_H

#include "processing_rows.h"

/*
 * Sends every results[i].row at once (curl multi) and waits for all of them, each bounded
 * by its topic's processing_timeout; fills in payload or error of each result.
 */
void run_http_processors(attempt_result *results, int n);

#endif
