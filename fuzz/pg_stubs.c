/*
 * pg_stubs.c: see pg_stubs.h. Compiled with the server's headers, like the extension.
 *
 * Only what src/ext/s3_request.c and src/ext/gzip_buffer.c call is here. The functions
 * behind an S3 transfer itself (building the request's URL, headers and hashes) are
 * never reached by the fuzz target; they abort if they are.
 */
#include "postgres.h"

#include <signal.h>

#include "common/base64.h"
#include "common/cryptohash.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "utils/memutils.h"

#include "pg_compat.h"
#include "pg_stubs.h"
#include "s3_target.h"

/* The backend's printf family, replaced by libc's (port.h renames the calls). */
#undef vsnprintf
#undef snprintf
#undef sprintf
#undef vsprintf
#undef vfprintf
#undef fprintf
#undef printf

pg_stub_error_data pg_stub_error;
sigjmp_buf *pg_stub_catch;

volatile sig_atomic_t InterruptPending = false;
volatile sig_atomic_t QueryCancelPending = false;
volatile sig_atomic_t ProcDiePending = false;

static void
unreachable(const char *what)
{
	fprintf(stderr, "pg_stubs: %s is not stood in for: the fuzz target must not reach it\n", what);
	abort();
}

/* ---------------------------------------------------------------- palloc */

typedef struct chunk
{
	struct chunk *prev;
	struct chunk *next;
} chunk; /* 16 bytes: what follows keeps malloc's alignment */

static chunk arena = {&arena, &arena};
static long live;

static void *
chunk_data(chunk *c)
{
	return c + 1;
}

static chunk *
chunk_of(void *p)
{
	return (chunk *) p - 1;
}

static void
link_chunk(chunk *c)
{
	c->prev = arena.prev;
	c->next = &arena;
	arena.prev->next = c;
	arena.prev = c;
	live++;
}

static void
unlink_chunk(chunk *c)
{
	c->prev->next = c->next;
	c->next->prev = c->prev;
	live--;
}

void *
palloc(Size size)
{
	chunk *c;

	if (!AllocSizeIsValid(size))
		elog(ERROR, "invalid memory alloc request size %zu", size);
	c = malloc(sizeof(chunk) + size);
	if (c == NULL)
		abort();
	link_chunk(c);
	return chunk_data(c);
}

void *
palloc0(Size size)
{
	void *p = palloc(size);

	memset(p, 0, size);
	return p;
}

void
pfree(void *pointer)
{
	chunk *c = chunk_of(pointer);

	unlink_chunk(c);
	free(c);
}

void *
repalloc(void *pointer, Size size)
{
	chunk *c = chunk_of(pointer);

	if (!AllocSizeIsValid(size))
		elog(ERROR, "invalid memory alloc request size %zu", size);
	unlink_chunk(c);
	c = realloc(c, sizeof(chunk) + size);
	if (c == NULL)
		abort();
	link_chunk(c);
	return chunk_data(c);
}

char *
pstrdup(const char *in)
{
	return pnstrdup(in, strlen(in));
}

char *
pnstrdup(const char *in, Size len)
{
	char *out;

	len = strnlen(in, len);
	out = palloc(len + 1);
	memcpy(out, in, len);
	out[len] = '\0';
	return out;
}

char *
psprintf(const char *fmt, ...)
{
	va_list ap;
	int len;
	char *out;

	va_start(ap, fmt);
	len = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	out = palloc((Size) len + 1);
	va_start(ap, fmt);
	vsnprintf(out, (size_t) len + 1, fmt, ap);
	va_end(ap);
	return out;
}

void
pg_stub_reset(void)
{
	while (arena.next != &arena)
	{
		chunk *c = arena.next;

		unlink_chunk(c);
		free(c);
	}
}

long
pg_stub_live_chunks(void)
{
	return live;
}

/* ---------------------------------------------------------------- StringInfo */

void
initStringInfo(StringInfo str)
{
	str->maxlen = 1024;
	str->data = palloc(str->maxlen);
	resetStringInfo(str);
}

void
resetStringInfo(StringInfo str)
{
	str->data[0] = '\0';
	str->len = 0;
	str->cursor = 0;
}

/* As the backend's: room for needed more bytes and the terminator, or an ERROR. */
void
enlargeStringInfo(StringInfo str, int needed)
{
	int newlen;

	if (needed < 0)
		elog(ERROR, "invalid string enlargement request size: %d", needed);
	if (((Size) needed) >= (MaxAllocSize - (Size) str->len))
		ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED), errmsg("out of memory"),
						errdetail("Cannot enlarge string buffer containing %d bytes by %d more "
								  "bytes.",
								  str->len, needed)));
	needed += str->len + 1;
	if (needed <= str->maxlen)
		return;
	newlen = 2 * str->maxlen;
	while (needed > newlen)
		newlen = 2 * newlen;
	if (newlen > (int) MaxAllocSize)
		newlen = (int) MaxAllocSize;
	str->data = repalloc(str->data, newlen);
	str->maxlen = newlen;
}

void
appendBinaryStringInfo(StringInfo str, compat_binary_data data, int datalen)
{
	enlargeStringInfo(str, datalen);
	memcpy(str->data + str->len, data, datalen);
	str->len += datalen;
	str->data[str->len] = '\0';
}

/* ---------------------------------------------------------------- ereport */

static pg_stub_error_data current;

bool
errstart(int elevel, const char *domain)
{
	if (elevel < ERROR)
		return false; /* notices and warnings: dropped */
	memset(&current, 0, sizeof(current));
	current.elevel = elevel;
	current.sqlerrcode = ERRCODE_INTERNAL_ERROR;
	return true;
}

bool
errstart_cold(int elevel, const char *domain)
{
	return errstart(elevel, domain);
}

void
errfinish(const char *filename, int lineno, const char *funcname)
{
	pg_stub_error = current;
	if (pg_stub_catch == NULL)
	{
		fprintf(stderr, "pg_stubs: uncaught ERROR at %s:%d: %s\n", filename, lineno,
				current.message);
		abort();
	}
	siglongjmp(*pg_stub_catch, 1);
}

int
errcode(int sqlerrcode)
{
	current.sqlerrcode = sqlerrcode;
	return 0;
}

#define FORMAT_INTO(buf)                                                                           \
	do                                                                                             \
	{                                                                                              \
		va_list ap;                                                                                \
                                                                                                   \
		va_start(ap, fmt);                                                                         \
		vsnprintf((buf), sizeof(buf), fmt, ap);                                                    \
		va_end(ap);                                                                                \
	} while (0)

int
errmsg(const char *fmt, ...)
{
	FORMAT_INTO(current.message);
	return 0;
}

int
errmsg_internal(const char *fmt, ...)
{
	FORMAT_INTO(current.message);
	return 0;
}

int
errdetail(const char *fmt, ...)
{
	FORMAT_INTO(current.detail);
	return 0;
}

int
errhint(const char *fmt, ...)
{
	FORMAT_INTO(current.hint);
	return 0;
}

void
ProcessInterrupts(void)
{
	unreachable("ProcessInterrupts");
}

/* ---------------------------------------------------------------- port.h's names */

int
pg_vsnprintf(char *str, size_t count, const char *fmt, va_list args)
{
	return vsnprintf(str, count, fmt, args);
}

int
pg_snprintf(char *str, size_t count, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(str, count, fmt, ap);
	va_end(ap);
	return n;
}

int
pg_sprintf(char *str, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsprintf(str, fmt, ap);
	va_end(ap);
	return n;
}

int
pg_vfprintf(FILE *stream, const char *fmt, va_list args)
{
	return vfprintf(stream, fmt, args);
}

int
pg_fprintf(FILE *stream, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vfprintf(stream, fmt, ap);
	va_end(ap);
	return n;
}

size_t
strlcpy(char *dst, const char *src, size_t siz)
{
	size_t len = strlen(src);

	if (siz > 0)
	{
		size_t n = len < siz - 1 ? len : siz - 1;

		memcpy(dst, src, n);
		dst[n] = '\0';
	}
	return len;
}

/* ---------------------------------------------------------------- never reached */

List *
lappend(List *list, void *datum)
{
	unreachable("lappend");
	return NULL;
}

char *
s3_object_url(const S3Target *target, const char *key)
{
	unreachable("s3_object_url");
	return NULL;
}

pg_cryptohash_ctx *
pg_cryptohash_create(pg_cryptohash_type type)
{
	unreachable("pg_cryptohash_create");
	return NULL;
}

int
pg_cryptohash_init(pg_cryptohash_ctx *ctx)
{
	unreachable("pg_cryptohash_init");
	return -1;
}

int
pg_cryptohash_update(pg_cryptohash_ctx *ctx, const uint8 *data, size_t len)
{
	unreachable("pg_cryptohash_update");
	return -1;
}

int
pg_cryptohash_final(pg_cryptohash_ctx *ctx, uint8 *dest, size_t len)
{
	unreachable("pg_cryptohash_final");
	return -1;
}

void
pg_cryptohash_free(pg_cryptohash_ctx *ctx)
{
	unreachable("pg_cryptohash_free");
}

const char *
pg_cryptohash_error(pg_cryptohash_ctx *ctx)
{
	unreachable("pg_cryptohash_error");
	return NULL;
}

int
pg_b64_encode(const char *src, int len, char *dst, int dstlen)
{
	unreachable("pg_b64_encode");
	return -1;
}
