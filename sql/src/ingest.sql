-- The ingest service (`wal-worker ingest`): the HTTP entry point for services that do not
-- write to this database. Who may send to which topic is a bearer token, kept here only
-- as its SHA-256; what the service loads is ingest_config(), which carries no secret of
-- anyone else's (no signing secrets, no S3 keys). Records that go through the outbox
-- enter by ingest_enqueue_batch, the writer's door with the request's content type.
--
-- Words used below:
--   token    a random string the client sends as "Authorization: Bearer <token>"
--   scope    the topics a token may write: topic names, or '*' for every topic

CREATE TABLE wal_delivery.ingest_tokens (
    name text PRIMARY KEY,
    token_sha256 bytea NOT NULL UNIQUE,
    topics text[] NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz,
    CHECK (octet_length(token_sha256) = 32)
);

-- A token's name is shown in logs and metrics; its scope names topics or '*'.
CREATE FUNCTION wal_delivery.check_ingest_token() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.name !~ '^[A-Za-z0-9._-]{1,100}$' THEN
        RAISE EXCEPTION 'ingest token name % is not allowed', to_jsonb(left(NEW.name, 120))
            USING ERRCODE = 'invalid_name', HINT = 'A token name is 1 to 100 letters, digits, ".", "_" or "-".';
    END IF;
    IF array_ndims(NEW.topics) > 1 OR array_position(NEW.topics, NULL) IS NOT NULL
       OR EXISTS (SELECT 1 FROM unnest(NEW.topics) t WHERE t <> '*' AND t !~ '^[A-Za-z0-9._-]{1,249}$') THEN
        RAISE EXCEPTION 'topics of ingest token "%" must be topic names or ''*''', NEW.name
            USING ERRCODE = 'check_violation', HINT = 'For example ARRAY[''orders.events''], or ARRAY[''*''] for every topic.';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER check_ingest_token BEFORE INSERT OR UPDATE ON wal_delivery.ingest_tokens
    FOR EACH ROW EXECUTE FUNCTION wal_delivery.check_ingest_token();
CREATE TRIGGER bump_config_version AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON wal_delivery.ingest_tokens
    FOR EACH STATEMENT EXECUTE FUNCTION wal_delivery.bump_config_version();

SELECT pg_catalog.pg_extension_config_dump('wal_delivery.ingest_tokens', '');

-- Creates a token for p_topics and returns it; only its hash is kept, so this is the one
-- time it can be read. Revoke with UPDATE ... SET revoked_at = now().
CREATE FUNCTION wal_delivery.create_ingest_token(p_name text, p_topics text[]) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    -- Two v4 UUIDs: 244 random bits from the server's strong random source.
    v_token text := 'wdi_' || replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '');
BEGIN
    INSERT INTO wal_delivery.ingest_tokens (name, token_sha256, topics)
    VALUES (p_name, sha256(convert_to(v_token, 'UTF8')), p_topics);
    RETURN v_token;
END $$;

-- What `wal-worker ingest` loads: the versions, Kafka's address, each topic's acks, record
-- limit and whether it needs processing, and the live tokens' hashes and scopes. Shaped
-- like worker_config() (no destinations) so the workers' config machinery reads both.
CREATE FUNCTION wal_delivery.ingest_config() RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT jsonb_build_object(
        'version', v.version,
        'published_version', v.published_version,
        'settings', jsonb_build_object(
            'kafka_bootstrap_servers', s.kafka_bootstrap_servers,
            'retry_topic_prefix', s.retry_topic_prefix,
            'dlq_topic', s.dlq_topic),
        'destinations', '[]'::jsonb,
        'topics', coalesce((
            SELECT jsonb_agg(jsonb_build_object(
                'name', t.name, 'acks', t.acks,
                'record_limit', wal_delivery.record_limit(t.max_payload_bytes),
                'needs_processing', t.processor IS NOT NULL,
                -- The ingest login's right to write it (topics.writers); the outbox door
                -- refuses a login that may not, and the service sends such a topic's
                -- records there, so the same rule answers on both paths.
                'writable', t.writers IS NULL OR EXISTS (
                    SELECT 1 FROM unnest(t.writers) w WHERE pg_has_role(session_user, w, 'MEMBER'))) ORDER BY t.name)
              FROM wal_delivery.topics t), '[]'),
        'tokens', coalesce((
            SELECT jsonb_agg(jsonb_build_object(
                'name', k.name, 'sha256', encode(k.token_sha256, 'hex'), 'topics', to_jsonb(k.topics))
                ORDER BY k.name)
              FROM wal_delivery.ingest_tokens k WHERE k.revoked_at IS NULL), '[]'))
      FROM wal_delivery.config_version v, wal_delivery.settings s
$$;

-- The ingest service's door to the outbox: wal_enqueue_batch with the content type the
-- HTTP request gave, so a record reads the same whichever path it took. The same checks
-- as every wal_enqueue*, and the contract's rule for the content type.
CREATE FUNCTION wal_delivery.ingest_enqueue_batch(
    p_topic text, p_content_type text, p_payloads bytea[],
    p_idempotency_keys text[], p_keys text[], p_headers jsonb[])
RETURNS bigint[]
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM wal_delivery.check_content_type(p_content_type);
    RETURN wal_delivery.enqueue_payload_batch(p_topic, p_payloads, p_content_type,
                                              p_idempotency_keys, p_keys, p_headers);
END $$;
