-- D (baseline for C): the same 100 rows in one plain INSERT ... SELECT.
\set customer random(1, 100000)
\set amount random(100, 1000000)
\set r random(1, 1000000000000)
INSERT INTO bench_baseline_outbox (gen, lane, caller_key, id, enqueued_by, enqueued_by_session, topic,
                                   idempotency_key, content_type, payload)
SELECT 0, n.id % 8, true, n.id, current_user::regrole, session_user::regrole, 'bench.events',
       'batch-' || :r::text || '-' || n.i, 'application/json',
       convert_to(bench_payload(:r::bigint + n.i, :customer, :amount, :r::bigint + n.i)::text, 'UTF8')
  FROM (SELECT nextval('bench_baseline_ids') AS id, i FROM generate_series(1, 100) i) n
 ORDER BY n.i;
