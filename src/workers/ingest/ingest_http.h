/*
 * ingest_http.h: the ingest service's HTTP server (--listen ADDR:PORT).
 *
 *   POST /v1/topics/{topic}/records   one record (ingest_parse.h)
 *   POST /v1/topics/{topic}/batch     NDJSON, many records of one topic
 *   GET  /healthz                     200 while the process runs
 *   GET  /readyz                      200 while a durable path works, else 503
 *   GET  /metrics                     the Prometheus metrics
 *
 * Requests need "Authorization: Bearer <token>" (401 without or with an unknown token,
 * 403 for a topic the token may not write); then 404 for an unknown topic, 405 (with
 * Allow) for another method, 415 for a body in a content coding, 413 for a body over the
 * topic's limit, 503 busy when the bodies of all requests would pass their common
 * limit (ingest_request.h), 400 for bad input. Every error has a JSON body
 * {"error": code, "message": ...}.
 */
#ifndef WAL_INGEST_HTTP_H
#define WAL_INGEST_HTTP_H

#include <stdbool.h>
#include <stddef.h>

typedef struct ingest_http ingest_http;

/* NULL with errbuf filled when the address cannot be listened on. */
ingest_http *ingest_http_start(const char *listen, bool (*is_ready)(void), char *errbuf,
							   size_t errbuf_size);
int ingest_http_port(const ingest_http *http);

/* Stops taking connections, waits (at most wait_ms) for requests in flight, then stops. */
void ingest_http_stop(ingest_http *http, int wait_ms);

#endif
