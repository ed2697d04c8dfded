-- The upgrade path: install the oldest version, update to the newest, and end with
-- exactly the objects a fresh install has.
\pset format unaligned
DROP EXTENSION wal_delivery CASCADE;
CREATE EXTENSION wal_delivery VERSION '0.1';
SELECT extversion FROM pg_extension WHERE extname = 'wal_delivery';
ALTER EXTENSION wal_delivery UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'wal_delivery';
CREATE TEMP TABLE upgraded AS
SELECT pg_describe_object(classid, objid, objsubid) AS object FROM pg_depend
 WHERE refobjid = (SELECT oid FROM pg_extension WHERE extname = 'wal_delivery') AND deptype = 'e';
-- The updated extension works.
INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas) VALUES ('up.events', 1, 1);
SELECT wal_enqueue('up.events', '{}'::jsonb) IS NOT NULL AS enqueued_after_update;
DROP EXTENSION wal_delivery;
CREATE EXTENSION wal_delivery;
CREATE TEMP TABLE fresh AS
SELECT pg_describe_object(classid, objid, objsubid) AS object FROM pg_depend
 WHERE refobjid = (SELECT oid FROM pg_extension WHERE extname = 'wal_delivery') AND deptype = 'e';
SELECT count(*) AS objects FROM fresh;
SELECT 'only after update' AS side, object FROM (SELECT * FROM upgraded EXCEPT SELECT * FROM fresh) x
UNION ALL
SELECT 'only in fresh install', object FROM (SELECT * FROM fresh EXCEPT SELECT * FROM upgraded) y;
