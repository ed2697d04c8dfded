-- What the delivery workers read from the control plane.

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
