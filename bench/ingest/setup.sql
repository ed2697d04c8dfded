-- bench/ingest: the extension, one bench topic (acks -1, 3 partitions, replication factor 1)
-- for the ingest service and one for the raw producer, internal topics with replication
-- factor 1 (one broker), and the ingest service's login role.
CREATE EXTENSION wal_delivery;
UPDATE wal_delivery.settings
   SET internal_topic_replication_factor = 1, internal_topic_min_insync_replicas = 1;
INSERT INTO wal_delivery.topics (name, acks, partitions, replication_factor, min_insync_replicas)
VALUES ('bench.ingest', -1, 3, 1, 1), ('bench.ingest_raw', -1, 3, 1, 1);
CREATE ROLE wal_ingest_bench LOGIN IN ROLE wal_delivery_ingest;
