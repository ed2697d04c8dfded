-- The upgrade path: install the oldest version, update step by step with data in the
-- tables, and end with exactly the objects a fresh install has.
\pset format unaligned
DROP EXTENSION wal_delivery CASCADE;
CREATE EXTENSION wal_delivery VERSION '0.1';
SELECT extversion FROM pg_extension WHERE extname = 'wal_delivery';
ALTER EXTENSION wal_delivery UPDATE TO '0.2';
-- Data written under 0.2 survives the next update, and gains what 0.3 adds.
INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas) VALUES ('old.events', 1, 1);
INSERT INTO wal_delivery.destinations (name, endpoint) VALUES ('old-b', 'http://b.test/'), ('old-a', 'http://a.test/');
SELECT wal_enqueue('old.events', '{"kept": true}'::jsonb, 'kept-1') IS NOT NULL AS enqueued_under_0_2;
ALTER EXTENSION wal_delivery UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'wal_delivery';
SELECT topic, idempotency_key, state FROM wal_delivery.outbox;
-- Existing destinations got retry partitions in creation order; new ones take the next.
SELECT name, retry_partition FROM wal_delivery.destinations ORDER BY retry_partition;
INSERT INTO wal_delivery.destinations (name, endpoint) VALUES ('new-c', 'http://c.test/');
SELECT name, retry_partition FROM wal_delivery.destinations WHERE name = 'new-c';
SELECT * FROM regress.try($$UPDATE wal_delivery.destinations SET retry_partition = 7 WHERE name = 'new-c'$$);
CREATE TEMP TABLE upgraded AS
SELECT pg_describe_object(classid, objid, objsubid) AS object FROM pg_depend
 WHERE refobjid = (SELECT oid FROM pg_extension WHERE extname = 'wal_delivery') AND deptype = 'e';
DROP EXTENSION wal_delivery;
CREATE EXTENSION wal_delivery;
CREATE TEMP TABLE fresh AS
SELECT pg_describe_object(classid, objid, objsubid) AS object FROM pg_depend
 WHERE refobjid = (SELECT oid FROM pg_extension WHERE extname = 'wal_delivery') AND deptype = 'e';
SELECT count(*) AS objects FROM fresh;
SELECT 'only after update' AS side, object FROM (SELECT * FROM upgraded EXCEPT SELECT * FROM fresh) x
UNION ALL
SELECT 'only in fresh install', object FROM (SELECT * FROM fresh EXCEPT SELECT * FROM upgraded) y;
