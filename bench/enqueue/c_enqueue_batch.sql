-- C: 100 events in one wal_enqueue_batch call (its own transaction).
\set customer random(1, 100000)
\set amount random(100, 1000000)
\set r random(1, 1000000000000)
SELECT wal_enqueue_batch('bench.events',
    ARRAY(SELECT bench_payload(:r::bigint + i, :customer, :amount, :r::bigint + i) FROM generate_series(1, 100) i),
    ARRAY(SELECT 'batch-' || :r::text || '-' || i FROM generate_series(1, 100) i));
