/*
 * s3_request.h: one S3 object upload or download, signed with AWS Signature V4 by
 * libcurl. Either succeeds (HTTP 200) or raises an ERROR that says what to fix.
 */
#ifndef WAL_DELIVERY_S3_REQUEST_H
#define WAL_DELIVERY_S3_REQUEST_H

#include "lib/stringinfo.h"

#include "s3_target.h"

/* PUTs data as key; returns only once S3 answered 200. */
extern void s3_put_object(const S3Target *target, const char *key, const char *data, size_t len,
						  const char *content_type);

/* Appends the object's bytes to out (at most max_len of them). */
extern void s3_get_object(const S3Target *target, const char *key, StringInfo out, size_t max_len);

#endif
