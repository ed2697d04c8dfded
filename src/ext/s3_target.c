/*
 * s3_target.c: reads the archive's S3 settings and credentials and turns an object key
 * into the URL to sign and send, in path or virtual-host style.
 */
#include "postgres.h"

#include "executor/spi.h"
#include "lib/stringinfo.h"

#include "s3_target.h"

/* Column n of the settings row, copied out of SPI's memory; NULL stays NULL. */
static char *
target_text(int n)
{
	char *value = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, n);

	if (value == NULL)
		return NULL;
	return strcpy(SPI_palloc(strlen(value) + 1), value);
}

static bool
target_bool(int n)
{
	char *value = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, n);

	return value != NULL && value[0] == 't';
}

void
s3_target_load(S3Target *target)
{
	char *endpoint;
	size_t len;

	/* archive_target() refuses, with a hint, when archival is not configured. */
	if (SPI_execute("SELECT * FROM wal_delivery.archive_target()", true, 1) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "wal_delivery.archive_target() returned no row");

	endpoint = target_text(1);
	len = strlen(endpoint);
	if (len > 0 && endpoint[len - 1] == '/')
		endpoint[len - 1] = '\0';
	target->endpoint = endpoint;
	target->region = target_text(2);
	target->bucket = target_text(3);
	target->prefix = target_text(4);
	target->path_style = target_bool(5);
	target->allow_http = target_bool(6);
	target->timeout_ms = atol(target_text(7));
	target->batch_rows = atoi(target_text(8));
	target->batch_bytes = atoi(target_text(9));
	target->access_key_id = target_text(10);
	target->secret_access_key = target_text(11);
	target->session_token = target_text(12);
}

/* S3 signs the path as sent: everything but unreserved characters and "/" is encoded. */
static void
append_encoded_key(StringInfo url, const char *key)
{
	for (const unsigned char *c = (const unsigned char *) key; *c; c++)
	{
		if ((*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') ||
			*c == '-' || *c == '_' || *c == '.' || *c == '~' || *c == '/')
			appendStringInfoChar(url, (char) *c);
		else
			appendStringInfo(url, "%%%02X", *c);
	}
}

/* True when some "/"-separated segment of path is "." or "..". */
static bool
has_dot_segment(const char *path)
{
	for (const char *seg = path; seg != NULL; seg = strchr(seg, '/') ? strchr(seg, '/') + 1 : NULL)
	{
		size_t len = strcspn(seg, "/");

		if ((len == 1 && seg[0] == '.') || (len == 2 && seg[0] == '.' && seg[1] == '.'))
			return true;
	}
	return false;
}

char *
s3_object_url(const S3Target *target, const char *key)
{
	StringInfoData url;
	const char *host = strstr(target->endpoint, "://");

	/*
	 * libcurl resolves "." and ".." in a URL's path before it sends and signs it: the object
	 * would land elsewhere than the key says, even in another bucket with path style.
	 */
	if (has_dot_segment(key) || strchr(target->bucket, '/') != NULL)
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("S3 object key \"%s\" in bucket \"%s\" has a \".\" or \"..\" path "
							   "segment",
							   key, target->bucket),
						errhint("Fix archive_s3_prefix in wal_delivery.settings: use plain path "
								"segments.")));

	initStringInfo(&url);
	if (target->path_style || host == NULL)
		appendStringInfo(&url, "%s/%s/", target->endpoint, target->bucket);
	else
		appendStringInfo(&url, "%.*s%s.%s/", (int) (host + 3 - target->endpoint), target->endpoint,
						 target->bucket, host + 3);
	append_encoded_key(&url, key);
	return url.data;
}
