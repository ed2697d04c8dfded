-- Enqueue: the one way records enter the outbox. Applications call wal_enqueue or
-- wal_enqueue_batch inside their own transactions; the record exists only if the
-- transaction commits, and the relay is woken at commit (never for a rollback).

-- The role that called wal_enqueue, not the owner its SECURITY DEFINER runs as.
CREATE FUNCTION wal_delivery.invoking_role() RETURNS oid
LANGUAGE c STABLE AS 'MODULE_PATHNAME', 'wal_delivery_invoking_role';

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
    IF p_headers IS NOT NULL AND NOT wal_delivery.is_string_map(p_headers) THEN
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
        OR octet_length(p_keys[i]) > 1024
        OR (p_headers[i] IS NOT NULL AND NOT wal_delivery.is_string_map(p_headers[i])) LIMIT 1;
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

    -- One unique-index probe per key: a join here got a cached generic plan that scanned
    -- the whole outbox once it had grown (bench/enqueue).
    SELECT array_agg(o.id ORDER BY k.i) INTO v_ids
      FROM unnest(v_keys) WITH ORDINALITY AS k(key, i)
      LEFT JOIN LATERAL (SELECT x.id FROM wal_delivery.outbox x
                          WHERE x.topic = p_topic AND x.idempotency_key = k.key) o ON true;
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
