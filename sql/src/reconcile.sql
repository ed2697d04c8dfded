-- Reconciliation with Kafka. The reconciler background worker (src/ext/reconcile.c)
-- creates and alters the Kafka topics the control plane describes (main topics, the three
-- retry steps with one partition per destination, the DLQ), records what it found in
-- wal_delivery.kafka_topics, and only when Kafka matches publishes the config version
-- that workers follow (NOTIFY wal_delivery_published).

-- What the reconciler found and did, one row per Kafka topic it manages.
CREATE TABLE wal_delivery.kafka_topics (
    topic text PRIMARY KEY,
    role text NOT NULL CHECK (role IN ('main', 'retry', 'pauses', 'dlq')),
    partitions integer NOT NULL,
    replication_factor smallint NOT NULL,
    min_insync_replicas smallint NOT NULL,
    retention interval NOT NULL,
    ready boolean NOT NULL DEFAULT false,        -- exists in Kafka with these settings
    error text,                                  -- why not, or what does not match
    error_is_permanent boolean NOT NULL DEFAULT false,  -- retrying cannot help
    config_version bigint,
    reconciled_at timestamptz,
    -- Exists in Kafka (whatever its settings): the relay ships a main topic's records
    -- once it does. Kept from the last round that could tell when Kafka did not answer.
    in_kafka boolean NOT NULL DEFAULT false,
    kafka_partitions integer,                    -- as Kafka has it
    max_message_bytes integer,                   -- asked for (max.message.bytes)
    -- wal_delivery created it in Kafka; otherwise its settings are someone else's unless
    -- the topic's row adopts it (topics.adopt)
    created boolean NOT NULL DEFAULT false
);

-- What Kafka must accept beyond a topic's max_payload_bytes: the relay's headers, a retry
-- or DLQ hand-off's headers and Kafka's record framing. Enqueue keeps 16 KiB of a topic's
-- max_payload_bytes for the hand-off's headers; this is more room on top.
CREATE FUNCTION wal_delivery.kafka_message_headroom() RETURNS integer
LANGUAGE sql IMMUTABLE AS 'SELECT 65536';

-- The Kafka topics the control plane asks for: every main topic, the three retry steps
-- (one partition per destination ever created), the pause topic (one partition) and the DLQ. max_message_bytes is each
-- topic's max.message.bytes: its max_payload_bytes plus headroom; the retry steps and the
-- DLQ take a copy of any topic's record, so theirs follows the largest topic.
CREATE FUNCTION wal_delivery.desired_kafka_topics()
RETURNS TABLE (topic text, role text, partitions integer, replication_factor smallint,
               min_insync_replicas smallint, retention_ms bigint, max_message_bytes integer,
               managed boolean)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    -- managed: the reconciler may add partitions and set its settings. A main topic is
    -- when wal_delivery created it or its row adopts it (topics.adopt); the retry steps,
    -- the pause topic and the DLQ are wal_delivery's by their names. A topic missing from
    -- Kafka is created either way.
    SELECT t.name, 'main', t.partitions, t.replication_factor, t.min_insync_replicas,
           (extract(epoch FROM t.retention) * 1000)::bigint,
           t.max_payload_bytes + wal_delivery.kafka_message_headroom(),
           t.adopt OR coalesce((SELECT k.created FROM wal_delivery.kafka_topics k WHERE k.topic = t.name), false)
      FROM wal_delivery.topics t
    UNION ALL
    SELECT i.topic, CASE i.what WHEN 'DLQ topic' THEN 'dlq' WHEN 'pause topic' THEN 'pauses' ELSE 'retry' END,
           CASE WHEN i.what IN ('DLQ topic', 'pause topic') THEN 1
                ELSE greatest(1, (SELECT coalesce(max(retry_partition), -1) + 1 FROM wal_delivery.destinations)) END,
           s.internal_topic_replication_factor, s.internal_topic_min_insync_replicas,
           (extract(epoch FROM s.retry_dlq_retention) * 1000)::bigint,
           (SELECT coalesce(max(max_payload_bytes), 1000000) FROM wal_delivery.topics)
               + wal_delivery.kafka_message_headroom(),
           true
      FROM wal_delivery.settings s, wal_delivery.internal_topic_names(s.retry_topic_prefix, s.dlq_topic) i
$$;

-- The reconciler calls this, and commits, before it asks Kafka to create the topics it
-- found missing: they are wal_delivery's from then on (created), so a crash between
-- Kafka creating one and the round's record_reconciliation does not leave it looking like
-- another application's topic, which the reconciler would leave alone and never ship to.
CREATE FUNCTION wal_delivery.note_topics_to_create(p_topics text[]) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO wal_delivery.kafka_topics AS k (topic, role, partitions, replication_factor,
        min_insync_replicas, retention, created)
    SELECT DISTINCT ON (d.topic) d.topic, d.role, d.partitions, d.replication_factor,
           d.min_insync_replicas, make_interval(secs => d.retention_ms / 1000.0), true
      FROM wal_delivery.desired_kafka_topics() d
     WHERE d.topic = ANY (p_topics)
     ORDER BY d.topic, d.role = 'main'
    ON CONFLICT (topic) DO UPDATE SET created = true
$$;

-- Rows of a topic that is not in Kafka yet wait with available_at = infinity (see
-- relay.sql); this lets them go once their topic exists, or once it is no longer
-- configured (the relay then buries them). Returns how many it let go.
CREATE FUNCTION wal_delivery.release_rows_waiting_for_topics() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
BEGIN
    UPDATE wal_delivery.outbox_rows o SET available_at = now()
     WHERE ((o.state = 'pending' AND NOT o.needs_processing) OR o.state = 'processed')
       AND o.available_at = 'infinity'
       AND (EXISTS (SELECT 1 FROM wal_delivery.kafka_topics k
                     WHERE k.topic = o.topic AND k.role = 'main' AND k.in_kafka)
            OR NOT EXISTS (SELECT 1 FROM wal_delivery.topics t WHERE t.name = o.topic));
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        PERFORM wal_delivery.wake_relay_at_commit();
    END IF;
    RETURN n;
END $$;

-- The reconciler's report for one round: a JSON array of {topic, role, partitions,
-- replication_factor, min_insync_replicas, retention_ms, max_message_bytes, exists,
-- kafka_partitions, ready, error, permanent}; exists and kafka_partitions are null when
-- Kafka did not say (the last known values stay). Publishes p_version when the retry
-- steps, the pause topic and the DLQ exist with their partitions, which is what the
-- workers need; a main topic Kafka does not have holds only its own records (they wait
-- in the outbox). Returns whether it published.
CREATE FUNCTION wal_delivery.record_reconciliation(p_version bigint, p_results jsonb) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    internal_ready boolean;
BEGIN
    INSERT INTO wal_delivery.kafka_topics AS k (topic, role, partitions, replication_factor,
        min_insync_replicas, retention, ready, error, error_is_permanent, config_version, reconciled_at,
        in_kafka, kafka_partitions, max_message_bytes, created)
    SELECT DISTINCT ON (r.topic) r.topic, r.role, r.partitions, r.replication_factor, r.min_insync_replicas,
           make_interval(secs => r.retention_ms / 1000.0), coalesce(r.ready, false), r.error,
           coalesce(r.permanent, false), p_version, now(),
           coalesce(r."exists", known.in_kafka, false),
           CASE WHEN r."exists" IS NULL THEN known.kafka_partitions ELSE r.kafka_partitions END,
           r.max_message_bytes, coalesce(known.created, false) OR coalesce(r.created, false)
      FROM jsonb_to_recordset(p_results) AS r(topic text, role text, partitions integer,
           replication_factor smallint, min_insync_replicas smallint, retention_ms bigint,
           max_message_bytes integer, "exists" boolean, kafka_partitions integer,
           ready boolean, error text, permanent boolean, created boolean)
      LEFT JOIN wal_delivery.kafka_topics known ON known.topic = r.topic
     ORDER BY r.topic, r.role = 'main'   -- a retry step or the DLQ first, should one collide
    ON CONFLICT (topic) DO UPDATE SET
        role = excluded.role, partitions = excluded.partitions,
        replication_factor = excluded.replication_factor,
        min_insync_replicas = excluded.min_insync_replicas, retention = excluded.retention,
        ready = excluded.ready, error = excluded.error,
        error_is_permanent = excluded.error_is_permanent,
        config_version = excluded.config_version, reconciled_at = excluded.reconciled_at,
        in_kafka = excluded.in_kafka, kafka_partitions = excluded.kafka_partitions,
        max_message_bytes = excluded.max_message_bytes, created = excluded.created;
    -- Topics no longer configured are forgotten here; Kafka keeps them (and their data).
    DELETE FROM wal_delivery.kafka_topics
     WHERE topic NOT IN (SELECT r->>'topic' FROM jsonb_array_elements(p_results) r);
    PERFORM wal_delivery.release_rows_waiting_for_topics();

    SELECT bool_and(in_kafka AND kafka_partitions >= partitions) INTO internal_ready
      FROM wal_delivery.kafka_topics WHERE role IN ('retry', 'pauses', 'dlq');
    IF coalesce(internal_ready, false) THEN
        UPDATE wal_delivery.config_version SET published_version = p_version
         WHERE published_version < p_version;
        IF FOUND THEN
            PERFORM pg_notify('wal_delivery_published', p_version::text);
        END IF;
        RETURN true;
    END IF;
    RETURN false;
END $$;

-- The operator's view of what the reconciler found. A main topic that is not in_kafka
-- holds its records in the outbox (records_waiting) until it is; error says why.
CREATE VIEW wal_delivery.reconcile_status AS
SELECT k.topic, k.role, k.partitions, k.replication_factor, k.min_insync_replicas, k.retention,
       k.ready, k.error, k.error_is_permanent, k.config_version, k.reconciled_at,
       k.in_kafka, k.kafka_partitions, k.max_message_bytes,
       CASE WHEN k.role = 'main' THEN
           (SELECT count(*) FROM wal_delivery.outbox_rows o
             WHERE ((o.state = 'pending' AND NOT o.needs_processing) OR o.state = 'processed')
               AND o.available_at = 'infinity' AND o.topic = k.topic)
       END AS records_waiting
  FROM wal_delivery.kafka_topics k;
