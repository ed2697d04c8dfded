-- Enqueue: the one way records enter the outbox. Applications call wal_enqueue or
-- wal_enqueue_batch inside their own transactions; the record exists only if the
-- transaction commits, and the relay is woken at commit (never for a rollback).
--
-- Words used below:
--   the door      the six wal_enqueue* overloads: the only routines here a writer may
--                 execute (roles.sql). They run as their caller; what they call runs
--                 as the extension's owner with a pinned search_path (see "The door"
--                 below), so the internal routines need neither.
--   record size   what a record puts into its Kafka message besides the relay's own
--                 headers: payload + idempotency key (a generated one is 36 bytes) +
--                 message key + every header's name and value, in bytes.
--   record limit  the largest record size a topic takes (record_limit).
--
-- The rules a record must meet are in check_record, for both wal_enqueue and each record
-- of wal_enqueue_batch; docs/operations.md ("Errors from enqueue") lists them with their
-- SQLSTATEs.

-- Enqueue keeps the topics and the current generation per backend (src/ext/enqueue_cache.c);
-- a change to either table makes every backend forget them, as a catalog change would:
-- each enqueue sees what had committed when it began, and its own transaction's changes.
CREATE FUNCTION wal_delivery.forget_enqueue_cache() RETURNS trigger
LANGUAGE c AS 'MODULE_PATHNAME', 'wal_delivery_forget_enqueue_cache';
CREATE TRIGGER forget_enqueue_cache AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON wal_delivery.topics
    FOR EACH STATEMENT EXECUTE FUNCTION wal_delivery.forget_enqueue_cache();
CREATE TRIGGER forget_enqueue_cache AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON wal_delivery.outbox_generations
    FOR EACH STATEMENT EXECUTE FUNCTION wal_delivery.forget_enqueue_cache();

-- The role that called wal_enqueue (as SET ROLE left it), not the owner that the door's
-- SQL path and the SECURITY DEFINER functions run as.
CREATE FUNCTION wal_delivery.invoking_role() RETURNS oid
LANGUAGE c STABLE AS 'MODULE_PATHNAME', 'wal_delivery_invoking_role';

-- The rules of a record (allowed bytes, sizes, reserved header names) have one
-- implementation, src/shared/record_contract.c, which the ingest service, the relay and
-- the workers' hand-offs use too; these functions are SQL's view of it.

-- The header names the relay and the workers' hand-offs write themselves, so a record
-- may not bring them (a destination or a worker would take the record's value for theirs).
CREATE FUNCTION wal_delivery.reserved_header_names() RETURNS text[]
LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', 'wal_delivery_reserved_header_names';

-- The record limit of a topic. Every copy of a record must fit under Kafka's message limit:
-- librdkafka's message.max.bytes (1000000 by default) or more, and at least the topic's
-- max_payload_bytes (admins raise Kafka's limits first). A hand-off to a retry step or the
-- DLQ adds about a dozen headers (an error text, the destination's name, the topic, the key
-- twice), so 16384 bytes of that limit stay free for them: a record accepted here can always
-- be handed off, instead of wedging its partition.
CREATE FUNCTION wal_delivery.record_limit(max_payload_bytes integer) RETURNS integer
LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', 'wal_delivery_record_limit';

-- Raises the error for a topic that enqueue cannot use: NULL, empty or unknown.
CREATE FUNCTION wal_delivery.refuse_topic(p_topic text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_topic IS NULL OR p_topic = '' THEN
        RAISE EXCEPTION 'topic must not be %', CASE WHEN p_topic IS NULL THEN 'NULL' ELSE 'empty' END
            USING ERRCODE = 'null_value_not_allowed', HINT = 'Pass the name of a row in wal_delivery.topics.';
    END IF;
    RAISE EXCEPTION 'topic "%" does not exist', p_topic
        USING ERRCODE = 'undefined_object',
              HINT = format('Check the spelling, or ask an admin to create it: INSERT INTO wal_delivery.topics (name) VALUES (%L).', p_topic);
END $$;

-- Refuses a record that breaks a rule of the contract, with the SQLSTATE docs/operations.md gives
-- for it; returns nothing. p_position is the record's place in a batch (1 = first), NULL for
-- wal_enqueue. p_idempotency_key is the key the record will have (a generated one for NULL).
CREATE FUNCTION wal_delivery.check_record(
    p_topic text, p_max_payload_bytes integer, p_position integer, p_payload bytea,
    p_idempotency_key text, p_key text, p_headers jsonb)
RETURNS void
LANGUAGE c STABLE AS 'MODULE_PATHNAME', 'wal_delivery_check_record';

-- Refuses a content type the contract does not take (the ingest service's door).
CREATE FUNCTION wal_delivery.check_content_type(p_content_type text) RETURNS void
LANGUAGE c STABLE AS 'MODULE_PATHNAME', 'wal_delivery_check_content_type';

-- Refuses an array argument of wal_enqueue_batch with more than one dimension: its
-- elements would otherwise be flattened, or silently read as NULL.
CREATE FUNCTION wal_delivery.check_batch_array(p_name text, p_ndims integer) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_ndims > 1 THEN
        RAISE EXCEPTION '% must be a one-dimensional array, got % dimensions', p_name, p_ndims
            USING ERRCODE = 'array_subscript_error', HINT = 'Pass ARRAY[...] with one element per record.';
    END IF;
END $$;

-- A batch's text payloads (jsonb payloads cast to text) as UTF-8 bytes, in order.
CREATE FUNCTION wal_delivery.utf8_payloads(p_payloads text[]) RETURNS bytea[]
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM wal_delivery.check_batch_array('payloads', array_ndims(p_payloads));
    IF p_payloads IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN ARRAY(SELECT convert_to(p, 'UTF8') FROM unnest(p_payloads) WITH ORDINALITY AS u(p, i) ORDER BY i);
END $$;

-- The id of the record of p_topic with idempotency key p_key, wherever it is: the row
-- table, or any live generation of the log (a topic may have had a processor before). In
-- the log only the records with a caller's key are looked at (its dedupe index holds no
-- other): a generated key is a random UUID no caller repeats by chance.
CREATE FUNCTION wal_delivery.existing_record_id(p_topic text, p_key text) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT id FROM (SELECT id FROM wal_delivery.outbox_rows WHERE topic = p_topic AND idempotency_key = p_key
                    UNION ALL
                    SELECT id FROM wal_delivery.outbox_log
                     WHERE gen IN (0, 1, 2) AND topic = p_topic AND idempotency_key = p_key AND caller_key) x
     LIMIT 1
$$;

-- The generation new log records go to.
CREATE FUNCTION wal_delivery.current_generation() RETURNS smallint
LANGUAGE sql STABLE AS $$
    SELECT gen FROM wal_delivery.outbox_generations WHERE sealed_at IS NULL
$$;

-- A record's headers as repeat_of compares them: without traceparent and tracestate (in
-- any case), and no headers the same as '{}'. The trace context says which transaction
-- sent a record, not what the record is: an app that retries in a new span sends the same
-- record again.
CREATE FUNCTION wal_delivery.headers_but_trace(p_headers jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN jsonb_typeof(p_headers) = 'object'
                THEN coalesce((SELECT jsonb_object_agg(key, value) FROM jsonb_each(p_headers)
                                WHERE lower(key) NOT IN ('traceparent', 'tracestate')), '{}')
                ELSE coalesce(p_headers, '{}') END
$$;

-- The id of the record of p_topic with idempotency key p_key, or NULL when there is none,
-- once it is sure that record is the one given: a key names one record. A repeat with the
-- same payload, content type, message key and headers (headers_but_trace) is a retry (the first enqueue wins,
-- this one writes nothing); with anything else it is another record, which would be lost
-- silently if it got the first one's id: 23W01 (an integrity violation of wal_delivery's).
CREATE FUNCTION wal_delivery.repeat_of(p_topic text, p_key text, p_payload bytea, p_content_type text,
                                       p_message_key text, p_headers jsonb)
RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    r record;
    differs text[];
BEGIN
    SELECT * INTO r
      FROM (SELECT id, payload, content_type, message_key, headers FROM wal_delivery.outbox_rows
             WHERE topic = p_topic AND idempotency_key = p_key
            UNION ALL
            SELECT id, payload, content_type, message_key, headers FROM wal_delivery.outbox_log
             WHERE gen IN (0, 1, 2) AND topic = p_topic AND idempotency_key = p_key AND caller_key) x
     LIMIT 1;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    differs := array_remove(ARRAY[
        CASE WHEN r.payload IS DISTINCT FROM p_payload THEN 'payload' END,
        CASE WHEN r.content_type IS DISTINCT FROM p_content_type THEN 'content type' END,
        CASE WHEN r.message_key IS DISTINCT FROM p_message_key THEN 'message key' END,
        CASE WHEN wal_delivery.headers_but_trace(r.headers) IS DISTINCT FROM wal_delivery.headers_but_trace(p_headers)
             THEN 'headers' END], NULL);
    IF differs <> '{}' THEN
        RAISE EXCEPTION 'idempotency key "%" of topic "%" was already used for a different record (its %)',
                        p_key, p_topic, array_to_string(differs, ', ')
            USING ERRCODE = '23W01',
                  HINT = 'A key names one record: send the same record again to retry it, or give a new record a new key.';
    END IF;
    RETURN r.id;
END $$;

-- The id of a record whose key was repeated (see repeat_of). Raises when the first is not
-- visible (a concurrent transaction committed it after this one's snapshot).
CREATE FUNCTION wal_delivery.repeated_key_id(p_topic text, p_key text, p_payload bytea, p_content_type text,
                                             p_message_key text, p_headers jsonb)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint := wal_delivery.repeat_of(p_topic, p_key, p_payload, p_content_type, p_message_key, p_headers);
BEGIN
    IF v_id IS NULL THEN
        RAISE EXCEPTION 'idempotency key "%" of topic "%" was enqueued by a transaction this snapshot cannot see', p_key, p_topic
            USING ERRCODE = 'serialization_failure', HINT = 'Retry the transaction.';
    END IF;
    RETURN v_id;
END $$;

-- Refuses the calling role a topic whose writers list does not name it (or a role it is a
-- member of). NULL writers: any writer.
CREATE FUNCTION wal_delivery.check_topic_writer(p_topic text, p_writers regrole[]) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_writers IS NOT NULL AND NOT EXISTS (
           SELECT 1 FROM unnest(p_writers) w WHERE pg_has_role(wal_delivery.invoking_role(), w, 'MEMBER')) THEN
        RAISE EXCEPTION 'role "%" may not write topic "%"', wal_delivery.invoking_role()::regrole, p_topic
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'The topic''s writers (wal_delivery.topics.writers) list the roles that may; an admin can add yours.';
    END IF;
END $$;

-- The one place a record enters the outbox; the wal_enqueue overloads call it. A record of
-- a topic with a processor goes to the row table (it has a state machine to run); any
-- other to the log, where it costs its insert and nothing after. A key the caller gave
-- is looked up in every live generation first (the log's unique index covers one); a
-- generated key is new by construction.
CREATE FUNCTION wal_delivery.enqueue_payload(
    p_topic text, p_payload bytea, p_content_type text,
    p_idempotency_key text, p_key text, p_headers jsonb)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    t record;
    v_key text := coalesce(p_idempotency_key, gen_random_uuid()::text);
    v_id bigint;
BEGIN
    SELECT max_payload_bytes, processor IS NOT NULL AS needs_processing, writers INTO t
      FROM wal_delivery.topics WHERE name = p_topic;
    IF NOT FOUND THEN
        PERFORM wal_delivery.refuse_topic(p_topic);
    END IF;
    PERFORM wal_delivery.check_topic_writer(p_topic, t.writers);
    PERFORM wal_delivery.check_record(p_topic, t.max_payload_bytes, NULL, p_payload, v_key, p_key, p_headers);

    IF p_idempotency_key IS NOT NULL THEN
        v_id := wal_delivery.repeat_of(p_topic, v_key, p_payload, p_content_type, p_key, p_headers);
        IF v_id IS NOT NULL THEN
            RETURN v_id;
        END IF;
    END IF;
    IF t.needs_processing THEN
        INSERT INTO wal_delivery.outbox_rows (topic, idempotency_key, needs_processing, message_key, headers,
                                              content_type, payload, enqueued_by, enqueued_by_session)
        VALUES (p_topic, v_key, true, p_key, p_headers, p_content_type, p_payload,
                wal_delivery.invoking_role(), quote_ident(session_user)::regrole::oid)
        ON CONFLICT (topic, idempotency_key) DO NOTHING
        RETURNING id INTO v_id;
    ELSIF p_idempotency_key IS NULL THEN
        -- A generated key cannot be taken: a plain insert, without the speculative
        -- insertion ON CONFLICT needs (its confirmation is 48 bytes of WAL a record), and
        -- no entry in the dedupe index.
        v_id := nextval('wal_delivery.outbox_ids');
        INSERT INTO wal_delivery.outbox_log (gen, lane, caller_key, id, enqueued_by, enqueued_by_session, topic,
                                             idempotency_key, message_key, content_type, headers, payload)
        VALUES (wal_delivery.current_generation(), wal_delivery.log_lane(v_id), false, v_id, wal_delivery.invoking_role(),
                quote_ident(session_user)::regrole::oid, p_topic, v_key, p_key, p_content_type, p_headers, p_payload);
    ELSE
        v_id := nextval('wal_delivery.outbox_ids');
        INSERT INTO wal_delivery.outbox_log (gen, lane, caller_key, id, enqueued_by, enqueued_by_session, topic,
                                             idempotency_key, message_key, content_type, headers, payload)
        VALUES (wal_delivery.current_generation(), wal_delivery.log_lane(v_id), true, v_id, wal_delivery.invoking_role(),
                quote_ident(session_user)::regrole::oid, p_topic, v_key, p_key, p_content_type, p_headers, p_payload)
        ON CONFLICT (gen, topic, idempotency_key) WHERE caller_key DO NOTHING
        RETURNING id INTO v_id;
    END IF;

    IF v_id IS NULL THEN
        RETURN wal_delivery.repeated_key_id(p_topic, v_key, p_payload, p_content_type, p_key, p_headers);
    END IF;
    PERFORM wal_delivery.wake_relay_at_commit();
    RETURN v_id;
END $$;

-- The door. Apps call these unqualified, whatever their search_path, so they live in
-- pg_catalog. They are C (src/ext/enqueue.c): a record of a topic without a processor goes
-- into the log without a PL/pgSQL call or a query per lookup; everything else (a topic
-- with a processor, a record that may break a rule) is handed to enqueue_payload above,
-- which raises the rules' errors. They run as their caller: the C path reads and writes
-- the extension's relations by oid (no privilege is checked, no name resolved), and only
-- the SQL path switches to their owner with search_path pinned, as SECURITY DEFINER ...
-- SET search_path would (src/ext/enqueue_sql.c): the switch is a cost on every call
-- (bench/enqueue/instructions counts it).
CREATE FUNCTION pg_catalog.wal_enqueue(topic text, payload jsonb, idempotency_key text DEFAULT NULL,
                                       key text DEFAULT NULL, headers jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE c
AS 'MODULE_PATHNAME', 'wal_delivery_enqueue_jsonb';

CREATE FUNCTION pg_catalog.wal_enqueue(topic text, payload bytea, idempotency_key text DEFAULT NULL,
                                       key text DEFAULT NULL, headers jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE c
AS 'MODULE_PATHNAME', 'wal_delivery_enqueue_bytea';

CREATE FUNCTION pg_catalog.wal_enqueue(topic text, payload text, idempotency_key text DEFAULT NULL,
                                       key text DEFAULT NULL, headers jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE c
AS 'MODULE_PATHNAME', 'wal_delivery_enqueue_text';

-- Many records of one topic in one call. The arrays line up by position (the first
-- element of each, whatever its lower bound, is the first record's); idempotency keys,
-- message keys and headers may be NULL (all generated / none) or hold NULL elements.
-- Returns the ids in input order, the existing id where an idempotency key was seen
-- before. A bad record refuses the whole call, naming its position.
CREATE FUNCTION wal_delivery.enqueue_payload_batch(
    p_topic text, p_payloads bytea[], p_content_type text,
    p_idempotency_keys text[], p_keys text[], p_headers jsonb[])
RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    t record;
    r record;
    n integer := coalesce(cardinality(p_payloads), 0);
    v_keys text[];
    v_ids bigint[];
    v_new bigint[];
BEGIN
    -- The payloads first, as utf8_payloads checks them before this for jsonb and text.
    IF p_payloads IS NULL THEN
        RAISE EXCEPTION 'payloads must not be NULL'
            USING ERRCODE = 'null_value_not_allowed', HINT = 'Pass ARRAY[...] with one payload per record.';
    END IF;
    PERFORM wal_delivery.check_batch_array('payloads', array_ndims(p_payloads));
    SELECT max_payload_bytes, processor IS NOT NULL AS needs_processing, writers INTO t
      FROM wal_delivery.topics WHERE name = p_topic;
    IF NOT FOUND THEN
        PERFORM wal_delivery.refuse_topic(p_topic);
    END IF;
    PERFORM wal_delivery.check_topic_writer(p_topic, t.writers);
    PERFORM wal_delivery.check_batch_array('idempotency_keys', array_ndims(p_idempotency_keys));
    PERFORM wal_delivery.check_batch_array('keys', array_ndims(p_keys));
    PERFORM wal_delivery.check_batch_array('headers', array_ndims(p_headers));
    IF (p_idempotency_keys IS NOT NULL AND cardinality(p_idempotency_keys) <> n)
       OR (p_keys IS NOT NULL AND cardinality(p_keys) <> n)
       OR (p_headers IS NOT NULL AND cardinality(p_headers) <> n) THEN
        RAISE EXCEPTION 'idempotency_keys, keys and headers must be NULL or have one element per payload (% payloads)', n
            USING ERRCODE = 'array_subscript_error', HINT = 'Line the arrays up by position; use NULL elements where a record has none.';
    END IF;

    v_keys := ARRAY(SELECT coalesce(k, gen_random_uuid()::text)
                      FROM unnest(p_payloads, p_idempotency_keys) WITH ORDINALITY AS u(p, k, i) ORDER BY i);
    FOR r IN SELECT * FROM unnest(p_payloads, v_keys, p_keys, p_headers) WITH ORDINALITY AS u(payload, ikey, mkey, headers, i)
    LOOP
        PERFORM wal_delivery.check_record(p_topic, t.max_payload_bytes, r.i::integer, r.payload, r.ikey, r.mkey, r.headers);
    END LOOP;

    IF t.needs_processing THEN
        INSERT INTO wal_delivery.outbox_rows (topic, idempotency_key, needs_processing, message_key, headers,
                                              content_type, payload, enqueued_by, enqueued_by_session)
        SELECT p_topic, u.ikey, true, u.mkey, u.headers, p_content_type, u.payload,
               wal_delivery.invoking_role(), quote_ident(session_user)::regrole::oid
          FROM unnest(p_payloads, v_keys, p_keys, p_headers) WITH ORDINALITY AS u(payload, ikey, mkey, headers, i)
         WHERE p_idempotency_keys[array_lower(p_idempotency_keys, 1) + u.i - 1] IS NULL
            OR wal_delivery.existing_record_id(p_topic, u.ikey) IS NULL
         ORDER BY u.i
        ON CONFLICT (topic, idempotency_key) DO NOTHING;
        -- One unique-index probe per key and table: a join here got a cached generic plan
        -- that scanned the whole outbox once it had grown (bench/enqueue).
        -- The id each key names, once it is sure that is this record (repeat_of).
        v_ids := ARRAY(SELECT wal_delivery.repeat_of(p_topic, u.ikey, u.payload, p_content_type, u.mkey, u.headers)
                         FROM unnest(p_payloads, v_keys, p_keys, p_headers) WITH ORDINALITY AS u(payload, ikey, mkey, headers, i)
                        ORDER BY u.i);
    ELSE
        -- The ids first, in input order (nextval runs after the sort): a record with a
        -- generated key is known by its id alone (the dedupe index does not hold it), a
        -- caller's key that is already there gets none.
        v_new := ARRAY(SELECT CASE WHEN p_idempotency_keys[array_lower(p_idempotency_keys, 1) + k.i - 1] IS NULL
                                     OR wal_delivery.existing_record_id(p_topic, k.key) IS NULL
                                   THEN nextval('wal_delivery.outbox_ids') END
                         FROM unnest(v_keys) WITH ORDINALITY AS k(key, i) ORDER BY k.i);
        INSERT INTO wal_delivery.outbox_log (gen, lane, caller_key, id, enqueued_by, enqueued_by_session, topic,
                                             idempotency_key, message_key, content_type, headers, payload)
        SELECT wal_delivery.current_generation(), wal_delivery.log_lane(v_new[u.i]),
               p_idempotency_keys[array_lower(p_idempotency_keys, 1) + u.i - 1] IS NOT NULL, v_new[u.i],
               wal_delivery.invoking_role(), quote_ident(session_user)::regrole::oid, p_topic, u.ikey, u.mkey,
               p_content_type, u.headers, u.payload
          FROM unnest(p_payloads, v_keys, p_keys, p_headers) WITH ORDINALITY AS u(payload, ikey, mkey, headers, i)
         WHERE v_new[u.i] IS NOT NULL
         ORDER BY u.i
        ON CONFLICT (gen, topic, idempotency_key) WHERE caller_key DO NOTHING;
        -- A caller's key is looked up after the insert: the first of the batch's repeats
        -- of one key won, or a record before this call.
        -- of one key won, or a record before this call; repeat_of makes sure it is this one.
        v_ids := ARRAY(SELECT CASE WHEN p_idempotency_keys[array_lower(p_idempotency_keys, 1) + u.i - 1] IS NULL
                                   THEN v_new[u.i]
                                   ELSE wal_delivery.repeat_of(p_topic, u.ikey, u.payload, p_content_type, u.mkey, u.headers) END
                         FROM unnest(p_payloads, v_keys, p_keys, p_headers) WITH ORDINALITY AS u(payload, ikey, mkey, headers, i)
                        ORDER BY u.i);
    END IF;

    IF array_position(v_ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'an idempotency key of topic "%" was enqueued by a transaction this snapshot cannot see', p_topic
            USING ERRCODE = 'serialization_failure', HINT = 'Retry the transaction.';
    END IF;
    IF n > 0 THEN
        PERFORM wal_delivery.wake_relay_at_commit();
    END IF;
    RETURN coalesce(v_ids, '{}');
END $$;

-- The batch door, C as wal_enqueue is; its SQL path is enqueue_payload_batch on the
-- payloads converted as utf8_payloads does for jsonb and text.
CREATE FUNCTION pg_catalog.wal_enqueue_batch(topic text, payloads jsonb[], idempotency_keys text[] DEFAULT NULL,
                                             keys text[] DEFAULT NULL, headers jsonb[] DEFAULT NULL)
RETURNS bigint[]
LANGUAGE c
AS 'MODULE_PATHNAME', 'wal_delivery_enqueue_batch_jsonb';

CREATE FUNCTION pg_catalog.wal_enqueue_batch(topic text, payloads bytea[], idempotency_keys text[] DEFAULT NULL,
                                             keys text[] DEFAULT NULL, headers jsonb[] DEFAULT NULL)
RETURNS bigint[]
LANGUAGE c
AS 'MODULE_PATHNAME', 'wal_delivery_enqueue_batch_bytea';

CREATE FUNCTION pg_catalog.wal_enqueue_batch(topic text, payloads text[], idempotency_keys text[] DEFAULT NULL,
                                             keys text[] DEFAULT NULL, headers jsonb[] DEFAULT NULL)
RETURNS bigint[]
LANGUAGE c
AS 'MODULE_PATHNAME', 'wal_delivery_enqueue_batch_text';
