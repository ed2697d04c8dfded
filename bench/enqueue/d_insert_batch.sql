-- D (baseline for C): the same 100 rows in one plain INSERT ... SELECT.
\set customer random(1, 100000)
\set amount random(100, 1000000)
\set r random(1, 1000000000000)
INSERT INTO bench_baseline_outbox (topic, idempotency_key, content_type, payload, enqueued_by)
SELECT 'bench.events', 'batch-' || :r::text || '-' || i, 'application/json',
       convert_to(bench_payload(:r::bigint + i, :customer, :amount, :r::bigint + i)::text, 'UTF8'), current_user::regrole
  FROM generate_series(1, 100) i;
