/*
 * s3_request.c: S3 PUT and GET with libcurl and its built-in SigV4 signing.
 *
 * libcurl runs between Postgres checks for interrupts, so nothing in here may ereport
 * while a transfer is set up or running: the response goes to malloc'd memory, a query
 * cancel or statement_timeout makes the progress callback abort the transfer, and only
 * after curl_easy_cleanup do we CHECK_FOR_INTERRUPTS and raise errors.
 */
#include "postgres.h"

#include <curl/curl.h>

#include "common/base64.h"
#include "common/cryptohash.h"
#include "miscadmin.h"
#include "nodes/pg_list.h"

#include "s3_request.h"

#define S3_MAX_CONNECT_MS 10000L
#define S3_MAX_ERROR_BODY 65536

/* What a transfer ended with; body is malloc'd (never palloc'd: no ERROR mid-transfer). */
typedef struct S3Result
{
	CURLcode curl_code;
	long status;
	bool interrupted; /* the progress callback saw a cancel or termination */
	bool too_large;
	char *body;
	size_t body_len;
	size_t body_max;
	char curl_error[CURL_ERROR_SIZE];
} S3Result;

static bool curl_ready = false;

static size_t
collect_body(char *data, size_t size, size_t count, void *userdata)
{
	S3Result *result = userdata;
	size_t n = size * count;
	char *grown;

	if (result->body_len + n > result->body_max)
	{
		result->too_large = true;
		return 0;
	}
	grown = realloc(result->body, result->body_len + n + 1);
	if (grown == NULL)
		return 0;
	result->body = grown;
	memcpy(result->body + result->body_len, data, n);
	result->body_len += n;
	result->body[result->body_len] = '\0';
	return n;
}

/* Aborts the transfer when Postgres wants to cancel the query or end the backend. */
static int
stop_on_interrupt(void *userdata, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
				  curl_off_t ulnow)
{
	S3Result *result = userdata;

	if (QueryCancelPending || ProcDiePending)
	{
		result->interrupted = true;
		return 1;
	}
	return 0;
}

static void
hash_hex(pg_cryptohash_type type, const char *data, size_t len, uint8 *digest, size_t digest_len,
		 char *hex)
{
	pg_cryptohash_ctx *ctx = pg_cryptohash_create(type);

	if (pg_cryptohash_init(ctx) < 0 || pg_cryptohash_update(ctx, (const uint8 *) data, len) < 0 ||
		pg_cryptohash_final(ctx, digest, digest_len) < 0)
		elog(ERROR, "could not hash an S3 request body: %s", pg_cryptohash_error(ctx));
	pg_cryptohash_free(ctx);
	if (hex)
	{
		for (size_t i = 0; i < digest_len; i++)
			sprintf(hex + 2 * i, "%02x", digest[i]);
	}
}

/*
 * The request's extra headers: the body's SHA-256 (which SigV4 signs, so S3 rejects a
 * changed body), its MD5 for S3's own integrity check, and a session token if any.
 */
static List *
request_headers(const S3Target *target, const char *body, size_t len, const char *content_type)
{
	List *headers = NIL;
	uint8 sha[32], md5[16];
	char sha_hex[65];
	char md5_b64[32];
	int b64_len;

	hash_hex(PG_SHA256, body, len, sha, sizeof(sha), sha_hex);
	headers = lappend(headers, psprintf("x-amz-content-sha256: %s", sha_hex));
	if (content_type)
	{
		hash_hex(PG_MD5, body, len, md5, sizeof(md5), NULL);
		b64_len = pg_b64_encode((const char *) md5, sizeof(md5), md5_b64, sizeof(md5_b64) - 1);
		if (b64_len < 0)
			elog(ERROR, "could not encode an MD5 digest");
		md5_b64[b64_len] = '\0';
		headers = lappend(headers, psprintf("Content-MD5: %s", md5_b64));
		headers = lappend(headers, psprintf("Content-Type: %s", content_type));
	}
	if (target->session_token)
		headers = lappend(headers, psprintf("x-amz-security-token: %s", target->session_token));
	return headers;
}

/*
 * Runs one signed request. Everything that may ereport (building the URL and headers) is
 * done before the curl handle exists; from curl_easy_init to curl_easy_cleanup nothing
 * can longjmp.
 */
static void
perform(const S3Target *target, const char *method, const char *key, const char *body, size_t len,
		const char *content_type, size_t max_response, S3Result *result)
{
	char *url = s3_object_url(target, key);
	char *sigv4 = psprintf("aws:amz:%s:s3", target->region);
	List *headers = request_headers(target, body ? body : "", len, content_type);
	struct curl_slist *header_list = NULL;
	ListCell *lc;
	CURL *curl;

	if (!curl_ready)
	{
		if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
			elog(ERROR, "could not initialise libcurl");
		curl_ready = true;
	}
	if (strncmp(target->endpoint, "https://", 8) != 0 && !target->allow_http)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("archive_s3_endpoint %s is not https", target->endpoint),
				 errhint("Use https, or set archive_s3_allow_http for a local test server.")));

	memset(result, 0, sizeof(*result));
	result->body_max = max_response;
	curl = curl_easy_init();
	if (curl == NULL)
		elog(ERROR, "could not create a libcurl handle");
	foreach (lc, headers)
		header_list = curl_slist_append(header_list, lfirst(lc));

	curl_easy_setopt(curl, CURLOPT_URL, url);
	curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, target->allow_http ? "http,https" : "https");
	curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4);
	curl_easy_setopt(curl, CURLOPT_USERNAME, target->access_key_id);
	curl_easy_setopt(curl, CURLOPT_PASSWORD, target->secret_access_key);
	curl_easy_setopt(curl, CURLOPT_HTTPHEADER, header_list);
	curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, target->timeout_ms);
	curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, Min(target->timeout_ms, S3_MAX_CONNECT_MS));
	curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, collect_body);
	curl_easy_setopt(curl, CURLOPT_WRITEDATA, result);
	curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
	curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, stop_on_interrupt);
	curl_easy_setopt(curl, CURLOPT_XFERINFODATA, result);
	curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, result->curl_error);
	/* libcurl 7.88 would sign an "Expect:" header that removes 100-continue; wait less. */
	curl_easy_setopt(curl, CURLOPT_EXPECT_100_TIMEOUT_MS, 200L);
	if (strcmp(method, "PUT") == 0)
	{
		/* POSTFIELDS so libcurl hashes the body it signs; the method stays PUT. */
		curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, "PUT");
		curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) len);
		curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
	}
	else
		curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);

	result->curl_code = curl_easy_perform(curl);
	curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &result->status);
	curl_easy_cleanup(curl);
	curl_slist_free_all(header_list);
}

/* The text between <tag> and </tag> in an S3 XML error body, or "". */
static char *
xml_field(const S3Result *result, const char *tag)
{
	char *open, *start, *end;

	if (result->body == NULL)
		return "";
	open = psprintf("<%s>", tag);
	start = strstr(result->body, open);
	if (start == NULL)
		return "";
	start += strlen(open);
	end = strstr(start, psprintf("</%s>", tag));
	return end ? pnstrdup(start, end - start) : "";
}

static void
free_result(S3Result *result)
{
	free(result->body);
	result->body = NULL;
}

/* Raises the ERROR for a failed request; what is "upload" or "download". */
static void
report_failure(const S3Target *target, const char *what, const char *key, S3Result *result)
{
	char *code = xml_field(result, "Code");
	char *message = xml_field(result, "Message");
	const char *after = strcmp(what, "upload") == 0
							? "Nothing was marked archived for this batch; the next run retries it."
							: "Nothing was restored.";
	long status = result->status;
	CURLcode curl_code = result->curl_code;
	bool interrupted = result->interrupted;
	bool too_large = result->too_large;
	char curl_error[CURL_ERROR_SIZE];

	strlcpy(curl_error, result->curl_error[0] ? result->curl_error : curl_easy_strerror(curl_code),
			sizeof(curl_error));
	free_result(result);

	if (interrupted)
	{
		CHECK_FOR_INTERRUPTS();
		ereport(ERROR,
				(errcode(ERRCODE_QUERY_CANCELED),
				 errmsg("S3 %s of \"%s\" was interrupted", what, key), errdetail("%s", after)));
	}
	if (too_large)
		ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
						errmsg("S3 %s of \"%s\" returned more data than allowed", what, key),
						errdetail("%s", after)));
	if (curl_code == CURLE_OPERATION_TIMEDOUT)
		ereport(ERROR, (errcode(ERRCODE_CONNECTION_FAILURE),
						errmsg("S3 %s of \"%s\" to %s timed out after %ld ms", what, key,
							   target->endpoint, target->timeout_ms),
						errdetail("%s", after),
						errhint("Check that the endpoint is reachable, or raise archive_s3_timeout "
								"in wal_delivery.settings.")));
	if (curl_code == CURLE_PEER_FAILED_VERIFICATION || curl_code == CURLE_SSL_CONNECT_ERROR ||
		curl_code == CURLE_SSL_CACERT_BADFILE)
		ereport(ERROR, (errcode(ERRCODE_CONNECTION_FAILURE),
						errmsg("could not verify the TLS connection to the S3 endpoint %s: %s",
							   target->endpoint, curl_error),
						errdetail("%s", after),
						errhint("The endpoint must present a certificate the system trusts.")));
	if (curl_code != CURLE_OK)
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("could not reach the S3 endpoint %s: %s", target->endpoint, curl_error),
				 errdetail("%s", after),
				 errhint("Check archive_s3_endpoint in wal_delivery.settings and that the "
						 "server is up.")));
	/* A bad or expired session token is a credential error too, whatever the status. */
	if (status == 401 || status == 403 || strcmp(code, "InvalidToken") == 0 ||
		strcmp(code, "ExpiredToken") == 0 || strcmp(code, "InvalidAccessKeyId") == 0 ||
		strcmp(code, "SignatureDoesNotMatch") == 0 || strcmp(code, "TokenRefreshRequired") == 0)
		ereport(ERROR, (errcode(ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION),
						errmsg("S3 refused the credentials for bucket \"%s\": HTTP %ld %s",
							   target->bucket, status, code),
						errdetail("%s %s", message, after),
						errhint("Check wal_delivery.archive_credentials (the keys and any session "
								"token) and archive_s3_region; the "
								"key needs s3:PutObject and s3:GetObject on the bucket.")));
	if (status == 404 && strcmp(code, "NoSuchKey") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("S3 bucket \"%s\" does not exist at %s", target->bucket, target->endpoint),
				 errdetail("HTTP 404 %s. %s", code, after),
				 errhint("Create the bucket, or fix archive_s3_bucket in wal_delivery.settings.")));
	if (status == 404)
		ereport(ERROR, (errcode(ERRCODE_UNDEFINED_OBJECT),
						errmsg("archive object \"%s\" does not exist in bucket \"%s\"", key,
							   target->bucket),
						errhint("List the bucket under archive_s3_prefix for the object keys.")));
	ereport(ERROR, (errcode(ERRCODE_EXTERNAL_ROUTINE_EXCEPTION),
					errmsg("S3 answered HTTP %ld to the %s of \"%s\"%s%s", status, what, key,
						   code[0] ? ": " : "", code),
					errdetail("%s %s", message, after),
					errhint(status >= 500 ? "S3 failed on its side; the next run retries."
										  : "See the S3 error code above.")));
}

void
s3_put_object(const S3Target *target, const char *key, const char *data, size_t len,
			  const char *content_type)
{
	S3Result result;

	perform(target, "PUT", key, data, len, content_type, S3_MAX_ERROR_BODY, &result);
	/* Anything but 200 is not a confirmed upload. */
	if (result.curl_code != CURLE_OK || result.status != 200)
		report_failure(target, "upload", key, &result);
	free_result(&result);
	CHECK_FOR_INTERRUPTS();
}

void
s3_get_object(const S3Target *target, const char *key, StringInfo out, size_t max_len)
{
	S3Result result;

	perform(target, "GET", key, NULL, 0, NULL, max_len, &result);
	if (result.curl_code != CURLE_OK || result.status != 200)
		report_failure(target, "download", key, &result);
	appendBinaryStringInfo(out, result.body ? result.body : "", (int) result.body_len);
	free_result(&result);
	CHECK_FOR_INTERRUPTS();
}
