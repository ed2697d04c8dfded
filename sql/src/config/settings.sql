-- Settings of the whole deployment: one row, created with the extension. The archive_*
-- settings and their checks belong to dead-letter archival (archive.sql), processing_role
-- and its check to processing (processing.sql).

-- Columns keep the order in which they were added before 1.0 (SELECT * shows them so).
CREATE TABLE wal_delivery.settings (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    kafka_bootstrap_servers text,                 -- NULL: workers take -X bootstrap.servers
    retry_topic_prefix text NOT NULL DEFAULT 'wal_delivery.retry.',
    dlq_topic text NOT NULL DEFAULT 'wal_delivery.dlq',
    retry_dlq_retention interval NOT NULL DEFAULT '14 days',
    dead_letter_archive_after interval NOT NULL DEFAULT '10 days',
    consumer_dedupe_ttl interval NOT NULL DEFAULT '1 day',
    -- Replication of the retry and DLQ topics (main topics have their own columns).
    internal_topic_replication_factor smallint NOT NULL DEFAULT 3,
    internal_topic_min_insync_replicas smallint NOT NULL DEFAULT 2,
    -- Where the DLQ ingester POSTs an alert for each new dead letter (NULL: metric only).
    dlq_alert_url text CHECK (dlq_alert_url ~* '^https?://[^/[:space:]]+'),
    -- Dead-letter archival to S3 (archive.sql).
    archive_s3_endpoint text,          -- https://s3.eu-west-1.amazonaws.com; NULL: archival off
    archive_s3_region text NOT NULL DEFAULT 'us-east-1',
    archive_s3_bucket text,
    archive_s3_prefix text NOT NULL DEFAULT 'wal_delivery/dead_letters',
    archive_s3_path_style boolean NOT NULL DEFAULT false,  -- endpoint/bucket/key, not bucket.endpoint/key
    archive_s3_allow_http boolean NOT NULL DEFAULT false,  -- plain http:// endpoints (a local test server)
    archive_s3_timeout interval NOT NULL DEFAULT '2 minutes',  -- one upload or download
    archive_batch_rows integer NOT NULL DEFAULT 10000,
    archive_batch_bytes integer NOT NULL DEFAULT 67108864,     -- uncompressed NDJSON
    archive_max_run_time interval NOT NULL DEFAULT '30 minutes',
    archive_keeps_rows boolean NOT NULL DEFAULT false,         -- true: mark archived, do not delete
    -- The role SQL processors run as (processing.sql checks it); never the worker's own.
    processing_role text NOT NULL DEFAULT 'wal_delivery_processor',
    -- How long delivery_stats keeps its minutes (delivery_stats.sql).
    delivery_stats_retention interval NOT NULL DEFAULT '7 days'
);
-- Before the triggers below, so creating the extension bumps no version.
INSERT INTO wal_delivery.settings DEFAULT VALUES;

-- Refuses retry and DLQ topic names Kafka would refuse, that collide with each other, or
-- that would be the same Kafka topic as a topic of wal_delivery.topics ("." and "_" count
-- as the same in Kafka).
CREATE FUNCTION wal_delivery.check_internal_topic_names(p_retry_topic_prefix text, p_dlq_topic text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    IF p_retry_topic_prefix IS NULL OR length(p_retry_topic_prefix) NOT BETWEEN 1 AND 243 THEN
        PERFORM wal_delivery.refuse_setting('retry_topic_prefix must be 1 to 243 characters (a step number or "pauses" follows it)',
            p_retry_topic_prefix, 'The default is wal_delivery.retry.');
    END IF;
    FOR r IN SELECT i.topic, i.what, wal_delivery.topic_name_problem(i.topic) AS problem
               FROM wal_delivery.internal_topic_names(p_retry_topic_prefix, p_dlq_topic) i LOOP
        IF r.problem IS NOT NULL THEN
            PERFORM wal_delivery.refuse_setting(format('the %s "%s" is not a valid Kafka topic name: %s', r.what, r.topic, r.problem),
                CASE WHEN r.what = 'DLQ topic' THEN p_dlq_topic ELSE p_retry_topic_prefix END,
                'retry_topic_prefix (followed by 1, 2, 3 and pauses) and dlq_topic use letters, digits, ".", "_" and "-", and must not start with "__".');
        END IF;
    END LOOP;
    IF EXISTS (SELECT 1 FROM wal_delivery.internal_topic_names(p_retry_topic_prefix, p_dlq_topic) i
                WHERE i.what <> 'DLQ topic'
                  AND wal_delivery.kafka_collision_key(i.topic) = wal_delivery.kafka_collision_key(p_dlq_topic)) THEN
        PERFORM wal_delivery.refuse_setting('dlq_topic must not be one of the retry step topics or the pause topic', p_dlq_topic,
            format('The retry steps are %s1, %s2 and %s3, the pause topic %spauses ("." and "_" count as the same in Kafka).', p_retry_topic_prefix, p_retry_topic_prefix, p_retry_topic_prefix, p_retry_topic_prefix));
    END IF;
    PERFORM wal_delivery.lock_topic_names();
    SELECT t.name, i.what INTO r
      FROM wal_delivery.topics t, wal_delivery.internal_topic_names(p_retry_topic_prefix, p_dlq_topic) i
     WHERE wal_delivery.kafka_collision_key(t.name) = wal_delivery.kafka_collision_key(i.topic)
     LIMIT 1;
    IF FOUND THEN
        PERFORM wal_delivery.refuse_setting(format('the %s would be the same Kafka topic as topic "%s"', r.what, r.name),
            CASE WHEN r.what = 'DLQ topic' THEN p_dlq_topic ELSE p_retry_topic_prefix END,
            'Choose a retry_topic_prefix and dlq_topic that no topic of wal_delivery.topics uses.');
    END IF;
END $$;

-- The longest a retry step may hold a message before it is due: the longest delay plus
-- its largest jitter. NULL when the delays are not yet valid.
CREATE FUNCTION wal_delivery.longest_retry_wait(p_delays interval[], p_jitter real) RETURNS interval
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT max(d) * (1 + coalesce(p_jitter, 0)::numeric::float8) FROM unnest(p_delays) d  -- 0.2, not 0.2000000029
$$;

-- Refuses bad settings (archive.sql checks the archive_* ones).
-- SECURITY DEFINER: the admin role writes the row, the checks read topics and destinations.
CREATE FUNCTION wal_delivery.check_settings() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    late record;
BEGIN
    IF NEW.retry_dlq_retention <= interval '0' OR NEW.retry_dlq_retention > interval '100 years'
       OR NEW.dead_letter_archive_after <= interval '0' OR NEW.consumer_dedupe_ttl < interval '0' THEN
        PERFORM wal_delivery.refuse_setting('retry_dlq_retention must be positive and at most 100 years, dead_letter_archive_after positive and consumer_dedupe_ttl not negative',
            format('%s, %s and %s', NEW.retry_dlq_retention, NEW.dead_letter_archive_after, NEW.consumer_dedupe_ttl), 'The defaults are 14 days, 10 days and 1 day.');
    END IF;
    IF NEW.delivery_stats_retention < interval '1 day' OR NEW.delivery_stats_retention > interval '1 year' THEN
        PERFORM wal_delivery.refuse_setting('delivery_stats_retention must be 1 day to 1 year',
            NEW.delivery_stats_retention::text, 'The default is 7 days; the console charts the last 6 hours.');
    END IF;
    IF NEW.dead_letter_archive_after >= NEW.retry_dlq_retention THEN
        PERFORM wal_delivery.refuse_setting('dead_letter_archive_after must be shorter than retry_dlq_retention',
            format('%s against %s', NEW.dead_letter_archive_after, NEW.retry_dlq_retention),
            'Dead letters must be archived before Kafka''s retention could drop them.');
    END IF;
    IF TG_OP = 'INSERT' OR NEW.retry_topic_prefix IS DISTINCT FROM OLD.retry_topic_prefix
       OR NEW.dlq_topic IS DISTINCT FROM OLD.dlq_topic THEN
        PERFORM wal_delivery.check_internal_topic_names(NEW.retry_topic_prefix, NEW.dlq_topic);
    END IF;
    IF TG_OP = 'INSERT' OR NEW.retry_dlq_retention IS DISTINCT FROM OLD.retry_dlq_retention THEN
        SELECT d.name, d.retry_delays, d.retry_jitter INTO late FROM wal_delivery.destinations d
         WHERE wal_delivery.longest_retry_wait(d.retry_delays, d.retry_jitter) >= NEW.retry_dlq_retention
         ORDER BY d.name LIMIT 1;
        IF FOUND THEN
            PERFORM wal_delivery.refuse_setting(format('retry_dlq_retention must be longer than every destination''s longest retry delay with jitter; destination "%s" waits up to %s',
                    late.name, wal_delivery.longest_retry_wait(late.retry_delays, late.retry_jitter)),
                NEW.retry_dlq_retention::text, 'Kafka would delete a retry message before it is due. Shorten that destination''s retry_delays first, or keep the retention (14 days by default).');
        END IF;
    END IF;
    IF NEW.dlq_alert_url IS NOT NULL AND wal_delivery.http_url_problem(NEW.dlq_alert_url) IS NOT NULL THEN
        PERFORM wal_delivery.refuse_setting(format('dlq_alert_url must be an http:// or https:// URL: %s', wal_delivery.http_url_problem(NEW.dlq_alert_url)),
            wal_delivery.url_for_message(NEW.dlq_alert_url), 'For example https://alerts.internal/wal-dead-letters, or NULL for the metric only.');
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

CREATE TRIGGER check_settings BEFORE INSERT OR UPDATE ON wal_delivery.settings
    FOR EACH ROW EXECUTE FUNCTION wal_delivery.check_settings();
CREATE TRIGGER bump_config_version AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON wal_delivery.settings
    FOR EACH STATEMENT EXECUTE FUNCTION wal_delivery.bump_config_version();
