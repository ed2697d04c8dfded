# Demo part: the control plane and the outbox. (Sourced by demo/run.)
step "configuring a topic, a destination and a subscription with SQL"
psql -X -q -v ON_ERROR_STOP=1 -v dest="$DEST_URL/orders" <<'SQL'
CREATE EXTENSION IF NOT EXISTS wal_delivery;
INSERT INTO wal_delivery.topics (name, partitions, replication_factor, min_insync_replicas)
VALUES ('orders.events', 1, 1, 1);
INSERT INTO wal_delivery.destinations (name, endpoint) VALUES ('sample-destination', :'dest');
INSERT INTO wal_delivery.subscriptions (topic, destination) VALUES ('orders.events', 'sample-destination');
SELECT name, acks, partitions, retention FROM wal_delivery.topics;
SELECT topic, destination FROM wal_delivery.subscriptions;
SQL

step "enqueueing sample records inside application transactions (one rolls back)"
psql -X -q -v ON_ERROR_STOP=1 <<'SQL'
CREATE TABLE IF NOT EXISTS orders (id int PRIMARY KEY, amount numeric);
BEGIN;
INSERT INTO orders VALUES (1, 9.99);
SELECT wal_enqueue('orders.events', '{"order_id": 1, "event": "created"}'::jsonb, 'order-1-created') AS outbox_id;
COMMIT;
BEGIN;
INSERT INTO orders VALUES (2, 5.00);
SELECT wal_enqueue_batch('orders.events',
    ARRAY['{"order_id": 2, "event": "created"}', '{"order_id": 2, "event": "paid"}']::jsonb[],
    ARRAY['order-2-created', 'order-2-paid']) AS outbox_ids;
COMMIT;
BEGIN;
INSERT INTO orders VALUES (3, 1.00);
SELECT wal_enqueue('orders.events', '{"order_id": 3, "event": "created"}'::jsonb, 'order-3-created') AS outbox_id;
ROLLBACK;
-- A retried enqueue with the same idempotency key returns the first id and writes nothing.
SELECT wal_enqueue('orders.events', '{"order_id": 1, "event": "created"}'::jsonb, 'order-1-created') AS same_outbox_id;
SELECT id, idempotency_key, state, convert_from(payload, 'UTF8') AS payload
  FROM wal_delivery.outbox ORDER BY id;
SELECT topic, state, records FROM wal_delivery.backlog;
SQL
echo "The outbox holds the committed records only; the relay (next part) ships them to Kafka."
