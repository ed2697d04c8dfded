/*
 * s3_target.h: where dead-letter archives go. An S3Target is the endpoint, bucket,
 * addressing style and keys from wal_delivery.archive_target(); a key is an object's name
 * inside the bucket.
 */
#ifndef WAL_DELIVERY_S3_TARGET_H
#define WAL_DELIVERY_S3_TARGET_H

typedef struct S3Target
{
	char *endpoint; /* scheme://host[:port], no trailing "/" */
	char *region;
	char *bucket;
	char *prefix;    /* may be empty */
	bool path_style; /* endpoint/bucket/key instead of bucket.host/key */
	bool allow_http;
	long timeout_ms;
	int batch_rows;
	int batch_bytes;
	char *access_key_id;
	char *secret_access_key;
	char *session_token; /* NULL unless temporary credentials */
} S3Target;

/* Fills target from the settings (SPI connected; strings outlive SPI_finish). */
extern void s3_target_load(S3Target *target);

/* The URL of key in target's bucket, key percent-encoded but for "/". */
extern char *s3_object_url(const S3Target *target, const char *key);

#endif
