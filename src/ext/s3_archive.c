/*
 * s3_archive.c: the SQL-callable side of dead-letter archival.
 *
 * wal_delivery.archive_dead_letter_batch() takes one batch of archive entries (SQL builds
 * each JSON line), gzips them into one archive object, uploads it, and only after S3's 200
 * hands the ids to mark_dead_letters_archived. wal_delivery.fetch_archive_object(key)
 * downloads and decompresses an object for restore_dead_letters.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "mb/pg_wchar.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"

#include "gzip_buffer.h"
#include "s3_request.h"
#include "s3_target.h"

PG_FUNCTION_INFO_V1(wal_delivery_archive_dead_letter_batch);
PG_FUNCTION_INFO_V1(wal_delivery_fetch_archive_object);

/* An object's size limits for restore: what one text value can hold. */
#define ARCHIVE_MAX_OBJECT_BYTES ((size_t) MaxAllocSize - VARHDRSZ - 1)

/* One batch read from dead_letters_to_archive, cut to the byte limit. */
typedef struct ArchiveBatch
{
	StringInfoData ndjson;
	Datum *ids;
	int rows;
	int64 first_id;
	int64 last_id;
	char *first_day; /* YYYY/MM/DD of the first entry's failure, UTC */
} ArchiveBatch;

/* Reads up to batch_rows entries; keeps as many as fit batch_bytes (at least one). */
static void
read_batch(const S3Target *target, ArchiveBatch *batch)
{
	Oid argtypes[1] = {INT4OID};
	Datum args[1] = {Int32GetDatum(target->batch_rows)};
	TupleDesc desc;

	if (SPI_execute_with_args(
			"SELECT id, failed_day, entry FROM wal_delivery.dead_letters_to_archive($1)", 1,
			argtypes, args, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read dead letters to archive");
	desc = SPI_tuptable->tupdesc;
	initStringInfo(&batch->ndjson);
	batch->ids = palloc(sizeof(Datum) * Max(SPI_processed, 1));
	batch->rows = 0;
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		HeapTuple tuple = SPI_tuptable->vals[i];
		bool isnull;
		int64 id = DatumGetInt64(SPI_getbinval(tuple, desc, 1, &isnull));
		char *entry = SPI_getvalue(tuple, desc, 3);
		size_t entry_len = strlen(entry);

		if (batch->rows > 0 && batch->ndjson.len + entry_len + 1 > (size_t) target->batch_bytes)
			break;
		if (batch->rows == 0)
		{
			batch->first_id = id;
			batch->first_day = SPI_getvalue(tuple, desc, 2);
		}
		appendBinaryStringInfo(&batch->ndjson, entry, (int) entry_len);
		appendStringInfoChar(&batch->ndjson, '\n');
		batch->ids[batch->rows++] = Int64GetDatum(id);
		batch->last_id = id;
	}
}

/* prefix/YYYY/MM/DD/dead-letters-<first id>-<last id>.ndjson.gz: same rows, same name. */
static char *
archive_object_name(const S3Target *target, const ArchiveBatch *batch)
{
	return psprintf("%s%s%s/dead-letters-" INT64_FORMAT "-" INT64_FORMAT ".ndjson.gz",
					target->prefix, target->prefix[0] ? "/" : "", batch->first_day, batch->first_id,
					batch->last_id);
}

static int
mark_archived(const ArchiveBatch *batch, const char *object)
{
	Oid argtypes[2] = {INT8ARRAYOID, TEXTOID};
	Datum args[2];
	bool isnull;

	args[0] = PointerGetDatum(construct_array(batch->ids, batch->rows, INT8OID, sizeof(int64),
											  FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	args[1] = CStringGetTextDatum(object);
	if (SPI_execute_with_args("SELECT wal_delivery.mark_dead_letters_archived($1, $2)", 2, argtypes,
							  args, NULL, false, 1) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "could not mark archived dead letters");
	return DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

Datum
wal_delivery_archive_dead_letter_batch(PG_FUNCTION_ARGS)
{
	MemoryContext caller = CurrentMemoryContext;
	S3Target target;
	ArchiveBatch batch;
	StringInfoData gz, result;
	char *object;
	int marked;

	SPI_connect();
	s3_target_load(&target);
	read_batch(&target, &batch);
	if (batch.rows == 0)
	{
		SPI_finish();
		PG_RETURN_NULL();
	}
	initStringInfo(&gz);
	gzip_compress(batch.ndjson.data, batch.ndjson.len, &gz);
	object = archive_object_name(&target, &batch);

	s3_put_object(&target, object, gz.data, gz.len, "application/gzip");
	marked = mark_archived(&batch, object);
	if (marked != batch.rows)
		elog(ERROR, "marked %d of %d archived dead letters", marked, batch.rows);

	MemoryContextSwitchTo(caller);
	initStringInfo(&result);
	appendStringInfoString(&result, "{\"object\": ");
	escape_json(&result, object);
	appendStringInfo(&result,
					 ", \"rows\": %d, \"first_id\": " INT64_FORMAT ", \"last_id\": " INT64_FORMAT
					 ", \"bytes\": %d, \"compressed_bytes\": %d}",
					 batch.rows, batch.first_id, batch.last_id, batch.ndjson.len, gz.len);
	SPI_finish();
	PG_RETURN_DATUM(DirectFunctionCall1(jsonb_in, CStringGetDatum(result.data)));
}

Datum
wal_delivery_fetch_archive_object(PG_FUNCTION_ARGS)
{
	char *object = text_to_cstring(PG_GETARG_TEXT_PP(0));
	MemoryContext caller = CurrentMemoryContext;
	S3Target target;
	StringInfoData gz, ndjson;
	text *out;

	SPI_connect();
	s3_target_load(&target);
	SPI_finish();

	initStringInfo(&gz);
	s3_get_object(&target, object, &gz, ARCHIVE_MAX_OBJECT_BYTES);
	initStringInfo(&ndjson);
	gzip_decompress(gz.data, gz.len, &ndjson, ARCHIVE_MAX_OBJECT_BYTES,
					psprintf("archive object \"%s\"", object));
	pg_verifymbstr(ndjson.data, ndjson.len, false);
	MemoryContextSwitchTo(caller);
	out = cstring_to_text_with_len(ndjson.data, ndjson.len);
	PG_RETURN_TEXT_P(out);
}
