-- B (baseline for A): the same order and the same outbox bytes with a plain INSERT.
\set customer random(1, 100000)
\set amount random(100, 1000000)
\set r random(1, 1000000000000)
BEGIN;
INSERT INTO orders (customer, amount) VALUES (:customer, :amount / 100.0) RETURNING id \gset
INSERT INTO bench_baseline_outbox (gen, lane, caller_key, id, enqueued_by, enqueued_by_session, topic,
                                   idempotency_key, content_type, payload)
SELECT 0, n.id % 8, true, n.id, current_user::regrole, session_user::regrole, 'bench.events',
       'order-' || :id::text || '-created', 'application/json',
       convert_to(bench_payload(:id, :customer, :amount, :r)::text, 'UTF8')
  FROM (SELECT nextval('bench_baseline_ids') AS id) n;
COMMIT;
