-- B-lookup: the same record into the partitioned outbox, deduplicated by an advisory lock
-- and a lookup in every attached partition.
\set k random(1, 9000000000000000000)
SELECT bench_bl.wal_enqueue('bench_bl', :payload::text, 'k-' || :k);
