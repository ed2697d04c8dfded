-- wal_delivery 0.2 -> 0.3: reconciliation with Kafka. The reconciler worker creates and
-- alters the Kafka topics the control plane describes (main topics, the three retry
-- steps with one partition per destination, the DLQ), records what it found in
-- wal_delivery.kafka_topics, and only when Kafka matches publishes the config version
-- that workers follow (NOTIFY wal_delivery_published).
\echo Use "ALTER EXTENSION wal_delivery UPDATE TO '0.3'" to load this file. \quit

-- Replication of the retry and DLQ topics (main topics have their own columns).
ALTER TABLE wal_delivery.settings
    ADD COLUMN internal_topic_replication_factor smallint NOT NULL DEFAULT 3,
    ADD COLUMN internal_topic_min_insync_replicas smallint NOT NULL DEFAULT 2;

CREATE OR REPLACE FUNCTION wal_delivery.check_settings() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.retry_dlq_retention <= interval '0' OR NEW.dead_letter_archive_after <= interval '0'
       OR NEW.consumer_dedupe_ttl < interval '0' THEN
        PERFORM wal_delivery.refuse_setting('retry_dlq_retention and dead_letter_archive_after must be positive and consumer_dedupe_ttl not negative',
            format('%s, %s and %s', NEW.retry_dlq_retention, NEW.dead_letter_archive_after, NEW.consumer_dedupe_ttl), 'The defaults are 14 days, 10 days and 1 day.');
    END IF;
    IF NEW.dead_letter_archive_after >= NEW.retry_dlq_retention THEN
        PERFORM wal_delivery.refuse_setting('dead_letter_archive_after must be shorter than retry_dlq_retention',
            format('%s against %s', NEW.dead_letter_archive_after, NEW.retry_dlq_retention),
            'Dead letters must be archived before Kafka''s retention could drop them.');
    END IF;
    IF NEW.retry_topic_prefix !~ '^[A-Za-z0-9._-]{1,200}$' OR NEW.dlq_topic !~ '^[A-Za-z0-9._-]{1,200}$' THEN
        PERFORM wal_delivery.refuse_setting('retry_topic_prefix and dlq_topic must be valid Kafka topic names',
            NEW.retry_topic_prefix || ' and ' || NEW.dlq_topic, 'Use letters, digits, ".", "_" and "-".');
    END IF;
    IF NEW.internal_topic_replication_factor IS NULL OR NEW.internal_topic_replication_factor < 1
       OR NEW.internal_topic_min_insync_replicas IS NULL
       OR NEW.internal_topic_min_insync_replicas NOT BETWEEN 1 AND NEW.internal_topic_replication_factor THEN
        PERFORM wal_delivery.refuse_setting('internal_topic_replication_factor must be at least 1 and internal_topic_min_insync_replicas between 1 and it',
            format('%s and %s', NEW.internal_topic_replication_factor, NEW.internal_topic_min_insync_replicas),
            'Use 3 and 2 in production, 1 and 1 on a single-broker test cluster.');
    END IF;
    RETURN NEW;
END $$;

-- Each destination owns one partition of every retry topic, for good: numbers are
-- never reused or changed, so a message in a retry step always finds its destination.
CREATE SEQUENCE wal_delivery.retry_partition_seq MINVALUE 0 START 0;
ALTER TABLE wal_delivery.destinations ADD COLUMN retry_partition integer;
UPDATE wal_delivery.destinations d SET retry_partition = n.p
  FROM (SELECT name, nextval('wal_delivery.retry_partition_seq')::integer AS p
          FROM (SELECT name FROM wal_delivery.destinations ORDER BY created_at, name) o) n
 WHERE d.name = n.name;
ALTER TABLE wal_delivery.destinations
    ALTER COLUMN retry_partition SET DEFAULT nextval('wal_delivery.retry_partition_seq'),
    ALTER COLUMN retry_partition SET NOT NULL,
    ADD CONSTRAINT destinations_retry_partition UNIQUE (retry_partition);
ALTER SEQUENCE wal_delivery.retry_partition_seq OWNED BY wal_delivery.destinations.retry_partition;

CREATE FUNCTION wal_delivery.keep_retry_partition() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.retry_partition IS DISTINCT FROM OLD.retry_partition THEN
        RAISE EXCEPTION 'retry_partition of destination "%" cannot change (it is %)', OLD.name, OLD.retry_partition
            USING ERRCODE = 'check_violation',
                  HINT = 'Messages waiting in the retry steps are found by this partition; it is assigned once.';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER keep_retry_partition BEFORE UPDATE ON wal_delivery.destinations
    FOR EACH ROW EXECUTE FUNCTION wal_delivery.keep_retry_partition();

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

CREATE VIEW wal_delivery.reconcile_status AS
SELECT k.topic, k.role, k.partitions, k.replication_factor, k.min_insync_replicas, k.retention,
       k.ready, k.error, k.error_is_permanent, k.config_version, k.reconciled_at
  FROM wal_delivery.kafka_topics k;

REVOKE ALL ON wal_delivery.kafka_topics, wal_delivery.reconcile_status FROM PUBLIC;
REVOKE ALL ON FUNCTION wal_delivery.desired_kafka_topics(), wal_delivery.record_reconciliation(bigint, jsonb),
                       wal_delivery.keep_retry_partition() FROM PUBLIC;
REVOKE ALL ON SEQUENCE wal_delivery.retry_partition_seq FROM PUBLIC;
GRANT SELECT ON wal_delivery.kafka_topics, wal_delivery.reconcile_status TO wal_delivery_admin;
GRANT USAGE ON SEQUENCE wal_delivery.retry_partition_seq TO wal_delivery_admin;
GRANT EXECUTE ON FUNCTION wal_delivery.desired_kafka_topics() TO wal_delivery_admin;
