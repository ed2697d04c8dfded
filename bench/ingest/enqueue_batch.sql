-- bench/ingest (d): what the ingest outbox writer does per call, from SQL: :batch records
-- of 500 bytes of JSON (as text) in one wal_enqueue_batch call, its own transaction.
SELECT wal_enqueue_batch('bench.ingest',
    array_fill(('{"pad": "' || repeat('x', 489) || '"}')::jsonb, ARRAY[:batch::int]),
    ARRAY(SELECT gen_random_uuid()::text FROM generate_series(1, :batch::int)));
