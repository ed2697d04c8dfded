/*
 * gzip_buffer.h: gzip in memory with zlib, for archive objects. The output has no file
 * name and a zero mtime, so the same input always gives the same bytes.
 */
#ifndef WAL_DELIVERY_GZIP_BUFFER_H
#define WAL_DELIVERY_GZIP_BUFFER_H

#include "lib/stringinfo.h"

/* Appends the gzip of data to out. */
extern void gzip_compress(const char *data, size_t len, StringInfo out);

/* Appends the decompressed data to out; ERROR if it is not gzip or exceeds max_len. */
extern void gzip_decompress(const char *data, size_t len, StringInfo out, size_t max_len,
							const char *what);

#endif
