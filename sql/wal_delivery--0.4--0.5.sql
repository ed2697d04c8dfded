-- wal_delivery 0.4 -> 0.5: the DLQ ingester. `wal-worker dlq` copies each message of the
-- DLQ topic into wal_delivery.dead_letters exactly once (its Kafka position is unique) and
-- raises an alert for each new entry.
\echo Use "ALTER EXTENSION wal_delivery UPDATE TO '0.5'" to load this file. \quit

ALTER TABLE wal_delivery.dead_letters
    ADD COLUMN kafka_topic text,
    ADD COLUMN kafka_partition integer,
    ADD COLUMN kafka_offset bigint;
CREATE UNIQUE INDEX dead_letters_kafka_position
    ON wal_delivery.dead_letters (kafka_topic, kafka_partition, kafka_offset)
    WHERE kafka_offset IS NOT NULL;

-- Where the DLQ ingester POSTs an alert for each new dead letter (NULL: metric only).
ALTER TABLE wal_delivery.settings ADD COLUMN dlq_alert_url text
    CHECK (dlq_alert_url ~* '^https?://[^/[:space:]]+');

-- One DLQ message into dead_letters; NULL when that Kafka position was ingested before
-- (a redelivery after a crash), so the caller raises no second alert.
CREATE FUNCTION wal_delivery.ingest_dead_letter(
    p_kafka_topic text, p_kafka_partition integer, p_kafka_offset bigint,
    p_topic text, p_idempotency_key text, p_destination text, p_outbox_id bigint,
    p_content_type text, p_payload bytea, p_attempts integer, p_last_error text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_id bigint;
BEGIN
    INSERT INTO wal_delivery.dead_letters (origin, topic, idempotency_key, destination, outbox_id,
                                           content_type, payload, attempts, last_error,
                                           kafka_topic, kafka_partition, kafka_offset)
    VALUES ('delivery', coalesce(p_topic, p_kafka_topic), coalesce(p_idempotency_key, ''),
            p_destination, p_outbox_id, p_content_type, coalesce(p_payload, ''::bytea),
            coalesce(p_attempts, 0), coalesce(p_last_error, 'no reason given'),
            p_kafka_topic, p_kafka_partition, p_kafka_offset)
    ON CONFLICT (kafka_topic, kafka_partition, kafka_offset) WHERE kafka_offset IS NOT NULL
    DO NOTHING
    RETURNING id INTO v_id;
    RETURN v_id;
END $$;

-- The worker reads the alert URL with its config.
CREATE OR REPLACE FUNCTION wal_delivery.worker_config() RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT jsonb_build_object(
        'version', v.version,
        'published_version', v.published_version,
        'settings', jsonb_build_object(
            'kafka_bootstrap_servers', s.kafka_bootstrap_servers,
            'retry_topic_prefix', s.retry_topic_prefix,
            'dlq_topic', s.dlq_topic,
            'dlq_alert_url', s.dlq_alert_url,
            'consumer_dedupe_ttl_ms', (extract(epoch FROM s.consumer_dedupe_ttl) * 1000)::bigint),
        'destinations', coalesce((
            SELECT jsonb_agg(jsonb_build_object(
                'name', d.name, 'endpoint', d.endpoint, 'method', d.method, 'headers', d.headers,
                'timeout_ms', (extract(epoch FROM d.timeout) * 1000)::bigint,
                'max_in_flight', d.max_in_flight, 'dedicated', d.dedicated,
                'transient_statuses', to_jsonb(d.transient_statuses),
                'retry_delays_ms', (SELECT jsonb_agg((extract(epoch FROM x) * 1000)::bigint)
                                      FROM unnest(d.retry_delays) x),
                'retry_jitter', d.retry_jitter,
                'pause_after_failures', d.pause_after_failures,
                'probe_interval_ms', (extract(epoch FROM d.probe_interval) * 1000)::bigint,
                'verify_tls', d.verify_tls,
                'retry_partition', d.retry_partition,
                'signing_secret', ds.signing_secret,
                'topics', coalesce((SELECT jsonb_agg(sub.topic ORDER BY sub.topic)
                                      FROM wal_delivery.subscriptions sub
                                     WHERE sub.destination = d.name), '[]'))
                ORDER BY d.name)
              FROM wal_delivery.destinations d
              LEFT JOIN wal_delivery.destination_secrets ds ON ds.destination = d.name), '[]'))
      FROM wal_delivery.config_version v, wal_delivery.settings s
$$;

REVOKE ALL ON FUNCTION wal_delivery.ingest_dead_letter(text, integer, bigint, text, text, text, bigint,
                                                       text, bytea, integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION wal_delivery.ingest_dead_letter(text, integer, bigint, text, text, text, bigint,
                                                          text, bytea, integer, text) TO wal_delivery_admin;
