/*
 * ingest_parse.h: turning a request into records.
 *
 *   single  POST /v1/topics/{topic}/records: the body is the payload; Content-Type is the
 *           record's content type (application/octet-stream when absent); Idempotency-Key,
 *           X-Wal-Key (the Kafka message key) and X-Wal-Header-<name>: <value> (record
 *           headers, names in lower case) are optional.
 *   batch   POST /v1/topics/{topic}/batch: NDJSON, one record a line:
 *           {"value": <any JSON>} (content type application/json; the payload is the
 *           value's text as sent, see ingest_json_member.h; a key twice is refused) or
 *           {"value_base64": "..."} (content type "content_type", else
 *           application/octet-stream), with optional "idempotency_key", "key", "headers"
 *           (an object of strings) and "content_type"; no other member.
 *
 * Each record is checked by the rules of wal_enqueue; a bad one refuses the request
 * (400, or 413 for sizes), naming the line of a batch. Records of a request that is
 * refused are not added.
 */
#ifndef WAL_INGEST_PARSE_H
#define WAL_INGEST_PARSE_H

#include <stdbool.h>

#include "ingest/ingest_request.h"

#define INGEST_BATCH_MAX_BYTES   (16 * 1024 * 1024)
#define INGEST_BATCH_MAX_RECORDS 10000

bool ingest_parse_single(ingest_request *req);
bool ingest_parse_batch(ingest_request *req);

#endif
