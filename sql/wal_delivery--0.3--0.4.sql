-- wal_delivery 0.3 -> 0.4: what the delivery workers read from the control plane.
\echo Use "ALTER EXTENSION wal_delivery UPDATE TO '0.4'" to load this file. \quit

-- The whole configuration a worker needs, as one JSON document: the same document the
-- workers cache, serve to their peers on /config and read back from a peer when the
-- database is down. It carries signing secrets, so only the admin role may call it.
CREATE FUNCTION wal_delivery.worker_config() RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT jsonb_build_object(
        'version', v.version,
        'published_version', v.published_version,
        'settings', jsonb_build_object(
            'kafka_bootstrap_servers', s.kafka_bootstrap_servers,
            'retry_topic_prefix', s.retry_topic_prefix,
            'dlq_topic', s.dlq_topic,
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

REVOKE ALL ON FUNCTION wal_delivery.worker_config() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION wal_delivery.worker_config() TO wal_delivery_admin;

-- Measured by bench/retention: under steady writes autovacuum kept trying to truncate the
-- outbox's tail, could not get the lock, and gave up after 5 s each time (119 s of 150 s
-- of vacuum time in one run); without truncation the table was 0.74x the size at the same
-- throughput. The cost: space after a peak is only returned by a manual VACUUM (TRUNCATE).
ALTER TABLE wal_delivery.outbox SET (vacuum_truncate = off);
