-- A-tuned: the same record through a copy of the extension's enqueue into bench_a2.outbox.
\set k random(1, 9000000000000000000)
SELECT bench_a2.wal_enqueue('bench_a2', :payload::text, 'k-' || :k);
