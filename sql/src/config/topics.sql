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
    -- The roles whose members may enqueue into the topic; NULL: any writer. Keeps tenants
    -- that share a database from writing (and probing the keys of) each other's topics.
    writers regrole[],
    -- A Kafka topic of this name that wal_delivery did not create is left alone (not
    -- altered, nothing shipped into it) unless this is true: then its retention,
    -- min.insync.replicas and max.message.bytes become the row's (never a lower limit).
    adopt boolean NOT NULL DEFAULT false,
    CHECK (acks IN (-1, 1)),
    CHECK (partitions BETWEEN 1 AND 1000 AND replication_factor >= 1),
    CHECK (min_insync_replicas BETWEEN 1 AND replication_factor),
    CHECK (processor_kind IN ('sql', 'http')),
    CHECK ((processor_kind IS NULL) = (processor IS NULL))
);

-- The Kafka topics the settings reserve for the system: the three retry steps, the pause
-- topic (where retry workers announce a pause to every worker, so it spreads while
-- Postgres is unreachable) and the DLQ.
CREATE FUNCTION wal_delivery.internal_topic_names(p_retry_topic_prefix text, p_dlq_topic text)
RETURNS TABLE (topic text, what text)
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT p_retry_topic_prefix || step, 'retry step ' || step FROM generate_series(1, 3) step
    UNION ALL
    SELECT p_retry_topic_prefix || 'pauses', 'pause topic'
    UNION ALL
    SELECT p_dlq_topic, 'DLQ topic'
$$;

-- Serializes the writes that name Kafka topics (topics, settings), so two transactions
-- cannot each add one half of a collision the other's check did not see yet. The lock is
-- the config version's row, which each such write updates at its end anyway, and which
-- only wal_delivery's own routines may lock (the checks that call this run as the
-- extension's owner). Not an advisory lock: any login may take any of those, and one that
-- held it would stop every topic and settings change for as long as it liked.
CREATE FUNCTION wal_delivery.lock_topic_names() RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    SELECT FROM wal_delivery.config_version FOR UPDATE
$$;

-- Largest partitions of a topic. Kafka can add partitions but never remove them, so a typo
-- would stay for good; and each partition costs every broker holding a replica (Kafka's
-- guidance: at most about 4,000 replicas per broker): 1,000 partitions at replication
-- factor 3 on three brokers already take a quarter of that, far more than the few
-- consumers of a topic here can use (one consumer per partition at most).
CREATE FUNCTION wal_delivery.max_topic_partitions() RETURNS integer
LANGUAGE sql IMMUTABLE AS 'SELECT 1000';

-- Why a SQL processor cannot be used, or NULL: it must be a plain function taking one
-- bytea and returning bytea (not a set), outside any temporary schema (which disappears
-- with its session, and which the workers' sessions would not see).
CREATE FUNCTION wal_delivery.sql_processor_problem(p_processor text) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    f regprocedure := to_regprocedure(p_processor || '(bytea)');
    p record;
BEGIN
    IF f IS NULL THEN
        RETURN 'it must name an existing function taking bytea';
    END IF;
    SELECT prorettype, proretset, prokind, pronamespace INTO p FROM pg_proc WHERE oid = f;
    IF p.pronamespace = pg_my_temp_schema() OR pg_is_other_temp_schema(p.pronamespace) THEN
        RETURN format('%s(bytea) lives in a temporary schema, which goes away with its session', p_processor);
    ELSIF p.prokind <> 'f' THEN
        RETURN format('%s is not a plain function', f);
    ELSIF p.prorettype <> 'bytea'::regtype OR p.proretset THEN
        RETURN format('%s returns %s%s, not bytea', f, CASE WHEN p.proretset THEN 'SETOF ' ELSE '' END, p.prorettype::regtype);
    END IF;
    RETURN NULL;
END $$;

-- Refuses a topic whose name Kafka would refuse or that would be the same Kafka topic as
-- a retry step, the DLQ or another topic ("." and "_" collide in Kafka).
CREATE FUNCTION wal_delivery.check_topic_name(p_name text, p_old_name text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    problem text := wal_delivery.topic_name_problem(p_name);
    clash record;
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'invalid topic name "%": %', p_name, problem
            USING ERRCODE = 'invalid_name',
                  HINT = 'A topic name is 1 to 249 letters, digits, ".", "_" or "-", not "." or "..", not starting with "__" (what Kafka accepts).';
    END IF;
    PERFORM wal_delivery.lock_topic_names();
    SELECT i.topic, i.what INTO clash
      FROM wal_delivery.settings s, wal_delivery.internal_topic_names(s.retry_topic_prefix, s.dlq_topic) i
     WHERE wal_delivery.kafka_collision_key(i.topic) = wal_delivery.kafka_collision_key(p_name);
    IF FOUND THEN
        PERFORM wal_delivery.refuse_setting(format('topic "%s" would be the same Kafka topic as the %s', p_name, clash.what), clash.topic,
            'Choose another name: settings.retry_topic_prefix and settings.dlq_topic name the system''s own topics ("." and "_" count as the same in Kafka).');
    END IF;
    SELECT t.name AS topic INTO clash FROM wal_delivery.topics t
     WHERE wal_delivery.kafka_collision_key(t.name) = wal_delivery.kafka_collision_key(p_name)
       AND t.name <> p_name AND t.name IS DISTINCT FROM p_old_name;
    IF FOUND THEN
        PERFORM wal_delivery.refuse_setting(format('topic "%s" would be the same Kafka topic as topic "%s"', p_name, clash.topic), clash.topic,
            'Kafka refuses two topic names that differ only by "." against "_"; choose another name.');
    END IF;
END $$;

-- Refuses a bad topic with a message naming the setting, the value and what to use.
-- SECURITY DEFINER: the admin role writes the row, the checks read settings and pg_proc.
CREATE FUNCTION wal_delivery.check_topic() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    problem text;
BEGIN
    IF TG_OP = 'INSERT' OR NEW.name IS DISTINCT FROM OLD.name THEN
        PERFORM wal_delivery.check_topic_name(NEW.name, CASE WHEN TG_OP = 'UPDATE' THEN OLD.name END);
    END IF;
    IF NEW.writers IS NOT NULL AND (array_ndims(NEW.writers) > 1 OR array_position(NEW.writers, NULL) IS NOT NULL) THEN
        PERFORM wal_delivery.refuse_setting(format('writers of topic "%s" must be a list of roles without NULLs', NEW.name),
            NEW.writers::text, 'For example ARRAY[''billing_app'']::regrole[], or NULL to let any member of wal_delivery_writer write the topic.');
    END IF;
    IF NEW.acks IS NULL OR NEW.acks NOT IN (-1, 1) THEN
        PERFORM wal_delivery.refuse_setting(format('acks of topic "%s" must be -1 (all in-sync replicas) or 1 (leader only)', NEW.name),
            NEW.acks::text, 'Use -1 (the default), or 1 for a topic that may lose records on a leader crash. 0 is refused: nothing would wait for Kafka, which breaks "durable after ack".');
    END IF;
    IF NEW.partitions IS NULL OR NEW.partitions NOT BETWEEN 1 AND wal_delivery.max_topic_partitions() THEN
        PERFORM wal_delivery.refuse_setting(format('partitions of topic "%s" must be between 1 and %s', NEW.name, wal_delivery.max_topic_partitions()), NEW.partitions::text,
            'The default is 3. Kafka can add partitions but never remove them, and a consumer group uses at most one consumer per partition.');
    END IF;
    IF NEW.replication_factor IS NULL OR NEW.replication_factor < 1 THEN
        PERFORM wal_delivery.refuse_setting(format('replication_factor of topic "%s" must be at least 1', NEW.name), NEW.replication_factor::text, 'Use 3 in production, 1 only on a single-broker test cluster.');
    END IF;
    IF NEW.min_insync_replicas IS NULL OR NEW.min_insync_replicas NOT BETWEEN 1 AND NEW.replication_factor THEN
        PERFORM wal_delivery.refuse_setting(format('min_insync_replicas of topic "%s" must be between 1 and its replication_factor (%s)', NEW.name, NEW.replication_factor),
            NEW.min_insync_replicas::text, 'With replication_factor 3 use min_insync_replicas 2.');
    END IF;
    IF NEW.retention IS NULL OR NEW.retention <= interval '0' OR NEW.retention > interval '100 years' THEN
        PERFORM wal_delivery.refuse_setting(format('retention of topic "%s" must be positive and at most 100 years', NEW.name), NEW.retention::text,
            'The default is 7 days. A longer one overflows the timestamp arithmetic and would stop the reconciler for every topic.');
    END IF;
    IF NEW.max_payload_bytes IS NULL OR NEW.max_payload_bytes NOT BETWEEN 1 AND 100000000 THEN
        PERFORM wal_delivery.refuse_setting(format('max_payload_bytes of topic "%s" must be between 1 and 100000000', NEW.name), NEW.max_payload_bytes::text,
            'The default is 1000000. The reconciler sets the Kafka topics'' max.message.bytes above it.');
    END IF;
    IF NEW.idempotency_window IS NULL OR NEW.idempotency_window NOT BETWEEN interval '0' AND interval '100 years' THEN
        PERFORM wal_delivery.refuse_setting(format('idempotency_window of topic "%s" must be between 0 and 100 years', NEW.name), NEW.idempotency_window::text,
            'The default is 1 day. A longer one overflows the timestamp arithmetic and would stop the purge for every topic.');
    END IF;
    IF (NEW.processor_kind IS NULL) <> (NEW.processor IS NULL) OR NEW.processor_kind NOT IN ('sql', 'http') THEN
        PERFORM wal_delivery.refuse_setting(format('processor_kind of topic "%s" must be ''sql'' or ''http'' with a processor, or both NULL', NEW.name),
            coalesce(NEW.processor_kind, 'NULL') || ' with processor ' || coalesce(NEW.processor, 'NULL'),
            'For a SQL processor set processor to a function name taking and returning bytea; for HTTP, to its URL.');
    END IF;
    IF NEW.processor_kind = 'sql' THEN
        problem := wal_delivery.sql_processor_problem(NEW.processor);
        IF problem IS NOT NULL THEN
            PERFORM wal_delivery.refuse_setting(format('processor of topic "%s" must be a function taking and returning bytea: %s', NEW.name, problem), NEW.processor,
                'Create the function first, e.g. CREATE FUNCTION my_schema.redact(payload bytea) RETURNS bytea, and use its schema-qualified name.');
        END IF;
    END IF;
    IF NEW.processor_kind = 'http' THEN
        problem := wal_delivery.http_url_problem(NEW.processor);
        IF problem IS NOT NULL THEN
            PERFORM wal_delivery.refuse_setting(format('processor of topic "%s" must be an http:// or https:// URL: %s', NEW.name, problem), wal_delivery.url_for_message(NEW.processor),
                'For example https://transform.internal/redact.');
        END IF;
    END IF;
    IF NEW.processing_lease IS NULL OR NEW.processing_lease <= interval '0' OR NEW.processing_lease > interval '1 day'
       OR NEW.processing_backoff IS NULL OR NEW.processing_backoff NOT BETWEEN interval '0' AND interval '5 minutes' THEN
        PERFORM wal_delivery.refuse_setting(format('processing_lease of topic "%s" must be positive and at most 1 day, and processing_backoff between 0 and 5 minutes', NEW.name),
            coalesce(NEW.processing_lease::text, 'NULL') || ' and ' || coalesce(NEW.processing_backoff::text, 'NULL'),
            'The defaults are 30 seconds and 1 second; the backoff doubles with each attempt up to 5 minutes.');
    END IF;
    IF NEW.processing_max_attempts IS NULL OR NEW.processing_max_attempts NOT BETWEEN 1 AND 1000 THEN
        PERFORM wal_delivery.refuse_setting(format('processing_max_attempts of topic "%s" must be between 1 and 1000', NEW.name), NEW.processing_max_attempts::text,
            'The default is 5. With the backoff capped at 5 minutes, 1000 attempts already keep a failing record retrying for about 3.5 days.');
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
