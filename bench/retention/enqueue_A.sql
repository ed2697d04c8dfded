-- A: one record, ~500-byte payload, a unique idempotency key, through the extension.
\set k random(1, 9000000000000000000)
SELECT wal_enqueue('bench_a', :payload::text, 'k-' || :k);
