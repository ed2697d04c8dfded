-- Dead letters: records that will not be delivered without help, one row each, for
-- on-call to inspect, replay or resolve. They come from three places (origin):
--   processing  a processor failed on the row's last attempt (processing.sql)
--   relay       the row can never be shipped to Kafka (relay.sql)
--   delivery    a destination refused the record for good, or the retry steps ran out;
--               `wal-worker dlq` copies each message of the DLQ topic here exactly once
--               (its Kafka position is unique) and raises an alert for each new entry
-- Unresolved entries older than settings.dead_letter_archive_after go to S3 (archive.sql).

-- Columns keep the order in which they were added before 1.0 (SELECT * and the archive
-- entries show them so).
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
    resolution text,
    kafka_topic text,                      -- the DLQ message it was ingested from
    kafka_partition integer,
    kafka_offset bigint,
    alerted_at timestamptz,                -- the alert went out (at least once)
    replay_requested_at timestamptz,       -- on-call asked for a replay; the dlq worker does it
    replays integer NOT NULL DEFAULT 0,
    archived_at timestamptz,               -- S3 confirmed the object holding it (archive_keeps_rows)
    archive_object text,                   -- that object's key
    restored_at timestamptz,               -- read back from an archive; ages again from here
    CONSTRAINT dead_letters_archived_with_object CHECK ((archived_at IS NULL) = (archive_object IS NULL))
);
-- What on-call looks for: unresolved entries, by age and by destination.
CREATE INDEX dead_letters_unresolved ON wal_delivery.dead_letters (failed_at) WHERE resolved_at IS NULL;
-- On-call's lists page newest first by id (keyset: `id < last seen`), never by OFFSET, so
-- a deep page costs what the first does; filtered by destination or topic, these indexes
-- hold the rows in that order.
CREATE INDEX dead_letters_destination ON wal_delivery.dead_letters (destination, id) WHERE resolved_at IS NULL;
CREATE INDEX dead_letters_topic ON wal_delivery.dead_letters (topic, id) WHERE resolved_at IS NULL;
-- Searching by a record's idempotency key (what an application's log names).
CREATE INDEX dead_letters_idempotency_key ON wal_delivery.dead_letters (idempotency_key);
-- Dead letters per hour and topic (the console's chart, topic_status), read from the index
-- alone once vacuum has marked the pages all-visible.
CREATE INDEX dead_letters_failed_at ON wal_delivery.dead_letters (failed_at) INCLUDE (topic);
-- A DLQ message is ingested once: its Kafka position is unique.
CREATE UNIQUE INDEX dead_letters_kafka_position
    ON wal_delivery.dead_letters (kafka_topic, kafka_partition, kafka_offset)
    WHERE kafka_offset IS NOT NULL;
-- A record's copy for a destination is dead once until on-call acts on it: a consumer that
-- delivers again after a rebalance or a crash (at least once) hands the same failure to
-- the DLQ again, at another position. Resolved rows and those being replayed are out of
-- the index, so a failure after them is a new dead letter; so are rows read back from
-- an archive, which a restore brings back whatever came in meanwhile.
CREATE UNIQUE INDEX dead_letters_open_failure
    ON wal_delivery.dead_letters (destination, topic, idempotency_key)
    WHERE origin = 'delivery' AND resolved_at IS NULL AND replay_requested_at IS NULL
      AND restored_at IS NULL AND destination IS NOT NULL AND idempotency_key <> '';
-- Each of the routines of the same names scans only the rows it can take.
CREATE INDEX dead_letters_to_alert ON wal_delivery.dead_letters (id) WHERE alerted_at IS NULL;
CREATE INDEX dead_letters_to_replay ON wal_delivery.dead_letters (id)
    WHERE replay_requested_at IS NOT NULL AND resolved_at IS NULL;
CREATE INDEX dead_letters_to_archive ON wal_delivery.dead_letters (id)
    WHERE resolved_at IS NULL AND archived_at IS NULL;

------------------------------------------------------------------------------ arriving

-- Moves an outbox row to dead and records it in dead_letters (caller holds the row).
CREATE FUNCTION wal_delivery.bury_row(p_id bigint, p_origin text, p_error text) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO wal_delivery.dead_letters (origin, topic, idempotency_key, outbox_id, message_key,
                                           headers, content_type, payload, attempts, last_error)
    SELECT p_origin, topic, idempotency_key, id, message_key, headers, content_type, payload,
           attempts, p_error
      FROM wal_delivery.outbox_rows WHERE id = p_id;
    UPDATE wal_delivery.outbox_rows
       SET state = 'dead', last_error = p_error, finished_at = clock_timestamp(), lease_until = NULL
     WHERE id = p_id;
$$;

-- One DLQ message into dead_letters; NULL when that Kafka position was ingested before
-- (a redelivery after a crash) or the same failure is already open (the same record's
-- copy for the same destination, handed off again), so the caller raises no second alert. p_headers holds
-- every Kafka header of the message as the worker read it (bytes that are not UTF-8
-- escaped), so a field the worker could not take as is (a number out of range, say)
-- is still there for on-call.
CREATE FUNCTION wal_delivery.ingest_dead_letter(
    p_kafka_topic text, p_kafka_partition integer, p_kafka_offset bigint,
    p_topic text, p_idempotency_key text, p_destination text, p_outbox_id bigint,
    p_content_type text, p_payload bytea, p_attempts integer, p_last_error text,
    p_headers jsonb)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_id bigint;
BEGIN
    INSERT INTO wal_delivery.dead_letters (origin, topic, idempotency_key, destination, outbox_id,
                                           headers, content_type, payload, attempts, last_error,
                                           kafka_topic, kafka_partition, kafka_offset)
    VALUES ('delivery', coalesce(p_topic, p_kafka_topic), coalesce(p_idempotency_key, ''),
            p_destination, p_outbox_id, p_headers, p_content_type, coalesce(p_payload, ''::bytea),
            coalesce(p_attempts, 0), coalesce(p_last_error, 'no reason given'),
            p_kafka_topic, p_kafka_partition, p_kafka_offset)
    ON CONFLICT DO NOTHING
    RETURNING id INTO v_id;
    RETURN v_id;
END $$;

------------------------------------------------------------------------------ alerts

-- Dead letters whose alert has not gone out yet, oldest first. Alerts go out at least
-- once, also for entries the database wrote itself (processing, relay).
CREATE FUNCTION wal_delivery.dead_letters_to_alert(p_max_rows integer DEFAULT 100)
RETURNS TABLE (id bigint, origin text, topic text, idempotency_key text, destination text,
               last_error text, traceparent text)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT id, origin, topic, idempotency_key, destination, last_error, headers->>'traceparent'
      FROM wal_delivery.dead_letters WHERE alerted_at IS NULL ORDER BY id LIMIT p_max_rows;
$$;

-- The alert for p_id went out.
CREATE FUNCTION wal_delivery.mark_dead_letter_alerted(p_id bigint) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    UPDATE wal_delivery.dead_letters SET alerted_at = now() WHERE id = p_id AND alerted_at IS NULL;
$$;

------------------------------------------------------------------------------ on-call

-- On-call sees which unresolved entries are already safe in S3 (archive_keeps_rows) and
-- which are being replayed.
CREATE VIEW wal_delivery.unresolved_dead_letters AS
SELECT id, origin, topic, destination, idempotency_key, outbox_id, attempts, last_error,
       failed_at, now() - failed_at AS age, replay_requested_at, archived_at, archive_object
  FROM wal_delivery.dead_letters
 WHERE resolved_at IS NULL;

-- Everything about one entry, the payload as text when it is UTF-8 (else base64).
CREATE FUNCTION wal_delivery.inspect_dead_letter(p_id bigint) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r wal_delivery.dead_letters;
    v_payload text;
    v_encoding text := 'utf8';
BEGIN
    SELECT * INTO r FROM wal_delivery.dead_letters WHERE id = p_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'dead letter % does not exist', p_id USING ERRCODE = 'undefined_object';
    END IF;
    BEGIN
        v_payload := convert_from(r.payload, 'UTF8');
    EXCEPTION WHEN character_not_in_repertoire OR untranslatable_character THEN
        v_payload := encode(r.payload, 'base64');
        v_encoding := 'base64';
    END;
    RETURN to_jsonb(r) - 'payload' || jsonb_build_object('payload', v_payload, 'payload_encoding', v_encoding);
END $$;

-- Replays one entry to where it failed: a delivery failure goes back to its destination
-- through retry step 1 (the dlq worker writes it to Kafka, then resolves the entry); a
-- processing or relay failure puts its outbox row back to pending with fresh attempts.
-- Unaudited: the replay functions below call it and write one audit entry per action.
CREATE FUNCTION wal_delivery.requeue_dead_letter(p_id bigint) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r wal_delivery.dead_letters;
BEGIN
    SELECT * INTO r FROM wal_delivery.dead_letters WHERE id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'dead letter % does not exist', p_id
            USING ERRCODE = 'undefined_object', HINT = 'See wal_delivery.unresolved_dead_letters.';
    ELSIF r.resolved_at IS NOT NULL THEN
        RAISE EXCEPTION 'dead letter % was resolved at % (%)', p_id, r.resolved_at, r.resolution
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Only unresolved dead letters are replayed.';
    END IF;
    IF r.origin = 'delivery' AND r.headers->>'payload-omitted' = 'true' THEN
        -- Handed over by reference because Kafka refused the whole copy as too large: a
        -- replay through the retry steps would be refused the same way.
        RAISE EXCEPTION 'dead letter % cannot be replayed: its payload was too large for a retry step and is not stored here', p_id
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = format('The record is outbox row %s and in Kafka at %s partition %s offset %s. '
                                'Deliver it another way, then resolve the entry with wal_delivery.resolve_dead_letter.',
                                coalesce(r.outbox_id::text, '(none)'), coalesce(r.headers->>'source-topic', r.topic),
                                coalesce(r.headers->>'source-partition', '?'), coalesce(r.headers->>'source-offset', '?'));
    END IF;
    IF r.origin = 'delivery' THEN
        IF r.destination IS NULL OR NOT EXISTS (SELECT 1 FROM wal_delivery.destinations WHERE name = r.destination) THEN
            RAISE EXCEPTION 'dead letter % cannot be replayed: its destination "%" no longer exists', p_id, r.destination
                USING ERRCODE = 'undefined_object',
                      HINT = 'Recreate the destination, or resolve the entry with wal_delivery.resolve_dead_letter.';
        END IF;
        UPDATE wal_delivery.dead_letters SET replay_requested_at = now() WHERE id = p_id;
        PERFORM pg_notify('wal_delivery_replay', p_id::text);
        RETURN 'queued for retry step 1 of ' || r.destination;
    END IF;
    IF r.outbox_id IS NULL THEN
        RAISE EXCEPTION 'dead letter % cannot be replayed: it has no outbox row to put back', p_id
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Enqueue the payload again with wal_enqueue, then resolve the entry.';
    END IF;
    UPDATE wal_delivery.outbox_rows
       SET state = 'pending', attempts = 0, available_at = now(), last_error = NULL,
           finished_at = NULL, lease_until = NULL, processed_payload = NULL
     WHERE id = r.outbox_id AND state = 'dead';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'dead letter % cannot be replayed: outbox row % is gone or no longer dead', p_id, r.outbox_id
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Enqueue the payload again with wal_enqueue, then resolve the entry.';
    END IF;
    UPDATE wal_delivery.dead_letters
       SET resolved_at = now(), resolution = 'replayed: outbox row back to pending', replays = replays + 1
     WHERE id = p_id;
    RETURN 'outbox row ' || r.outbox_id || ' back to pending';
END $$;

-- Replays one entry (above), audited.
CREATE FUNCTION wal_delivery.replay_dead_letter(p_id bigint) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_outcome text := wal_delivery.requeue_dead_letter(p_id);
BEGIN
    PERFORM wal_delivery.write_audit('replay',
        (SELECT jsonb_build_object('id', id, 'topic', topic, 'destination', destination)
           FROM wal_delivery.dead_letters WHERE id = p_id), 1);
    RETURN v_outcome;
END $$;

-- Replays every unresolved entry matching the filters (NULL matches all); returns how many.
CREATE FUNCTION wal_delivery.replay_dead_letters(p_destination text DEFAULT NULL, p_topic text DEFAULT NULL,
                                                 p_failed_after timestamptz DEFAULT NULL,
                                                 p_failed_before timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_id bigint;
    n integer := 0;
BEGIN
    FOR v_id IN
        SELECT id FROM wal_delivery.dead_letters
         WHERE resolved_at IS NULL AND replay_requested_at IS NULL
           AND coalesce(headers->>'payload-omitted', '') <> 'true'  -- only one by one, refused with why
           AND (p_destination IS NULL OR destination = p_destination)
           AND (p_topic IS NULL OR topic = p_topic)
           AND (p_failed_after IS NULL OR failed_at >= p_failed_after)
           AND (p_failed_before IS NULL OR failed_at < p_failed_before)
         ORDER BY id
    LOOP
        PERFORM wal_delivery.requeue_dead_letter(v_id);
        n := n + 1;
    END LOOP;
    PERFORM wal_delivery.write_audit('replay',
        jsonb_strip_nulls(jsonb_build_object('destination', p_destination, 'topic', p_topic,
                                             'failed_after', p_failed_after, 'failed_before', p_failed_before)), n);
    RETURN n;
END $$;

-- Replays the listed entries that can be (unresolved, not already being replayed); the
-- others are skipped, and the count says how many were not. Returns how many replayed.
CREATE FUNCTION wal_delivery.replay_dead_letters_by_id(p_ids bigint[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_id bigint;
    n integer := 0;
BEGIN
    IF p_ids IS NULL OR cardinality(p_ids) = 0 THEN
        RAISE EXCEPTION 'replay_dead_letters_by_id needs at least one dead letter id'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    FOR v_id IN
        SELECT id FROM wal_delivery.dead_letters
         WHERE id = ANY (p_ids) AND resolved_at IS NULL AND replay_requested_at IS NULL
         ORDER BY id
    LOOP
        PERFORM wal_delivery.requeue_dead_letter(v_id);
        n := n + 1;
    END LOOP;
    PERFORM wal_delivery.write_audit('replay', jsonb_build_object('ids', to_jsonb(p_ids)), n);
    RETURN n;
END $$;

-- For the dlq worker: delivery entries waiting to be written back to retry step 1, with
-- the record's trace context (the headers the hand-off to the DLQ kept) for the replay.
CREATE FUNCTION wal_delivery.dead_letters_to_replay(p_max_rows integer DEFAULT 100)
RETURNS TABLE (id bigint, topic text, idempotency_key text, destination text, outbox_id bigint,
               content_type text, payload bytea, kafka_topic text, kafka_partition integer,
               kafka_offset bigint, traceparent text, tracestate text)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT id, topic, idempotency_key, destination, outbox_id, content_type, payload,
           kafka_topic, kafka_partition, kafka_offset,
           headers->>'traceparent', headers->>'tracestate'
      FROM wal_delivery.dead_letters
     WHERE replay_requested_at IS NOT NULL AND resolved_at IS NULL
     ORDER BY id LIMIT p_max_rows;
$$;

-- Kafka acknowledged the replay's write to retry step 1.
CREATE FUNCTION wal_delivery.complete_replay(p_id bigint) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    UPDATE wal_delivery.dead_letters
       SET resolved_at = now(), resolution = 'replayed through retry step 1',
           replay_requested_at = NULL, replays = replays + 1
     WHERE id = p_id AND resolved_at IS NULL;
$$;

-- Closes an entry on-call has dealt with; the note says how.
CREATE FUNCTION wal_delivery.resolve_dead_letter(p_id bigint, p_note text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF coalesce(btrim(p_note), '') = '' THEN
        RAISE EXCEPTION 'resolving dead letter % needs a note saying how it was handled', p_id
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    UPDATE wal_delivery.dead_letters
       SET resolved_at = now(), resolution = p_note, replay_requested_at = NULL
     WHERE id = p_id AND resolved_at IS NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'dead letter % does not exist or is already resolved', p_id
            USING ERRCODE = 'undefined_object', HINT = 'See wal_delivery.unresolved_dead_letters.';
    END IF;
    PERFORM wal_delivery.write_audit('resolve',
        (SELECT jsonb_build_object('id', id, 'topic', topic, 'destination', destination, 'note', p_note)
           FROM wal_delivery.dead_letters WHERE id = p_id), 1);
END $$;

-- Closes every unresolved entry matching the filters (NULL matches all) with one note;
-- returns how many.
CREATE FUNCTION wal_delivery.resolve_dead_letters(p_note text, p_destination text DEFAULT NULL,
                                                  p_topic text DEFAULT NULL,
                                                  p_failed_before timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
BEGIN
    IF coalesce(btrim(p_note), '') = '' THEN
        RAISE EXCEPTION 'resolving dead letters needs a note saying how they were handled'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    UPDATE wal_delivery.dead_letters
       SET resolved_at = now(), resolution = p_note, replay_requested_at = NULL
     WHERE resolved_at IS NULL
       AND (p_destination IS NULL OR destination = p_destination)
       AND (p_topic IS NULL OR topic = p_topic)
       AND (p_failed_before IS NULL OR failed_at < p_failed_before);
    GET DIAGNOSTICS n = ROW_COUNT;
    PERFORM wal_delivery.write_audit('resolve',
        jsonb_strip_nulls(jsonb_build_object('destination', p_destination, 'topic', p_topic,
                                             'failed_before', p_failed_before, 'note', p_note)), n);
    RETURN n;
END $$;

-- Closes the listed entries that are still unresolved with one note; returns how many.
CREATE FUNCTION wal_delivery.resolve_dead_letters_by_id(p_ids bigint[], p_note text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
BEGIN
    IF coalesce(btrim(p_note), '') = '' THEN
        RAISE EXCEPTION 'resolving dead letters needs a note saying how they were handled'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF p_ids IS NULL OR cardinality(p_ids) = 0 THEN
        RAISE EXCEPTION 'resolve_dead_letters_by_id needs at least one dead letter id'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    UPDATE wal_delivery.dead_letters
       SET resolved_at = now(), resolution = p_note, replay_requested_at = NULL
     WHERE id = ANY (p_ids) AND resolved_at IS NULL;
    GET DIAGNOSTICS n = ROW_COUNT;
    PERFORM wal_delivery.write_audit('resolve', jsonb_build_object('ids', to_jsonb(p_ids), 'note', p_note), n);
    RETURN n;
END $$;
