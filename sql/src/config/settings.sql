-- Settings of the whole deployment: one row, created with the extension. The archive_*
-- settings and their checks belong to dead-letter archival (archive.sql).

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
    archive_keeps_rows boolean NOT NULL DEFAULT false          -- true: mark archived, do not delete
);
-- Before the triggers below, so creating the extension bumps no version.
INSERT INTO wal_delivery.settings DEFAULT VALUES;

-- Refuses bad settings (archive.sql checks the archive_* ones).
CREATE FUNCTION wal_delivery.check_settings() RETURNS trigger
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

CREATE TRIGGER check_settings BEFORE INSERT OR UPDATE ON wal_delivery.settings
    FOR EACH ROW EXECUTE FUNCTION wal_delivery.check_settings();
CREATE TRIGGER bump_config_version AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON wal_delivery.settings
    FOR EACH STATEMENT EXECUTE FUNCTION wal_delivery.bump_config_version();
