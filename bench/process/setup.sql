-- bench/process: the extension, a plain topic and a processing topic with an identity SQL
-- processor (acks -1, 3 partitions, replication factor 1: the test broker is one node).
CREATE EXTENSION wal_delivery;
UPDATE wal_delivery.settings
   SET internal_topic_replication_factor = 1, internal_topic_min_insync_replicas = 1;
CREATE SCHEMA bench_proc;
CREATE FUNCTION bench_proc.identity(payload bytea) RETURNS bytea
LANGUAGE sql IMMUTABLE AS $$ SELECT payload $$;
-- The workers log in as a non-superuser admin (wal-worker process refuses a superuser);
-- the processor runs as the processing role, which needs the schema.
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'bench_proc_worker') THEN
        CREATE ROLE bench_proc_worker LOGIN IN ROLE wal_delivery_worker;
    END IF;
END $$;
GRANT USAGE ON SCHEMA bench_proc TO wal_delivery_processor;
INSERT INTO wal_delivery.topics (name, acks, partitions, replication_factor, min_insync_replicas)
VALUES ('bench.plain', -1, 3, 1, 1);
INSERT INTO wal_delivery.topics (name, acks, partitions, replication_factor, min_insync_replicas,
                                 processor_kind, processor)
VALUES ('bench.proc', -1, 3, 1, 1, 'sql', 'bench_proc.identity');
