/*
 * s3_answer.c (fuzz target): what the extension does with S3's answers
 * (src/ext/s3_request.c, src/ext/gzip_buffer.c): the body collected chunk by chunk
 * under its size limit (collect_body), an error answer turned into an ERROR with S3's
 * <Code> and <Message> (xml_field, report_failure), and a downloaded archive object
 * decompressed (gzip_decompress, as fetch_archive_object does).
 *
 * That code is static and runs in a backend: this file includes s3_request.c itself,
 * and fuzz/pg_stubs.c stands in for palloc, StringInfo and ereport (an ERROR is caught
 * with a sigjmp_buf, palloc'd memory freed after each input). No transfer is made.
 *
 * Input: meta||chunk||chunk...: the body as curl would hand it over, in those chunks.
 *   meta  numbers: the HTTP status (default 200), the curl result code (default 0), the
 *         body limit (0: the error-body limit, 64 KiB) and the decompression limit (0:
 *         the archive object limit); letters: I (the query was cancelled during the
 *         transfer), U (an upload, else a download).
 *
 * Invariants: the body kept is exactly the chunks' bytes up to the limit, NUL-terminated;
 * a failed request always raises an ERROR of the class its failure calls for, naming
 * S3's <Code>, after freeing the body; a download's object is either the bytes zlib
 * decompresses from it, within the limit, or an ERROR saying it is not gzip or too large.
 */
#define _GNU_SOURCE
#include "ext/s3_request.c"

#include "utils/memutils.h"

#include <zlib.h>

#include "fuzz_util.h"
#include "gzip_buffer.h"
#include "pg_stubs.h"

#define MAX_CHUNKS         64
#define ARCHIVE_MAX_OBJECT ((size_t) MaxAllocSize - VARHDRSZ - 1)
#define GZIP_CHUNK_BYTES   65536

static const S3Target target = {
	.endpoint = "https://s3.eu-west-1.amazonaws.com",
	.region = "eu-west-1",
	.bucket = "wal-archive",
	.prefix = "dead-letters",
	.timeout_ms = 30000,
	.access_key_id = "AKIAEXAMPLE",
	.secret_access_key = "secret",
};
static const char key[] = "dead-letters/2026/01/01/dead-letters-1-9.ndjson.gz";

/* The text between <tag> and </tag> of a C string, "" when there is none. */
static const char *
xml_text(const char *body, const char *tag, char *out, size_t out_size)
{
	char open[32], close[32];
	const char *start, *end;

	snprintf(open, sizeof(open), "<%s>", tag);
	snprintf(close, sizeof(close), "</%s>", tag);
	out[0] = '\0';
	if (body == NULL || (start = strstr(body, open)) == NULL)
		return out;
	start += strlen(open);
	if ((end = strstr(start, close)) != NULL && (size_t) (end - start) < out_size)
	{
		memcpy(out, start, (size_t) (end - start));
		out[end - start] = '\0';
	}
	else if (end != NULL)
		return NULL; /* longer than out: not compared */
	return out;
}

/* The ERROR class report_failure must choose. */
static int
expected_class(const S3Result *r, const char *code)
{
	static const char *const credentials[] = {"InvalidToken", "ExpiredToken", "InvalidAccessKeyId",
											  "SignatureDoesNotMatch", "TokenRefreshRequired"};

	if (r->interrupted)
		return ERRCODE_QUERY_CANCELED;
	if (r->too_large)
		return ERRCODE_PROGRAM_LIMIT_EXCEEDED;
	if (r->curl_code != CURLE_OK)
		return ERRCODE_CONNECTION_FAILURE;
	if (r->status == 401 || r->status == 403)
		return ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION;
	for (size_t i = 0; code && i < sizeof(credentials) / sizeof(credentials[0]); i++)
		if (strcmp(code, credentials[i]) == 0)
			return ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION;
	if (r->status == 404)
		return ERRCODE_UNDEFINED_OBJECT;
	return code ? ERRCODE_EXTERNAL_ROUTINE_EXCEPTION : -1; /* -1: either of the last two */
}

static void
check_failure(S3Result *result, bool upload)
{
	sigjmp_buf caught;
	char code_buf[2048];
	const char *code = xml_text(result->body, "Code", code_buf, sizeof(code_buf));
	int want = expected_class(result, code);

	pg_stub_catch = &caught;
	if (sigsetjmp(caught, 0) == 0)
	{
		report_failure(&target, upload ? "upload" : "download", key, result);
		FUZZ_CHECK(!"report_failure returned");
	}
	pg_stub_catch = NULL;
	FUZZ_CHECK(pg_stub_error.elevel == ERROR);
	FUZZ_CHECK(result->body == NULL); /* freed before the ERROR */
	FUZZ_CHECK(want < 0 || pg_stub_error.sqlerrcode == want);
	FUZZ_CHECK(want >= 0 || pg_stub_error.sqlerrcode == ERRCODE_EXTERNAL_ROUTINE_EXCEPTION ||
			   pg_stub_error.sqlerrcode == ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION);
	FUZZ_CHECK(fuzz_terminated(pg_stub_error.message, sizeof(pg_stub_error.message)));
	FUZZ_CHECK(pg_stub_error.message[0] != '\0');
	if (pg_stub_error.sqlerrcode == ERRCODE_EXTERNAL_ROUTINE_EXCEPTION && code && code[0] &&
		strlen(code) < 1024)
		FUZZ_CHECK(strstr(pg_stub_error.message, code) != NULL);
}

/* zlib's own reading of the first gzip member of data; false when it is not gzip. */
static bool
gunzip(const char *data, size_t len, char **out, size_t *out_len)
{
	z_stream s;
	size_t cap = 4096;
	int rc = Z_OK;

	memset(&s, 0, sizeof(s));
	*out = malloc(cap);
	*out_len = 0;
	if (inflateInit2(&s, 15 + 16) != Z_OK)
		abort();
	s.next_in = (Bytef *) data;
	s.avail_in = (uInt) len;
	while (rc == Z_OK)
	{
		if (cap - *out_len < 4096)
			*out = realloc(*out, cap *= 2);
		s.next_out = (Bytef *) *out + *out_len;
		s.avail_out = (uInt) (cap - *out_len);
		rc = inflate(&s, Z_NO_FLUSH);
		*out_len = cap - s.avail_out;
		if (rc == Z_OK && s.avail_in == 0 && s.avail_out > 0)
			rc = Z_BUF_ERROR; /* wants more input: cut short */
	}
	inflateEnd(&s);
	return rc == Z_STREAM_END;
}

static void
check_download(S3Result *result, size_t max_len)
{
	sigjmp_buf caught;
	StringInfoData gz, ndjson;
	char *expected;
	size_t expected_len;
	bool valid;

	/* s3_get_object's end, then fetch_archive_object's decompression. */
	initStringInfo(&gz);
	appendBinaryStringInfo(&gz, result->body ? result->body : "", (int) result->body_len);
	free_result(result);
	valid = gunzip(gz.data, (size_t) gz.len, &expected, &expected_len);

	initStringInfo(&ndjson);
	pg_stub_catch = &caught;
	if (sigsetjmp(caught, 0) == 0)
	{
		gzip_decompress(gz.data, gz.len, &ndjson, max_len, "archive object \"x\"");
		pg_stub_catch = NULL;
		FUZZ_CHECK(valid);
		FUZZ_CHECK((size_t) ndjson.len <= max_len && ndjson.data[ndjson.len] == '\0');
		FUZZ_CHECK((size_t) ndjson.len == expected_len &&
				   memcmp(ndjson.data, expected, expected_len) == 0);
	}
	else
	{
		pg_stub_catch = NULL;
		FUZZ_CHECK(pg_stub_error.elevel == ERROR);
		FUZZ_CHECK(pg_stub_error.sqlerrcode == ERRCODE_DATA_CORRUPTED ||
				   pg_stub_error.sqlerrcode == ERRCODE_PROGRAM_LIMIT_EXCEEDED);
		if (pg_stub_error.sqlerrcode == ERRCODE_DATA_CORRUPTED)
			FUZZ_CHECK(!valid);
		else /* refused a chunk before reading it: the object may be that large */
			FUZZ_CHECK(!valid || expected_len + GZIP_CHUNK_BYTES > max_len);
	}
	free(expected);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_field f[1 + MAX_CHUNKS];
	int n = fuzz_split(data, size, f, 1 + MAX_CHUNKS);
	char *meta = fuzz_cstring(f[0]), *p = meta, *end;
	long long numbers[4] = {200, 0, 0, 0};
	char *sent = malloc(size + 1);
	size_t sent_len = 0, max_len;
	S3Result result;
	bool upload;

	for (int i = 0; i < 4 && *p; i++)
	{
		while (*p && !(*p >= '0' && *p <= '9'))
			p++;
		numbers[i] = strtoll(p, &end, 10);
		if (end == p)
			break;
		p = end;
	}
	memset(&result, 0, sizeof(result));
	result.status = (long) numbers[0];
	result.curl_code = (CURLcode) (numbers[1] % CURL_LAST);
	result.body_max =
		numbers[2] > 0 && numbers[2] < S3_MAX_ERROR_BODY ? (size_t) numbers[2] : S3_MAX_ERROR_BODY;
	max_len = numbers[3] > 0 ? (size_t) numbers[3] : ARCHIVE_MAX_OBJECT;
	result.interrupted = strchr(meta, 'I') != NULL;
	upload = strchr(meta, 'U') != NULL;

	/* The transfer: curl hands the body over in chunks until one is refused. */
	for (int i = 1; i < n; i++)
	{
		char *chunk = fuzz_exact_copy(f[i]);
		size_t taken = collect_body(chunk, 1, f[i].len, &result);

		free(chunk);
		if (taken != f[i].len)
		{
			FUZZ_CHECK(taken == 0 && result.too_large);
			break;
		}
		memcpy(sent + sent_len, f[i].data, f[i].len);
		sent_len += f[i].len;
	}
	FUZZ_CHECK(result.body_len == sent_len && result.body_len <= result.body_max);
	FUZZ_CHECK(result.body == NULL ||
			   (memcmp(result.body, sent, sent_len) == 0 && result.body[sent_len] == '\0'));

	/* What curl_easy_perform then returns. */
	if (result.too_large)
		result.curl_code = CURLE_WRITE_ERROR;
	if (result.interrupted)
		result.curl_code = CURLE_ABORTED_BY_CALLBACK;

	/* s3_put_object's and s3_get_object's test. */
	if (result.curl_code != CURLE_OK || result.status != 200)
		check_failure(&result, upload);
	else if (!upload)
		check_download(&result, max_len);
	free_result(&result);
	pg_stub_reset();
	free(sent);
	free(meta);
	return 0;
}
