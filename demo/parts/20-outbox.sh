# Demo part: the control plane, the outbox and the relay. (Sourced by demo/run.)
# shellcheck shell=bash
demo_step "configuring a topic, a destination and a subscription with SQL"
psql -X -q -v ON_ERROR_STOP=1 -v dest="$DEST_URL/orders" <<'SQL'
CREATE EXTENSION IF NOT EXISTS wal_delivery;
-- One local broker: the retry and DLQ topics cannot have 3 replicas here.
UPDATE wal_delivery.settings SET internal_topic_replication_factor = 1, internal_topic_min_insync_replicas = 1;
INSERT INTO wal_delivery.topics (name, partitions, replication_factor, min_insync_replicas)
VALUES ('orders.events', 1, 1, 1);
INSERT INTO wal_delivery.destinations (name, endpoint) VALUES ('sample-destination', :'dest');
INSERT INTO wal_delivery.subscriptions (topic, destination) VALUES ('orders.events', 'sample-destination');
-- The workers log in as this role: a member of wal_delivery_worker (their least rights), never a superuser.
CREATE ROLE wal_worker LOGIN IN ROLE wal_delivery_worker;
SELECT name, acks, partitions, retention FROM wal_delivery.topics;
SELECT topic, destination FROM wal_delivery.subscriptions;
SQL

demo_step "enqueueing sample records inside application transactions (one rolls back)"
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
SQL

demo_step "the relay ships committed records to Kafka; a row is stored once Kafka acknowledged it"
for _ in $(seq 1 150); do
  [ "$(psql -X -A -t -c "SELECT count(*) FROM wal_delivery.outbox WHERE state <> 'stored'")" = 0 ] && break
  sleep 0.2
done
psql -X -q <<'SQL'
SELECT id, idempotency_key, state, convert_from(payload, 'UTF8') AS payload
  FROM wal_delivery.outbox ORDER BY id;
SELECT topic, role, partitions, ready FROM wal_delivery.reconcile_status ORDER BY topic;
SELECT version, published_version, in_sync FROM wal_delivery.config_status;
SQL

demo_step "reading topic orders.events back from Kafka with kcat"
kcat -C -b "$KAFKA_BOOTSTRAP" -t orders.events -o beginning -e -q \
  -f 'offset=%o key=%k headers=%h\n  value=%s\n'
