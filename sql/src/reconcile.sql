-- Reconciliation with Kafka. The reconciler background worker (src/ext/reconcile.c)
-- creates and alters the Kafka topics the control plane describes (main topics, the three
-- retry steps with one partition per destination, the DLQ), records what it found in
-- wal_delivery.kafka_topics, and only when Kafka matches publishes the config version
-- that workers follow (NOTIFY wal_delivery_published).

-- What the reconciler found and did, one row per Kafka topic it manages.
CREATE TABLE wal_delivery.kafka_topics (
    topic text PRIMARY KEY,
    role text NOT NULL CHECK (role IN ('main', 'retry', 'dlq')),
    partitions integer NOT NULL,
    replication_factor smallint NOT NULL,
    min_insync_replicas smallint NOT NULL,
    retention interval NOT NULL,
    ready boolean NOT NULL DEFAULT false,        -- exists in Kafka with these settings
    error text,                                  -- why not, or what does not match
    error_is_permanent boolean NOT NULL DEFAULT false,  -- retrying cannot help
    config_version bigint,
    reconciled_at timestamptz
);

-- The Kafka topics the control plane asks for: every main topic, the three retry steps
-- (one partition per destination ever created) and the DLQ.
CREATE FUNCTION wal_delivery.desired_kafka_topics()
RETURNS TABLE (topic text, role text, partitions integer, replication_factor smallint,
               min_insync_replicas smallint, retention_ms bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT t.name, 'main', t.partitions, t.replication_factor, t.min_insync_replicas,
           (extract(epoch FROM t.retention) * 1000)::bigint
      FROM wal_delivery.topics t
    UNION ALL
    SELECT s.retry_topic_prefix || step, 'retry',
           greatest(1, (SELECT coalesce(max(retry_partition), -1) + 1 FROM wal_delivery.destinations)),
           s.internal_topic_replication_factor, s.internal_topic_min_insync_replicas,
           (extract(epoch FROM s.retry_dlq_retention) * 1000)::bigint
      FROM wal_delivery.settings s, generate_series(1, 3) step
    UNION ALL
    SELECT s.dlq_topic, 'dlq', 1, s.internal_topic_replication_factor,
           s.internal_topic_min_insync_replicas, (extract(epoch FROM s.retry_dlq_retention) * 1000)::bigint
      FROM wal_delivery.settings s
$$;

-- The reconciler's report for one round: a JSON array of {topic, role, partitions,
-- replication_factor, min_insync_replicas, retention_ms, ready, error, permanent}.
-- Publishes p_version when every topic is ready. Returns whether it published.
CREATE FUNCTION wal_delivery.record_reconciliation(p_version bigint, p_results jsonb) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    all_ready boolean;
BEGIN
    INSERT INTO wal_delivery.kafka_topics AS k (topic, role, partitions, replication_factor,
        min_insync_replicas, retention, ready, error, error_is_permanent, config_version, reconciled_at)
    SELECT r.topic, r.role, r.partitions, r.replication_factor, r.min_insync_replicas,
           make_interval(secs => r.retention_ms / 1000.0), r.ready, r.error,
           coalesce(r.permanent, false), p_version, now()
      FROM jsonb_to_recordset(p_results) AS r(topic text, role text, partitions integer,
           replication_factor smallint, min_insync_replicas smallint, retention_ms bigint,
           ready boolean, error text, permanent boolean)
    ON CONFLICT (topic) DO UPDATE SET
        role = excluded.role, partitions = excluded.partitions,
        replication_factor = excluded.replication_factor,
        min_insync_replicas = excluded.min_insync_replicas, retention = excluded.retention,
        ready = excluded.ready, error = excluded.error,
        error_is_permanent = excluded.error_is_permanent,
        config_version = excluded.config_version, reconciled_at = excluded.reconciled_at;
    -- Topics no longer configured are forgotten here; Kafka keeps them (and their data).
    DELETE FROM wal_delivery.kafka_topics
     WHERE topic NOT IN (SELECT r->>'topic' FROM jsonb_array_elements(p_results) r);

    SELECT bool_and((r->>'ready')::boolean) INTO all_ready FROM jsonb_array_elements(p_results) r;
    IF coalesce(all_ready, false) THEN
        UPDATE wal_delivery.config_version SET published_version = p_version
         WHERE published_version < p_version;
        IF FOUND THEN
            PERFORM pg_notify('wal_delivery_published', p_version::text);
        END IF;
        RETURN true;
    END IF;
    RETURN false;
END $$;

-- The operator's view of what the reconciler found.
CREATE VIEW wal_delivery.reconcile_status AS
SELECT k.topic, k.role, k.partitions, k.replication_factor, k.min_insync_replicas, k.retention,
       k.ready, k.error, k.error_is_permanent, k.config_version, k.reconciled_at
  FROM wal_delivery.kafka_topics k;
