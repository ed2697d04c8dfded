-- bench/relay: the extension, one bench topic (acks -1, 3 partitions, replication factor 1)
-- and internal topics with replication factor 1 (the test broker is a single node).
CREATE EXTENSION wal_delivery;
UPDATE wal_delivery.settings
   SET internal_topic_replication_factor = 1, internal_topic_min_insync_replicas = 1;
INSERT INTO wal_delivery.topics (name, acks, partitions, replication_factor, min_insync_replicas)
VALUES ('bench.relay', -1, 3, 1, 1);
