-- A: an order and its event through wal_enqueue, in one transaction.
\set customer random(1, 100000)
\set amount random(100, 1000000)
\set r random(1, 1000000000000)
BEGIN;
INSERT INTO orders (customer, amount) VALUES (:customer, :amount / 100.0) RETURNING id \gset
SELECT wal_enqueue('bench.events', bench_payload(:id, :customer, :amount, :r), 'order-' || :id::text || '-created');
COMMIT;
