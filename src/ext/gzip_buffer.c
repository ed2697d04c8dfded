/*
 * gzip_buffer.c: gzip compression and decompression of in-memory buffers with zlib.
 * zlib allocates from the current memory context, so an ERROR leaks nothing.
 */
#include "postgres.h"

#include <zlib.h>

#include "gzip_buffer.h"

/* windowBits 15 plus 16: the gzip wrapper instead of raw zlib. */
#define GZIP_WINDOW_BITS (15 + 16)
#define GZIP_CHUNK       65536

static voidpf
gzip_alloc(voidpf opaque, uInt items, uInt size)
{
	return palloc((Size) items * size);
}

static void
gzip_free(voidpf opaque, voidpf address)
{
	pfree(address);
}

static void
gzip_stream_init(z_stream *stream, const char *data, size_t len)
{
	memset(stream, 0, sizeof(*stream));
	stream->zalloc = gzip_alloc;
	stream->zfree = gzip_free;
	stream->next_in = (Bytef *) data;
	stream->avail_in = (uInt) len;
}

void
gzip_compress(const char *data, size_t len, StringInfo out)
{
	z_stream stream;
	int rc;

	gzip_stream_init(&stream, data, len);
	if (deflateInit2(&stream, Z_DEFAULT_COMPRESSION, Z_DEFLATED, GZIP_WINDOW_BITS, 8,
					 Z_DEFAULT_STRATEGY) != Z_OK)
		elog(ERROR, "could not initialise gzip compression: %s", stream.msg ? stream.msg : "");
	do
	{
		enlargeStringInfo(out, GZIP_CHUNK);
		stream.next_out = (Bytef *) out->data + out->len;
		stream.avail_out = GZIP_CHUNK;
		rc = deflate(&stream, Z_FINISH);
		if (rc == Z_STREAM_ERROR)
			elog(ERROR, "gzip compression failed");
		out->len += GZIP_CHUNK - stream.avail_out;
	} while (rc != Z_STREAM_END);
	deflateEnd(&stream);
	out->data[out->len] = '\0';
}

void
gzip_decompress(const char *data, size_t len, StringInfo out, size_t max_len, const char *what)
{
	z_stream stream;
	int rc;

	gzip_stream_init(&stream, data, len);
	if (inflateInit2(&stream, GZIP_WINDOW_BITS) != Z_OK)
		elog(ERROR, "could not initialise gzip decompression: %s", stream.msg ? stream.msg : "");
	do
	{
		if ((size_t) out->len + GZIP_CHUNK > max_len)
			ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
							errmsg("%s is larger than %zu bytes uncompressed", what, max_len)));
		enlargeStringInfo(out, GZIP_CHUNK);
		stream.next_out = (Bytef *) out->data + out->len;
		stream.avail_out = GZIP_CHUNK;
		rc = inflate(&stream, Z_NO_FLUSH);
		if (rc != Z_OK && rc != Z_STREAM_END)
			ereport(
				ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("%s is not valid gzip: %s", what,
						stream.msg ? stream.msg : (rc == Z_BUF_ERROR ? "truncated" : "bad data")),
				 errhint("Archive objects are written by wal_delivery.archive_dead_letters as "
						 ".ndjson.gz; check the key.")));
		out->len += GZIP_CHUNK - stream.avail_out;
	} while (rc != Z_STREAM_END);
	inflateEnd(&stream);
	out->data[out->len] = '\0';
}
