-- Topics: what applications enqueue to. Each one becomes a Kafka topic (reconcile.sql);
-- a topic with a processor has its records processed before they are shipped
-- (processing.sql).

-- Columns keep the order in which they were added before 1.0 (SELECT * shows them so).
CREATE TABLE wal_delivery.topics (
    name text PRIMARY KEY,
    acks smallint NOT NULL DEFAULT -1,
    partitions integer NOT NULL DEFAULT 3,
    replication_factor smallint NOT NULL DEFAULT 3,
    min_insync_replicas smallint NOT NULL DEFAULT 2,
    retention interval NOT NULL DEFAULT '7 days',
    max_payload_bytes integer NOT NULL DEFAULT 1000000,   -- under Kafka's 1 MB message limit
    idempotency_window interval NOT NULL DEFAULT '1 day', -- how long stored rows stay for dedupe
    processor_kind text,                                  -- NULL: shipped as enqueued
    processor text,                                       -- SQL function or HTTP URL
    processing_lease interval NOT NULL DEFAULT '30 seconds',
    processing_max_attempts integer NOT NULL DEFAULT 5,
    processing_backoff interval NOT NULL DEFAULT '1 second',
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    -- How long the worker waits for an HTTP processor's answer. Kept apart from the
    -- lease: the lease fences writers, this bounds one attempt.
    processing_timeout interval NOT NULL DEFAULT '10 seconds',
    CHECK (acks IN (-1, 1)),
    CHECK (partitions >= 1 AND replication_factor >= 1),
    CHECK (min_insync_replicas BETWEEN 1 AND replication_factor),
    CHECK (processor_kind IN ('sql', 'http')),
    CHECK ((processor_kind IS NULL) = (processor IS NULL))
);

-- Refuses a bad topic with a message naming the setting, the value and what to use.
CREATE FUNCTION wal_delivery.check_topic() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.name IS NULL OR NEW.name !~ '^[A-Za-z0-9._-]{1,200}$' THEN
        RAISE EXCEPTION 'invalid topic name "%"', NEW.name
            USING ERRCODE = 'invalid_name',
                  HINT = 'A topic name is 1 to 200 letters, digits, ".", "_" or "-" (what Kafka accepts).';
    END IF;
    IF NEW.acks IS NULL OR NEW.acks NOT IN (-1, 1) THEN
        PERFORM wal_delivery.refuse_setting(format('acks of topic "%s" must be -1 (all in-sync replicas) or 1 (leader only)', NEW.name),
            NEW.acks::text, 'Use -1 (the default), or 1 for a topic that may lose records on a leader crash. 0 is refused: nothing would wait for Kafka, which breaks "durable after ack".');
    END IF;
    IF NEW.partitions IS NULL OR NEW.partitions < 1 THEN
        PERFORM wal_delivery.refuse_setting(format('partitions of topic "%s" must be at least 1', NEW.name), NEW.partitions::text, 'Use 1 or more partitions.');
    END IF;
    IF NEW.replication_factor IS NULL OR NEW.replication_factor < 1 THEN
        PERFORM wal_delivery.refuse_setting(format('replication_factor of topic "%s" must be at least 1', NEW.name), NEW.replication_factor::text, 'Use 3 in production, 1 only on a single-broker test cluster.');
    END IF;
    IF NEW.min_insync_replicas IS NULL OR NEW.min_insync_replicas NOT BETWEEN 1 AND NEW.replication_factor THEN
        PERFORM wal_delivery.refuse_setting(format('min_insync_replicas of topic "%s" must be between 1 and its replication_factor (%s)', NEW.name, NEW.replication_factor),
            NEW.min_insync_replicas::text, 'With replication_factor 3 use min_insync_replicas 2.');
    END IF;
    IF NEW.retention IS NULL OR NEW.retention <= interval '0' THEN
        PERFORM wal_delivery.refuse_setting(format('retention of topic "%s" must be positive', NEW.name), NEW.retention::text, 'The default is 7 days.');
    END IF;
    IF NEW.max_payload_bytes IS NULL OR NEW.max_payload_bytes NOT BETWEEN 1 AND 100000000 THEN
        PERFORM wal_delivery.refuse_setting(format('max_payload_bytes of topic "%s" must be between 1 and 100000000', NEW.name), NEW.max_payload_bytes::text,
            'The default, 1000000, fits Kafka''s default 1 MB message limit; raise max.message.bytes in Kafka before raising it.');
    END IF;
    IF NEW.idempotency_window IS NULL OR NEW.idempotency_window < interval '0' THEN
        PERFORM wal_delivery.refuse_setting(format('idempotency_window of topic "%s" must not be negative', NEW.name), NEW.idempotency_window::text, 'The default is 1 day.');
    END IF;
    IF (NEW.processor_kind IS NULL) <> (NEW.processor IS NULL) OR NEW.processor_kind NOT IN ('sql', 'http') THEN
        PERFORM wal_delivery.refuse_setting(format('processor_kind of topic "%s" must be ''sql'' or ''http'' with a processor, or both NULL', NEW.name),
            coalesce(NEW.processor_kind, 'NULL') || ' with processor ' || coalesce(NEW.processor, 'NULL'),
            'For a SQL processor set processor to a function name taking and returning bytea; for HTTP, to its URL.');
    END IF;
    IF NEW.processor_kind = 'sql' AND to_regprocedure(NEW.processor || '(bytea)') IS NULL THEN
        PERFORM wal_delivery.refuse_setting(format('processor of topic "%s" must name an existing function taking bytea', NEW.name), NEW.processor,
            'Create the function first, e.g. CREATE FUNCTION my_schema.redact(payload bytea) RETURNS bytea, and use its schema-qualified name.');
    END IF;
    IF NEW.processor_kind = 'http' AND NEW.processor !~* '^https?://[^/[:space:]]+' THEN
        PERFORM wal_delivery.refuse_setting(format('processor of topic "%s" must be an http:// or https:// URL', NEW.name), NEW.processor, 'For example https://transform.internal/redact.');
    END IF;
    IF NEW.processing_lease IS NULL OR NEW.processing_lease <= interval '0'
       OR NEW.processing_backoff IS NULL OR NEW.processing_backoff < interval '0' THEN
        PERFORM wal_delivery.refuse_setting(format('processing_lease of topic "%s" must be positive and processing_backoff not negative', NEW.name),
            coalesce(NEW.processing_lease::text, 'NULL') || ' and ' || coalesce(NEW.processing_backoff::text, 'NULL'), 'The defaults are 30 seconds and 1 second.');
    END IF;
    IF NEW.processing_max_attempts IS NULL OR NEW.processing_max_attempts < 1 THEN
        PERFORM wal_delivery.refuse_setting(format('processing_max_attempts of topic "%s" must be at least 1', NEW.name), NEW.processing_max_attempts::text, 'The default is 5.');
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.name <> OLD.name
       AND EXISTS (SELECT 1 FROM wal_delivery.outbox WHERE topic = OLD.name) THEN
        RAISE EXCEPTION 'topic "%" cannot be renamed while it has records in the outbox', OLD.name
            USING ERRCODE = 'dependent_objects_still_exist',
                  HINT = 'Create a new topic and subscribe its destinations instead.';
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
END $$;

CREATE TRIGGER check_topic BEFORE INSERT OR UPDATE ON wal_delivery.topics
    FOR EACH ROW EXECUTE FUNCTION wal_delivery.check_topic();

-- processing_timeout has a trigger of its own; both run before every write.
CREATE FUNCTION wal_delivery.check_topic_processing_timeout() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.processing_timeout IS NULL OR NEW.processing_timeout NOT BETWEEN interval '1 millisecond' AND interval '1 hour' THEN
        PERFORM wal_delivery.refuse_setting(format('processing_timeout of topic "%s" must be between 1 millisecond and 1 hour', NEW.name),
            NEW.processing_timeout::text, 'The default is 10 seconds; keep it shorter than processing_lease so a slow answer fails the attempt instead of arriving after the lease.');
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER check_topic_processing_timeout BEFORE INSERT OR UPDATE ON wal_delivery.topics
    FOR EACH ROW EXECUTE FUNCTION wal_delivery.check_topic_processing_timeout();
CREATE TRIGGER bump_config_version AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON wal_delivery.topics
    FOR EACH STATEMENT EXECUTE FUNCTION wal_delivery.bump_config_version();

-- pg_dump keeps the rows of the control-plane tables (the extension recreates the tables).
SELECT pg_catalog.pg_extension_config_dump('wal_delivery.topics', '');
