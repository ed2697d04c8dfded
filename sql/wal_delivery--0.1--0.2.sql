-- wal_delivery 0.1 -> 0.2: the core. Control-plane tables, the outbox and its state
-- machine, enqueue, claim routines, retention, operator views and roles.
--
-- Words used below:
--   record         one payload an application enqueued for one topic
--   finished row   an outbox row in state stored (in Kafka) or dead (in dead_letters)
--   lease token    the fencing token a processor gets with a claim; a write with an older
--                  token, or after the lease ran out, is refused
\echo Use "ALTER EXTENSION wal_delivery UPDATE TO '0.2'" to load this file. \quit

------------------------------------------------------------------------------ types

CREATE TYPE wal_delivery.outbox_state AS ENUM ('pending', 'processing', 'processed', 'stored', 'dead');

CREATE SEQUENCE wal_delivery.lease_token_seq;

------------------------------------------------------------------------------ helpers

-- Raises a check_violation naming the setting, what it got and what to do.
CREATE FUNCTION wal_delivery.refuse_setting(what text, got text, hint text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION '%, got %', what, coalesce(got, 'NULL')
        USING ERRCODE = 'check_violation', HINT = hint;
END $$;

-- True when v is NULL or a JSON object whose values are all strings (Kafka/HTTP headers).
CREATE FUNCTION wal_delivery.is_string_map(v jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT v IS NULL
        OR (jsonb_typeof(v) = 'object'
            AND NOT EXISTS (SELECT 1 FROM jsonb_each(v) e WHERE jsonb_typeof(e.value) <> 'string'))
$$;

CREATE FUNCTION wal_delivery.wake_relay_at_commit() RETURNS void
LANGUAGE c AS 'MODULE_PATHNAME', 'wal_delivery_wake_relay_at_commit';

CREATE FUNCTION wal_delivery.relay_wakeups() RETURNS bigint
LANGUAGE c AS 'MODULE_PATHNAME', 'wal_delivery_relay_wakeups';

CREATE FUNCTION wal_delivery.invoking_role() RETURNS oid
LANGUAGE c STABLE AS 'MODULE_PATHNAME', 'wal_delivery_invoking_role';

------------------------------------------------------------------------------ control plane

-- Bumped by every committed change to the control-plane tables; NOTIFY carries it.
-- published_version is the version the reconciler has matched in Kafka (the relay sets it).
CREATE TABLE wal_delivery.config_version (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    version bigint NOT NULL DEFAULT 1,
    published_version bigint NOT NULL DEFAULT 0,
    changed_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO wal_delivery.config_version DEFAULT VALUES;

-- Settings of the whole deployment (one row).
CREATE TABLE wal_delivery.settings (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    kafka_bootstrap_servers text,                 -- NULL: workers take -X bootstrap.servers
    retry_topic_prefix text NOT NULL DEFAULT 'wal_delivery.retry.',
    dlq_topic text NOT NULL DEFAULT 'wal_delivery.dlq',
    retry_dlq_retention interval NOT NULL DEFAULT '14 days',
    dead_letter_archive_after interval NOT NULL DEFAULT '10 days',
    consumer_dedupe_ttl interval NOT NULL DEFAULT '1 day'
);
INSERT INTO wal_delivery.settings DEFAULT VALUES;

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
    CHECK (acks IN (-1, 1)),
    CHECK (partitions >= 1 AND replication_factor >= 1),
    CHECK (min_insync_replicas BETWEEN 1 AND replication_factor),
    CHECK (processor_kind IN ('sql', 'http')),
    CHECK ((processor_kind IS NULL) = (processor IS NULL))
);

CREATE TABLE wal_delivery.destinations (
    name text PRIMARY KEY,
    transport text NOT NULL DEFAULT 'http',
    endpoint text NOT NULL,
    method text NOT NULL DEFAULT 'POST',
    headers jsonb NOT NULL DEFAULT '{}',
    timeout interval NOT NULL DEFAULT '10 seconds',
    max_in_flight integer NOT NULL DEFAULT 16,
    dedicated boolean NOT NULL DEFAULT false,             -- its own consumer group
    transient_statuses text[] NOT NULL DEFAULT '{408,425,429,5xx}',
    retry_delays interval[] NOT NULL DEFAULT '{10 seconds,1 minute,5 minutes}',
    retry_jitter real NOT NULL DEFAULT 0.2,               -- fraction of each delay
    pause_after_failures integer NOT NULL DEFAULT 20,
    probe_interval interval NOT NULL DEFAULT '2 minutes',
    verify_tls boolean NOT NULL DEFAULT true,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CHECK (transport = 'http'),
    CHECK (endpoint ~* '^https?://[^/[:space:]]+')
);

-- Kept apart from destinations so the signing secret is readable by the admin role only.
CREATE TABLE wal_delivery.destination_secrets (
    destination text PRIMARY KEY REFERENCES wal_delivery.destinations ON DELETE CASCADE ON UPDATE CASCADE,
    signing_secret text NOT NULL CHECK (length(signing_secret) >= 16)
);

CREATE FUNCTION wal_delivery.check_destination_secret() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.signing_secret IS NULL OR length(NEW.signing_secret) < 16 THEN
        PERFORM wal_delivery.refuse_setting(format('signing_secret of destination "%s" must be at least 16 characters', NEW.destination),
            coalesce(length(NEW.signing_secret)::text || ' characters', 'NULL'),
            'Use a random secret of 24 bytes or more, e.g. ''whsec_'' || encode(gen_random_bytes(24), ''base64'') from pgcrypto.');
    END IF;
    RETURN NEW;
END $$;

CREATE TABLE wal_delivery.subscriptions (
    topic text NOT NULL REFERENCES wal_delivery.topics ON DELETE CASCADE ON UPDATE CASCADE,
    destination text NOT NULL REFERENCES wal_delivery.destinations ON DELETE CASCADE ON UPDATE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, destination)
);
CREATE INDEX subscriptions_destination ON wal_delivery.subscriptions (destination);

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

CREATE FUNCTION wal_delivery.check_destination() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    bad text;
BEGIN
    IF NEW.name IS NULL OR NEW.name !~ '^[A-Za-z0-9._-]{1,100}$' THEN
        RAISE EXCEPTION 'invalid destination name "%"', NEW.name
            USING ERRCODE = 'invalid_name', HINT = 'A destination name is 1 to 100 letters, digits, ".", "_" or "-".';
    END IF;
    IF NEW.transport IS DISTINCT FROM 'http' THEN
        PERFORM wal_delivery.refuse_setting(format('transport of destination "%s" must be ''http''', NEW.name), NEW.transport, 'HTTP is the only transport so far.');
    END IF;
    IF NEW.endpoint IS NULL OR NEW.endpoint !~* '^https?://[^/[:space:]]+' THEN
        PERFORM wal_delivery.refuse_setting(format('endpoint of destination "%s" must be an http:// or https:// URL', NEW.name), NEW.endpoint,
            'For example https://billing.internal/hooks/orders.');
    END IF;
    IF NEW.method IS NULL OR NEW.method NOT IN ('POST', 'PUT', 'PATCH') THEN
        PERFORM wal_delivery.refuse_setting(format('method of destination "%s" must be POST, PUT or PATCH', NEW.name), NEW.method, 'The default is POST.');
    END IF;
    IF NEW.headers IS NULL OR NOT wal_delivery.is_string_map(NEW.headers) THEN
        PERFORM wal_delivery.refuse_setting(format('headers of destination "%s" must be a JSON object of strings', NEW.name), NEW.headers::text,
            'For example {"Authorization": "Bearer ..."}; put numbers in quotes.');
    END IF;
    IF NEW.timeout IS NULL OR NEW.timeout NOT BETWEEN interval '1 millisecond' AND interval '5 minutes' THEN
        PERFORM wal_delivery.refuse_setting(format('timeout of destination "%s" must be between 1 millisecond and 5 minutes', NEW.name), NEW.timeout::text, 'The default is 10 seconds.');
    END IF;
    IF NEW.max_in_flight IS NULL OR NEW.max_in_flight NOT BETWEEN 1 AND 10000 THEN
        PERFORM wal_delivery.refuse_setting(format('max_in_flight of destination "%s" must be between 1 and 10000', NEW.name), NEW.max_in_flight::text, 'The default is 16.');
    END IF;
    SELECT string_agg(s, ', ') INTO bad FROM unnest(NEW.transient_statuses) s WHERE s IS NULL OR s !~ '^[1-5]([0-9][0-9]|xx)$';
    IF NEW.transient_statuses IS NULL OR bad IS NOT NULL THEN
        PERFORM wal_delivery.refuse_setting(format('transient_statuses of destination "%s" must be HTTP statuses such as 429 or classes such as 5xx', NEW.name),
            coalesce(bad, 'NULL'), 'The default is {408,425,429,5xx}; every other non-2xx status is permanent.');
    END IF;
    IF NEW.retry_delays IS NULL OR cardinality(NEW.retry_delays) <> 3 OR array_position(NEW.retry_delays, NULL) IS NOT NULL
       OR EXISTS (SELECT 1 FROM unnest(NEW.retry_delays) d WHERE d <= interval '0') THEN
        PERFORM wal_delivery.refuse_setting(format('retry_delays of destination "%s" must be three positive intervals, one per retry step', NEW.name),
            NEW.retry_delays::text, 'The default is {10 seconds,1 minute,5 minutes}.');
    END IF;
    IF NEW.retry_jitter IS NULL OR NEW.retry_jitter NOT BETWEEN 0 AND 1 THEN
        PERFORM wal_delivery.refuse_setting(format('retry_jitter of destination "%s" must be a fraction between 0 and 1', NEW.name), NEW.retry_jitter::text, 'The default is 0.2 (up to 20%% of each delay).');
    END IF;
    IF NEW.pause_after_failures IS NULL OR NEW.pause_after_failures < 1 THEN
        PERFORM wal_delivery.refuse_setting(format('pause_after_failures of destination "%s" must be at least 1', NEW.name), NEW.pause_after_failures::text, 'The default is 20.');
    END IF;
    IF NEW.probe_interval IS NULL OR NEW.probe_interval <= interval '0' THEN
        PERFORM wal_delivery.refuse_setting(format('probe_interval of destination "%s" must be positive', NEW.name), NEW.probe_interval::text, 'The default is 2 minutes.');
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
END $$;

CREATE TRIGGER check_destination BEFORE INSERT OR UPDATE ON wal_delivery.destinations
    FOR EACH ROW EXECUTE FUNCTION wal_delivery.check_destination();
CREATE TRIGGER check_destination_secret BEFORE INSERT OR UPDATE ON wal_delivery.destination_secrets
    FOR EACH ROW EXECUTE FUNCTION wal_delivery.check_destination_secret();

-- Names the missing side of a subscription instead of a bare foreign-key error.
CREATE FUNCTION wal_delivery.check_subscription() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM wal_delivery.topics WHERE name = NEW.topic) THEN
        RAISE EXCEPTION 'cannot subscribe destination "%" to topic "%": the topic does not exist', NEW.destination, NEW.topic
            USING ERRCODE = 'foreign_key_violation',
                  HINT = format('Create it first: INSERT INTO wal_delivery.topics (name) VALUES (%L).', NEW.topic);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM wal_delivery.destinations WHERE name = NEW.destination) THEN
        RAISE EXCEPTION 'cannot subscribe destination "%" to topic "%": the destination does not exist', NEW.destination, NEW.topic
            USING ERRCODE = 'foreign_key_violation',
                  HINT = format('Create it first: INSERT INTO wal_delivery.destinations (name, endpoint) VALUES (%L, ''https://...'').', NEW.destination);
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER check_subscription BEFORE INSERT OR UPDATE ON wal_delivery.subscriptions
    FOR EACH ROW EXECUTE FUNCTION wal_delivery.check_subscription();

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
    RETURN NEW;
END $$;

CREATE TRIGGER check_settings BEFORE INSERT OR UPDATE ON wal_delivery.settings
    FOR EACH ROW EXECUTE FUNCTION wal_delivery.check_settings();

-- Every committed change to the control plane gets a new version; NOTIFY is delivered
-- at commit only, so a rolled-back change tells nobody.
CREATE FUNCTION wal_delivery.bump_config_version() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v bigint;
BEGIN
    UPDATE wal_delivery.config_version SET version = version + 1, changed_at = now()
        RETURNING version INTO v;
    PERFORM pg_notify('wal_delivery_config', v::text);
    RETURN NULL;
END $$;

CREATE TRIGGER bump_config_version AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON wal_delivery.topics
    FOR EACH STATEMENT EXECUTE FUNCTION wal_delivery.bump_config_version();
CREATE TRIGGER bump_config_version AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON wal_delivery.destinations
    FOR EACH STATEMENT EXECUTE FUNCTION wal_delivery.bump_config_version();
CREATE TRIGGER bump_config_version AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON wal_delivery.destination_secrets
    FOR EACH STATEMENT EXECUTE FUNCTION wal_delivery.bump_config_version();
CREATE TRIGGER bump_config_version AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON wal_delivery.subscriptions
    FOR EACH STATEMENT EXECUTE FUNCTION wal_delivery.bump_config_version();
CREATE TRIGGER bump_config_version AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON wal_delivery.settings
    FOR EACH STATEMENT EXECUTE FUNCTION wal_delivery.bump_config_version();

------------------------------------------------------------------------------ outbox

CREATE TABLE wal_delivery.outbox (
    id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    topic text NOT NULL,
    idempotency_key text NOT NULL,
    state wal_delivery.outbox_state NOT NULL DEFAULT 'pending',
    needs_processing boolean NOT NULL DEFAULT false,
    message_key text,                      -- the Kafka message key
    headers jsonb,                         -- extra Kafka headers, strings only
    content_type text NOT NULL,
    payload bytea NOT NULL,
    processed_payload bytea,
    attempts smallint NOT NULL DEFAULT 0,  -- processing claims so far
    lease_token bigint,
    lease_until timestamptz,
    available_at timestamptz NOT NULL DEFAULT now(),  -- not claimed before (backoff)
    last_error text,
    enqueued_by oid NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,               -- when it became stored or dead
    CONSTRAINT outbox_topic_idempotency_key UNIQUE (topic, idempotency_key)
) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_insert_scale_factor = 0.05);

-- One partial index per claim routine, so each scans only rows it can take.
CREATE INDEX outbox_ready_to_ship ON wal_delivery.outbox (available_at)
    WHERE (state = 'pending' AND NOT needs_processing) OR state = 'processed';
CREATE INDEX outbox_ready_to_process ON wal_delivery.outbox (available_at)
    WHERE state = 'pending' AND needs_processing;
CREATE INDEX outbox_processing_leases ON wal_delivery.outbox (lease_until)
    WHERE state = 'processing';
CREATE INDEX outbox_finished ON wal_delivery.outbox (finished_at)
    WHERE state IN ('stored', 'dead');

CREATE TABLE wal_delivery.dead_letters (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    origin text NOT NULL CHECK (origin IN ('processing', 'relay', 'delivery')),
    topic text NOT NULL,
    idempotency_key text NOT NULL,
    destination text,                      -- for delivery failures: who refused it
    outbox_id bigint,
    message_key text,
    headers jsonb,
    content_type text,
    payload bytea NOT NULL,
    attempts integer NOT NULL,
    last_error text NOT NULL,
    failed_at timestamptz NOT NULL DEFAULT now(),
    resolved_at timestamptz,
    resolution text
);
CREATE INDEX dead_letters_unresolved ON wal_delivery.dead_letters (failed_at) WHERE resolved_at IS NULL;
CREATE INDEX dead_letters_destination ON wal_delivery.dead_letters (destination) WHERE resolved_at IS NULL;

-- Deleting a topic or destination must not silently drop records still on their way.
CREATE FUNCTION wal_delivery.refuse_delete_with_undelivered() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    undelivered bigint;
    dead bigint := 0;
    what text := CASE TG_TABLE_NAME WHEN 'topics' THEN 'topic' ELSE 'destination' END;
BEGIN
    IF TG_TABLE_NAME = 'topics' THEN
        SELECT count(*) INTO undelivered FROM wal_delivery.outbox
         WHERE topic = OLD.name AND state IN ('pending', 'processing', 'processed');
    ELSE
        SELECT count(*) INTO undelivered FROM wal_delivery.outbox o
         WHERE o.state IN ('pending', 'processing', 'processed')
           AND o.topic IN (SELECT topic FROM wal_delivery.subscriptions WHERE destination = OLD.name);
        SELECT count(*) INTO dead FROM wal_delivery.dead_letters
         WHERE destination = OLD.name AND resolved_at IS NULL;
    END IF;
    IF undelivered + dead = 0 THEN
        RETURN OLD;
    END IF;
    IF NOT current_setting('wal_delivery.force_delete')::boolean THEN
        RAISE EXCEPTION '% "%" still has % undelivered records and % unresolved dead letters', what, OLD.name, undelivered, dead
            USING ERRCODE = 'dependent_objects_still_exist',
                  HINT = format('Wait until wal_delivery.backlog shows none, or force it: BEGIN; SET LOCAL wal_delivery.force_delete = on; DELETE ...; COMMIT;%s',
                                CASE WHEN TG_TABLE_NAME = 'topics' THEN ' (its undelivered records are deleted with it)' ELSE '' END);
    END IF;
    IF TG_TABLE_NAME = 'topics' THEN
        DELETE FROM wal_delivery.outbox WHERE topic = OLD.name AND state IN ('pending', 'processing', 'processed');
    END IF;
    RETURN OLD;
END $$;

CREATE TRIGGER refuse_delete_with_undelivered BEFORE DELETE ON wal_delivery.topics
    FOR EACH ROW EXECUTE FUNCTION wal_delivery.refuse_delete_with_undelivered();
CREATE TRIGGER refuse_delete_with_undelivered BEFORE DELETE ON wal_delivery.destinations
    FOR EACH ROW EXECUTE FUNCTION wal_delivery.refuse_delete_with_undelivered();

------------------------------------------------------------------------------ enqueue

-- The one place a record enters the outbox; the public wal_enqueue overloads call it.
CREATE FUNCTION wal_delivery.enqueue_payload(
    p_topic text, p_payload bytea, p_content_type text,
    p_idempotency_key text, p_key text, p_headers jsonb)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t record;
    v_key text := p_idempotency_key;
    v_id bigint;
BEGIN
    IF p_topic IS NULL OR p_topic = '' THEN
        RAISE EXCEPTION 'topic must not be %', CASE WHEN p_topic IS NULL THEN 'NULL' ELSE 'empty' END
            USING ERRCODE = 'null_value_not_allowed', HINT = 'Pass the name of a row in wal_delivery.topics.';
    END IF;
    IF p_payload IS NULL THEN
        RAISE EXCEPTION 'payload must not be NULL (topic "%")', p_topic
            USING ERRCODE = 'null_value_not_allowed', HINT = 'Enqueue an empty JSON object or empty bytes if the record has no body.';
    END IF;
    SELECT max_payload_bytes, processor IS NOT NULL AS needs_processing INTO t
      FROM wal_delivery.topics WHERE name = p_topic;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'topic "%" does not exist', p_topic
            USING ERRCODE = 'undefined_object',
                  HINT = format('Check the spelling, or ask an admin to create it: INSERT INTO wal_delivery.topics (name) VALUES (%L).', p_topic);
    END IF;
    IF octet_length(p_payload) > t.max_payload_bytes THEN
        RAISE EXCEPTION 'payload of % bytes is over the limit of topic "%" (% bytes)', octet_length(p_payload), p_topic, t.max_payload_bytes
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'Send a smaller payload (for example a reference to the data), or raise the topic''s max_payload_bytes together with max.message.bytes in Kafka.';
    END IF;
    IF v_key IS NULL THEN
        v_key := gen_random_uuid()::text;
    ELSIF v_key = '' OR octet_length(v_key) > 255 THEN
        RAISE EXCEPTION 'idempotency key must be 1 to 255 bytes, got %', octet_length(v_key)
            USING ERRCODE = 'string_data_right_truncation', HINT = 'Use a short stable identifier such as "order-42-created", or NULL for a generated one.';
    END IF;
    IF p_key IS NOT NULL AND octet_length(p_key) > 1024 THEN
        RAISE EXCEPTION 'message key must be at most 1024 bytes, got %', octet_length(p_key)
            USING ERRCODE = 'string_data_right_truncation', HINT = 'The key only chooses the Kafka partition; a short identifier is enough.';
    END IF;
    IF NOT wal_delivery.is_string_map(p_headers) THEN
        RAISE EXCEPTION 'headers must be a JSON object of strings, got %', left(p_headers::text, 200)
            USING ERRCODE = 'invalid_parameter_value', HINT = 'For example {"trace-id": "abc"}; put numbers in quotes.';
    END IF;

    INSERT INTO wal_delivery.outbox (topic, idempotency_key, needs_processing, message_key, headers,
                                     content_type, payload, enqueued_by)
    VALUES (p_topic, v_key, t.needs_processing, p_key, p_headers, p_content_type, p_payload,
            wal_delivery.invoking_role())
    ON CONFLICT (topic, idempotency_key) DO NOTHING
    RETURNING id INTO v_id;

    IF v_id IS NULL THEN
        -- A repeated key: the first enqueue wins and this one writes nothing.
        SELECT id INTO v_id FROM wal_delivery.outbox WHERE topic = p_topic AND idempotency_key = v_key;
        IF v_id IS NULL THEN
            RAISE EXCEPTION 'idempotency key "%" of topic "%" was enqueued by a transaction this snapshot cannot see', v_key, p_topic
                USING ERRCODE = 'serialization_failure', HINT = 'Retry the transaction.';
        END IF;
        RETURN v_id;
    END IF;
    PERFORM wal_delivery.wake_relay_at_commit();
    RETURN v_id;
END $$;

-- Apps call these unqualified, whatever their search_path, so they live in pg_catalog.
CREATE FUNCTION pg_catalog.wal_enqueue(topic text, payload jsonb, idempotency_key text DEFAULT NULL,
                                       key text DEFAULT NULL, headers jsonb DEFAULT NULL)
RETURNS bigint LANGUAGE sql AS $$
    SELECT wal_delivery.enqueue_payload(topic, convert_to(payload::text, 'UTF8'), 'application/json',
                                        idempotency_key, key, headers)
$$;

CREATE FUNCTION pg_catalog.wal_enqueue(topic text, payload bytea, idempotency_key text DEFAULT NULL,
                                       key text DEFAULT NULL, headers jsonb DEFAULT NULL)
RETURNS bigint LANGUAGE sql AS $$
    SELECT wal_delivery.enqueue_payload(topic, payload, 'application/octet-stream',
                                        idempotency_key, key, headers)
$$;

CREATE FUNCTION pg_catalog.wal_enqueue(topic text, payload text, idempotency_key text DEFAULT NULL,
                                       key text DEFAULT NULL, headers jsonb DEFAULT NULL)
RETURNS bigint LANGUAGE sql AS $$
    SELECT wal_delivery.enqueue_payload(topic, convert_to(payload, 'UTF8'), 'text/plain; charset=utf-8',
                                        idempotency_key, key, headers)
$$;

-- Many records of one topic in one call. The arrays line up by position; keys, message
-- keys and headers may be NULL (all generated / none). Returns the ids in input order,
-- the existing id where an idempotency key was seen before.
CREATE FUNCTION wal_delivery.enqueue_payload_batch(
    p_topic text, p_payloads bytea[], p_content_type text,
    p_idempotency_keys text[], p_keys text[], p_headers jsonb[])
RETURNS bigint[]
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t record;
    n integer := coalesce(cardinality(p_payloads), 0);
    v_keys text[];
    bad integer;
    v_ids bigint[];
BEGIN
    IF p_topic IS NULL OR p_topic = '' THEN
        RAISE EXCEPTION 'topic must not be %', CASE WHEN p_topic IS NULL THEN 'NULL' ELSE 'empty' END
            USING ERRCODE = 'null_value_not_allowed', HINT = 'Pass the name of a row in wal_delivery.topics.';
    END IF;
    SELECT max_payload_bytes, processor IS NOT NULL AS needs_processing INTO t
      FROM wal_delivery.topics WHERE name = p_topic;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'topic "%" does not exist', p_topic
            USING ERRCODE = 'undefined_object',
                  HINT = format('Check the spelling, or ask an admin to create it: INSERT INTO wal_delivery.topics (name) VALUES (%L).', p_topic);
    END IF;
    IF p_payloads IS NULL OR array_ndims(p_payloads) > 1 THEN
        RAISE EXCEPTION 'payloads must be a one-dimensional array, not %', CASE WHEN p_payloads IS NULL THEN 'NULL' ELSE 'a matrix' END
            USING ERRCODE = 'null_value_not_allowed', HINT = 'Pass ARRAY[...] with one payload per record.';
    END IF;
    IF (p_idempotency_keys IS NOT NULL AND cardinality(p_idempotency_keys) <> n)
       OR (p_keys IS NOT NULL AND cardinality(p_keys) <> n)
       OR (p_headers IS NOT NULL AND cardinality(p_headers) <> n) THEN
        RAISE EXCEPTION 'idempotency_keys, keys and headers must be NULL or have one element per payload (% payloads)', n
            USING ERRCODE = 'array_subscript_error', HINT = 'Line the arrays up by position; use NULL elements where a record has none.';
    END IF;
    bad := array_position(p_payloads, NULL);
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'payload % of the batch is NULL (topic "%")', bad, p_topic
            USING ERRCODE = 'null_value_not_allowed', HINT = 'Enqueue an empty JSON object or empty bytes if a record has no body.';
    END IF;
    SELECT i INTO bad FROM generate_subscripts(p_payloads, 1) i
     WHERE octet_length(p_payloads[i]) > t.max_payload_bytes LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'payload % of the batch has % bytes, over the limit of topic "%" (% bytes)',
                        bad, octet_length(p_payloads[bad]), p_topic, t.max_payload_bytes
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'Send a smaller payload, or raise the topic''s max_payload_bytes together with max.message.bytes in Kafka.';
    END IF;
    SELECT i INTO bad FROM generate_subscripts(p_payloads, 1) i
     WHERE p_idempotency_keys[i] = '' OR octet_length(p_idempotency_keys[i]) > 255
        OR octet_length(p_keys[i]) > 1024 OR NOT wal_delivery.is_string_map(p_headers[i]) LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'record % of the batch has a bad idempotency key, message key or headers', bad
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Idempotency keys are 1 to 255 bytes or NULL, message keys at most 1024 bytes, headers a JSON object of strings.';
    END IF;

    v_keys := ARRAY(SELECT coalesce(p_idempotency_keys[i], gen_random_uuid()::text)
                      FROM generate_series(1, n) i);
    INSERT INTO wal_delivery.outbox (topic, idempotency_key, needs_processing, message_key, headers,
                                     content_type, payload, enqueued_by)
    SELECT p_topic, v_keys[i], t.needs_processing, p_keys[i], p_headers[i], p_content_type,
           p_payloads[i], wal_delivery.invoking_role()
      FROM generate_series(1, n) i
    ON CONFLICT (topic, idempotency_key) DO NOTHING;

    SELECT array_agg(o.id ORDER BY k.i) INTO v_ids
      FROM unnest(v_keys) WITH ORDINALITY AS k(key, i)
      LEFT JOIN wal_delivery.outbox o ON o.topic = p_topic AND o.idempotency_key = k.key;
    IF array_position(v_ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'an idempotency key of topic "%" was enqueued by a transaction this snapshot cannot see', p_topic
            USING ERRCODE = 'serialization_failure', HINT = 'Retry the transaction.';
    END IF;
    IF n > 0 THEN
        PERFORM wal_delivery.wake_relay_at_commit();
    END IF;
    RETURN coalesce(v_ids, '{}');
END $$;

CREATE FUNCTION pg_catalog.wal_enqueue_batch(topic text, payloads jsonb[], idempotency_keys text[] DEFAULT NULL,
                                             keys text[] DEFAULT NULL, headers jsonb[] DEFAULT NULL)
RETURNS bigint[] LANGUAGE sql AS $$
    SELECT wal_delivery.enqueue_payload_batch(
        topic, CASE WHEN payloads IS NOT NULL THEN ARRAY(SELECT convert_to(p::text, 'UTF8') FROM unnest(payloads) p) END,
        'application/json', idempotency_keys, keys, headers)
$$;

CREATE FUNCTION pg_catalog.wal_enqueue_batch(topic text, payloads bytea[], idempotency_keys text[] DEFAULT NULL,
                                             keys text[] DEFAULT NULL, headers jsonb[] DEFAULT NULL)
RETURNS bigint[] LANGUAGE sql AS $$
    SELECT wal_delivery.enqueue_payload_batch(topic, payloads, 'application/octet-stream',
                                              idempotency_keys, keys, headers)
$$;

CREATE FUNCTION pg_catalog.wal_enqueue_batch(topic text, payloads text[], idempotency_keys text[] DEFAULT NULL,
                                             keys text[] DEFAULT NULL, headers jsonb[] DEFAULT NULL)
RETURNS bigint[] LANGUAGE sql AS $$
    SELECT wal_delivery.enqueue_payload_batch(
        topic, CASE WHEN payloads IS NOT NULL THEN ARRAY(SELECT convert_to(p, 'UTF8') FROM unnest(payloads) p) END,
        'text/plain; charset=utf-8', idempotency_keys, keys, headers)
$$;

------------------------------------------------------------------------------ state machine

-- Moves a row to dead and records it in dead_letters (caller holds the row).
CREATE FUNCTION wal_delivery.bury_row(p_id bigint, p_origin text, p_error text) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO wal_delivery.dead_letters (origin, topic, idempotency_key, outbox_id, message_key,
                                           headers, content_type, payload, attempts, last_error)
    SELECT p_origin, topic, idempotency_key, id, message_key, headers, content_type, payload,
           attempts, p_error
      FROM wal_delivery.outbox WHERE id = p_id;
    UPDATE wal_delivery.outbox
       SET state = 'dead', last_error = p_error, finished_at = now(), lease_until = NULL
     WHERE id = p_id;
$$;

-- Names why a processing transition is refused: missing, wrong state, or a lost lease.
CREATE FUNCTION wal_delivery.refuse_processing_transition(p_id bigint, p_lease_token bigint) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    SELECT state, lease_token, lease_until INTO r FROM wal_delivery.outbox WHERE id = p_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'outbox row % does not exist', p_id
            USING ERRCODE = 'undefined_object', HINT = 'It may have been purged after its idempotency window.';
    ELSIF r.state <> 'processing' THEN
        RAISE EXCEPTION 'outbox row % is %, not processing', p_id, r.state
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Only rows returned by wal_delivery.claim_ready_to_process can be completed or failed.';
    ELSIF r.lease_token IS DISTINCT FROM p_lease_token THEN
        RAISE EXCEPTION 'stale lease token % for outbox row %: it was claimed again with token %', p_lease_token, p_id, r.lease_token
            USING ERRCODE = 'lock_not_available', HINT = 'This worker''s lease was lost; drop its result, the new holder will write one.';
    ELSE
        RAISE EXCEPTION 'the lease on outbox row % (token %) expired at %', p_id, p_lease_token, r.lease_until
            USING ERRCODE = 'lock_not_available', HINT = 'Work that outlives its lease is not written; raise the topic''s processing_lease if it is too short.';
    END IF;
END $$;

-- (a) Rows ready to ship to Kafka: plain pending rows and processed rows, oldest first.
-- They stay locked (FOR UPDATE SKIP LOCKED) until the caller's transaction ends, so
-- relays side by side never take the same row and a crashed relay leaves them claimable.
CREATE FUNCTION wal_delivery.claim_ready_to_ship(p_max_rows integer DEFAULT 100)
RETURNS TABLE (id bigint, topic text, idempotency_key text, message_key text, headers jsonb,
               content_type text, payload bytea, created_at timestamptz)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT o.id, o.topic, o.idempotency_key, o.message_key, o.headers, o.content_type,
           coalesce(o.processed_payload, o.payload), o.created_at
      FROM wal_delivery.outbox o
     WHERE ((o.state = 'pending' AND NOT o.needs_processing) OR o.state = 'processed')
       AND o.available_at <= now()
     ORDER BY o.available_at
     LIMIT p_max_rows
       FOR UPDATE SKIP LOCKED
$$;

-- Names why a row cannot take a shipping transition: missing, or not ready to ship.
CREATE FUNCTION wal_delivery.refuse_ship_transition(p_id bigint) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    SELECT state, needs_processing INTO r FROM wal_delivery.outbox WHERE id = p_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'outbox row % does not exist', p_id
            USING ERRCODE = 'undefined_object', HINT = 'It may have been purged after its idempotency window.';
    END IF;
    RAISE EXCEPTION 'outbox row % is %, not ready to ship', p_id, r.state::text ||
                    CASE WHEN r.needs_processing AND r.state IN ('pending', 'processing') THEN ' (its topic needs processing first)' ELSE '' END
        USING ERRCODE = 'object_not_in_prerequisite_state',
              HINT = 'Only rows returned by wal_delivery.claim_ready_to_ship can be marked stored or unshippable.';
END $$;

-- Kafka acknowledged these rows with their topic's acks. All or nothing.
CREATE FUNCTION wal_delivery.mark_stored(p_ids bigint[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
    bad bigint;
BEGIN
    SELECT i INTO bad FROM unnest(p_ids) i
     WHERE NOT EXISTS (SELECT 1 FROM wal_delivery.outbox o
                        WHERE o.id = i AND ((o.state = 'pending' AND NOT o.needs_processing) OR o.state = 'processed'))
     LIMIT 1;
    IF bad IS NOT NULL THEN
        PERFORM wal_delivery.refuse_ship_transition(bad);
    END IF;
    UPDATE wal_delivery.outbox
       SET state = 'stored', finished_at = now(), last_error = NULL
     WHERE id = ANY (p_ids) AND ((state = 'pending' AND NOT needs_processing) OR state = 'processed');
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- Shipping failed in a way worth retrying: try again after p_delay.
CREATE FUNCTION wal_delivery.defer_shipping(p_ids bigint[], p_error text, p_delay interval) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
BEGIN
    UPDATE wal_delivery.outbox SET available_at = now() + p_delay, last_error = p_error
     WHERE id = ANY (p_ids) AND ((state = 'pending' AND NOT needs_processing) OR state = 'processed');
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- A row that can never be shipped (too large for the broker, topic cannot be created).
CREATE FUNCTION wal_delivery.mark_unshippable(p_id bigint, p_error text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM 1 FROM wal_delivery.outbox
     WHERE id = p_id AND ((state = 'pending' AND NOT needs_processing) OR state = 'processed') FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM wal_delivery.refuse_ship_transition(p_id);
    END IF;
    PERFORM wal_delivery.bury_row(p_id, 'relay', p_error);
END $$;

-- Rows whose processing lease ran out go back to pending, or to dead after the last attempt.
CREATE FUNCTION wal_delivery.expire_processing_leases(p_max_rows integer DEFAULT 1000) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
    n integer := 0;
BEGIN
    FOR r IN
        SELECT o.id, o.attempts, t.processing_max_attempts AS max_attempts, o.lease_until
          FROM wal_delivery.outbox o JOIN wal_delivery.topics t ON t.name = o.topic
         WHERE o.state = 'processing' AND o.lease_until <= now()
         ORDER BY o.lease_until LIMIT p_max_rows
           FOR UPDATE OF o SKIP LOCKED
    LOOP
        IF r.attempts >= r.max_attempts THEN
            PERFORM wal_delivery.bury_row(r.id, 'processing',
                format('processing lease expired at %s on attempt %s of %s', r.lease_until, r.attempts, r.max_attempts));
        ELSE
            UPDATE wal_delivery.outbox
               SET state = 'pending', lease_until = NULL, available_at = now(),
                   last_error = format('processing lease expired at %s', r.lease_until)
             WHERE id = r.id;
        END IF;
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;

-- (b) Rows ready to process: each comes with a lease (the topic's processing_lease, or
-- p_lease) and a fresh fencing token that the processor passes back with its result.
CREATE FUNCTION wal_delivery.claim_ready_to_process(p_max_rows integer DEFAULT 10, p_lease interval DEFAULT NULL)
RETURNS TABLE (id bigint, topic text, idempotency_key text, content_type text, headers jsonb,
               payload bytea, attempts smallint, lease_token bigint, lease_until timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_lease IS NOT NULL AND p_lease <= interval '0' THEN
        RAISE EXCEPTION 'lease must be positive, got %', p_lease USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM wal_delivery.expire_processing_leases();
    RETURN QUERY
    WITH claimed AS (
        SELECT c.id FROM wal_delivery.outbox c
         WHERE c.state = 'pending' AND c.needs_processing AND c.available_at <= now()
         ORDER BY c.available_at LIMIT p_max_rows
           FOR UPDATE SKIP LOCKED
    )
    UPDATE wal_delivery.outbox o
       SET state = 'processing', attempts = o.attempts + 1,
           lease_token = nextval('wal_delivery.lease_token_seq'),
           lease_until = now() + coalesce(p_lease, t.processing_lease)
      FROM claimed, wal_delivery.topics t
     WHERE o.id = claimed.id AND t.name = o.topic
    RETURNING o.id, o.topic, o.idempotency_key, o.content_type, o.headers, o.payload,
              o.attempts, o.lease_token, o.lease_until;
END $$;

-- The processor's result, accepted only from the current lease holder within its lease.
CREATE FUNCTION wal_delivery.complete_processing(p_id bigint, p_lease_token bigint, p_processed_payload bytea)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_limit integer;
BEGIN
    IF p_processed_payload IS NULL THEN
        RAISE EXCEPTION 'processed payload of outbox row % must not be NULL', p_id
            USING ERRCODE = 'null_value_not_allowed', HINT = 'Report a failure with wal_delivery.fail_processing instead.';
    END IF;
    SELECT t.max_payload_bytes INTO v_limit FROM wal_delivery.outbox o JOIN wal_delivery.topics t ON t.name = o.topic
     WHERE o.id = p_id;
    IF octet_length(p_processed_payload) > v_limit THEN
        RAISE EXCEPTION 'processed payload of outbox row % has % bytes, over its topic''s limit of % bytes', p_id, octet_length(p_processed_payload), v_limit
            USING ERRCODE = 'program_limit_exceeded', HINT = 'The processor must keep payloads within the topic''s max_payload_bytes.';
    END IF;
    UPDATE wal_delivery.outbox
       SET state = 'processed', processed_payload = p_processed_payload, lease_until = NULL,
           available_at = now(), last_error = NULL
     WHERE id = p_id AND state = 'processing' AND lease_token = p_lease_token AND lease_until > now();
    IF NOT FOUND THEN
        PERFORM wal_delivery.refuse_processing_transition(p_id, p_lease_token);
    END IF;
END $$;

-- The processor failed on this row: retry after a backoff, or bury it after the last attempt.
CREATE FUNCTION wal_delivery.fail_processing(p_id bigint, p_lease_token bigint, p_error text)
RETURNS wal_delivery.outbox_state
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    SELECT o.attempts, t.processing_max_attempts AS max_attempts, t.processing_backoff AS backoff INTO r
      FROM wal_delivery.outbox o JOIN wal_delivery.topics t ON t.name = o.topic
     WHERE o.id = p_id AND o.state = 'processing' AND o.lease_token = p_lease_token AND o.lease_until > now()
       FOR UPDATE OF o;
    IF NOT FOUND THEN
        PERFORM wal_delivery.refuse_processing_transition(p_id, p_lease_token);
    END IF;
    IF r.attempts >= r.max_attempts THEN
        PERFORM wal_delivery.bury_row(p_id, 'processing', coalesce(p_error, 'processing failed'));
        RETURN 'dead';
    END IF;
    -- Exponential backoff from the topic's processing_backoff, capped at 5 minutes.
    UPDATE wal_delivery.outbox
       SET state = 'pending', lease_until = NULL, last_error = coalesce(p_error, 'processing failed'),
           available_at = now() + least(r.backoff * power(2, r.attempts - 1), interval '5 minutes')
     WHERE id = p_id;
    RETURN 'pending';
END $$;

------------------------------------------------------------------------------ retention

-- One batch of finished rows past their topic's idempotency window. Small batches with
-- SKIP LOCKED keep each transaction short and never wait on a relay or processor.
CREATE FUNCTION wal_delivery.purge_finished_rows(p_batch_size integer DEFAULT 1000) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
    shortest interval;
BEGIN
    SELECT coalesce(min(idempotency_window), interval '0') INTO shortest FROM wal_delivery.topics;
    WITH doomed AS (
        SELECT o.id FROM wal_delivery.outbox o
          LEFT JOIN wal_delivery.topics t ON t.name = o.topic
         WHERE o.state IN ('stored', 'dead')
           AND o.finished_at < now() - shortest
           AND (t.name IS NULL OR o.finished_at < now() - t.idempotency_window)
         ORDER BY o.finished_at LIMIT p_batch_size
           FOR UPDATE OF o SKIP LOCKED
    )
    DELETE FROM wal_delivery.outbox o USING doomed WHERE o.id = doomed.id;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- Purges in batches, committing after each, until nothing is left or p_max_batches ran.
-- CALL it outside a transaction block (pg_cron or the maintenance worker do).
CREATE PROCEDURE wal_delivery.purge_finished(p_batch_size integer DEFAULT 1000, p_max_batches integer DEFAULT 1000)
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    FOR i IN 1 .. p_max_batches LOOP
        n := wal_delivery.purge_finished_rows(p_batch_size);
        COMMIT;
        EXIT WHEN n < p_batch_size;
    END LOOP;
END $$;

------------------------------------------------------------------------------ views

CREATE VIEW wal_delivery.backlog AS
SELECT topic, state, count(*) AS records, min(created_at) AS oldest_created_at,
       now() - min(created_at) AS oldest_age
  FROM wal_delivery.outbox
 WHERE state IN ('pending', 'processing', 'processed')
 GROUP BY topic, state;

CREATE VIEW wal_delivery.unresolved_dead_letters AS
SELECT id, origin, topic, destination, idempotency_key, outbox_id, attempts, last_error,
       failed_at, now() - failed_at AS age
  FROM wal_delivery.dead_letters
 WHERE resolved_at IS NULL;

CREATE VIEW wal_delivery.config_status AS
SELECT version, published_version, version = published_version AS in_sync, changed_at
  FROM wal_delivery.config_version;

-- What the writer role may see: the status of the records it enqueued itself.
CREATE VIEW wal_delivery.my_records WITH (security_barrier) AS
SELECT id, topic, idempotency_key, state, attempts, created_at, finished_at, last_error
  FROM wal_delivery.outbox
 WHERE enqueued_by = (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user);

------------------------------------------------------------------------------ roles

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'wal_delivery_writer') THEN
        CREATE ROLE wal_delivery_writer NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'wal_delivery_admin') THEN
        CREATE ROLE wal_delivery_admin NOLOGIN;
    END IF;
END $$;

REVOKE ALL ON ALL TABLES IN SCHEMA wal_delivery FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA wal_delivery FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA wal_delivery FROM PUBLIC;
REVOKE ALL ON PROCEDURE wal_delivery.purge_finished(integer, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_catalog.wal_enqueue(text, jsonb, text, text, jsonb),
                       pg_catalog.wal_enqueue(text, bytea, text, text, jsonb),
                       pg_catalog.wal_enqueue(text, text, text, text, jsonb),
                       pg_catalog.wal_enqueue_batch(text, jsonb[], text[], text[], jsonb[]),
                       pg_catalog.wal_enqueue_batch(text, bytea[], text[], text[], jsonb[]),
                       pg_catalog.wal_enqueue_batch(text, text[], text[], text[], jsonb[]) FROM PUBLIC;

GRANT USAGE ON SCHEMA wal_delivery TO wal_delivery_writer, wal_delivery_admin;

-- The writer enqueues and reads its own records' status; nothing else.
GRANT EXECUTE ON FUNCTION pg_catalog.wal_enqueue(text, jsonb, text, text, jsonb),
                          pg_catalog.wal_enqueue(text, bytea, text, text, jsonb),
                          pg_catalog.wal_enqueue(text, text, text, text, jsonb),
                          pg_catalog.wal_enqueue_batch(text, jsonb[], text[], text[], jsonb[]),
                          pg_catalog.wal_enqueue_batch(text, bytea[], text[], text[], jsonb[]),
                          pg_catalog.wal_enqueue_batch(text, text[], text[], text[], jsonb[]),
                          wal_delivery.enqueue_payload(text, bytea, text, text, text, jsonb),
                          wal_delivery.enqueue_payload_batch(text, bytea[], text, text[], text[], jsonb[])
    TO wal_delivery_writer, wal_delivery_admin;
GRANT SELECT ON wal_delivery.my_records TO wal_delivery_writer, wal_delivery_admin;

-- The admin manages the control plane and dead letters and runs the workers' routines.
GRANT SELECT, INSERT, UPDATE, DELETE ON wal_delivery.topics, wal_delivery.destinations,
      wal_delivery.destination_secrets, wal_delivery.subscriptions TO wal_delivery_admin;
GRANT SELECT, UPDATE ON wal_delivery.settings TO wal_delivery_admin;
GRANT SELECT ON wal_delivery.outbox, wal_delivery.config_version, wal_delivery.backlog,
      wal_delivery.unresolved_dead_letters, wal_delivery.config_status TO wal_delivery_admin;
GRANT SELECT, UPDATE (resolved_at, resolution) ON wal_delivery.dead_letters TO wal_delivery_admin;
GRANT EXECUTE ON FUNCTION wal_delivery.claim_ready_to_ship(integer),
                          wal_delivery.mark_stored(bigint[]),
                          wal_delivery.defer_shipping(bigint[], text, interval),
                          wal_delivery.mark_unshippable(bigint, text),
                          wal_delivery.claim_ready_to_process(integer, interval),
                          wal_delivery.complete_processing(bigint, bigint, bytea),
                          wal_delivery.fail_processing(bigint, bigint, text),
                          wal_delivery.expire_processing_leases(integer),
                          wal_delivery.purge_finished_rows(integer),
                          wal_delivery.relay_wakeups(),
                          wal_delivery.library_version()
    TO wal_delivery_admin;
GRANT EXECUTE ON PROCEDURE wal_delivery.purge_finished(integer, integer) TO wal_delivery_admin;

-- pg_dump keeps the control plane's rows (the extension recreates the tables).
SELECT pg_catalog.pg_extension_config_dump('wal_delivery.topics', '');
SELECT pg_catalog.pg_extension_config_dump('wal_delivery.destinations', '');
SELECT pg_catalog.pg_extension_config_dump('wal_delivery.destination_secrets', '');
SELECT pg_catalog.pg_extension_config_dump('wal_delivery.subscriptions', '');
