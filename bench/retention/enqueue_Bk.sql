-- B-keys: the same record into the partitioned outbox, deduplicated through bench_bk.keys.
\set k random(1, 9000000000000000000)
SELECT bench_bk.wal_enqueue('bench_bk', :payload::text, 'k-' || :k);
