-- wal_delivery 0.6 -> 0.7: retries without making an outage worse. Shared per-destination
-- pause state with a probe lease, the operator view, dead-letter replay and resolve, and
-- at-least-once alerts for dead letters written by the database itself.
\echo Use "ALTER EXTENSION wal_delivery UPDATE TO '0.7'" to load this file. \quit

------------------------------------------------------------------------------ pausing

-- One shared pause state per destination, for every retry and main-consumer process.
-- A row exists once a destination was first paused; no row means "never paused".
CREATE TABLE wal_delivery.destination_pauses (
    destination text PRIMARY KEY
        REFERENCES wal_delivery.destinations ON DELETE CASCADE ON UPDATE CASCADE,
    paused boolean NOT NULL,
    since timestamptz NOT NULL DEFAULT now(),   -- when it last paused or resumed
    paused_step smallint,                       -- the retry step whose failures paused it
    reason text,                                -- the failure that paused it, or the last probe's
    next_probe_at timestamptz,                  -- while paused: when a probe may run
    probe_holder text,                          -- the process holding the probe lease
    probe_lease_until timestamptz,
    probes integer NOT NULL DEFAULT 0,          -- probes since it paused
    last_probe_at timestamptz,
    last_probe_outcome text
);

-- Counters per destination and retry step, reported by the retry process that owns the
-- step's partition for that destination.
CREATE TABLE wal_delivery.destination_step_stats (
    destination text NOT NULL
        REFERENCES wal_delivery.destinations ON DELETE CASCADE ON UPDATE CASCADE,
    step smallint NOT NULL CHECK (step BETWEEN 1 AND 3),
    consecutive_failures integer NOT NULL DEFAULT 0,
    delivered bigint NOT NULL DEFAULT 0,
    failed bigint NOT NULL DEFAULT 0,
    backlog bigint,                             -- messages waiting in the step's partition
    last_error text,
    last_error_at timestamptz,
    last_success_at timestamptz,
    reported_by text,
    reported_at timestamptz,
    PRIMARY KEY (destination, step)
);

-- Pauses a destination on all three steps; true when this call paused it (it was not).
-- p_probe_after is the probe interval as the caller runs it (divided by its time scale).
CREATE FUNCTION wal_delivery.pause_destination(p_destination text, p_step integer, p_error text,
                                               p_probe_after interval) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO wal_delivery.destination_pauses AS p
           (destination, paused, since, paused_step, reason, next_probe_at)
    SELECT d.name, true, now(), p_step, p_error, now() + p_probe_after
      FROM wal_delivery.destinations d WHERE d.name = p_destination
    ON CONFLICT (destination) DO UPDATE
       SET paused = true, since = now(), paused_step = EXCLUDED.paused_step,
           reason = EXCLUDED.reason, next_probe_at = EXCLUDED.next_probe_at, probes = 0,
           probe_holder = NULL, probe_lease_until = NULL
     WHERE NOT p.paused;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_notify('wal_delivery_pause', p_destination);
    RETURN true;
END $$;

-- The half-open probe's lease: true for exactly one caller per probe interval.
CREATE FUNCTION wal_delivery.claim_probe(p_destination text, p_holder text, p_lease interval)
RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH claimed AS (
        UPDATE wal_delivery.destination_pauses
           SET probe_holder = p_holder, probe_lease_until = now() + p_lease,
               probes = probes + 1, last_probe_at = now()
         WHERE destination = p_destination AND paused AND next_probe_at <= now()
           AND (probe_lease_until IS NULL OR probe_lease_until < now())
        RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM claimed);
$$;

-- The probe's answer. success and permanent resume the destination (it is responding);
-- transient keeps it paused until the next probe. True when it resumed.
CREATE FUNCTION wal_delivery.finish_probe(p_destination text, p_holder text, p_outcome text,
                                          p_error text, p_probe_after interval) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_outcome NOT IN ('success', 'transient', 'permanent') THEN
        RAISE EXCEPTION 'probe outcome must be success, transient or permanent, got %', p_outcome
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_outcome = 'transient' THEN
        UPDATE wal_delivery.destination_pauses
           SET next_probe_at = now() + p_probe_after, probe_holder = NULL, probe_lease_until = NULL,
               reason = coalesce(p_error, reason), last_probe_outcome = p_outcome
         WHERE destination = p_destination AND paused AND probe_holder = p_holder;
        RETURN false;
    END IF;
    UPDATE wal_delivery.destination_pauses
       SET paused = false, since = now(), next_probe_at = NULL, probe_holder = NULL,
           probe_lease_until = NULL, last_probe_outcome = p_outcome
     WHERE destination = p_destination AND paused AND probe_holder = p_holder;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_notify('wal_delivery_pause', p_destination);
    RETURN true;
END $$;

-- On-call's override: resume a paused destination now, without waiting for a probe.
CREATE FUNCTION wal_delivery.resume_destination(p_destination text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM wal_delivery.destinations WHERE name = p_destination) THEN
        RAISE EXCEPTION 'destination "%" does not exist', p_destination
            USING ERRCODE = 'undefined_object', HINT = 'See SELECT name FROM wal_delivery.destinations.';
    END IF;
    UPDATE wal_delivery.destination_pauses
       SET paused = false, since = now(), next_probe_at = NULL, probe_holder = NULL,
           probe_lease_until = NULL, last_probe_outcome = 'resumed by ' || session_user
     WHERE destination = p_destination AND paused;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_notify('wal_delivery_pause', p_destination);
    RETURN true;
END $$;

-- A retry process's counters: deltas for delivered/failed, current values for the rest.
-- p_stats is an array of {destination, step, consecutive_failures, delivered, failed,
-- backlog, last_error, last_error_at, last_success_at}; unknown destinations are skipped.
CREATE FUNCTION wal_delivery.report_step_stats(p_reporter text, p_stats jsonb) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
BEGIN
    INSERT INTO wal_delivery.destination_step_stats AS s
           (destination, step, consecutive_failures, delivered, failed, backlog, last_error,
            last_error_at, last_success_at, reported_by, reported_at)
    SELECT r.destination, r.step, coalesce(r.consecutive_failures, 0), coalesce(r.delivered, 0),
           coalesce(r.failed, 0), r.backlog, r.last_error, r.last_error_at, r.last_success_at,
           p_reporter, now()
      FROM jsonb_to_recordset(p_stats) AS r(destination text, step smallint,
               consecutive_failures integer, delivered bigint, failed bigint, backlog bigint,
               last_error text, last_error_at timestamptz, last_success_at timestamptz)
      JOIN wal_delivery.destinations d ON d.name = r.destination
     WHERE r.step BETWEEN 1 AND 3
    ON CONFLICT (destination, step) DO UPDATE
       SET consecutive_failures = EXCLUDED.consecutive_failures,
           delivered = s.delivered + EXCLUDED.delivered,
           failed = s.failed + EXCLUDED.failed,
           backlog = coalesce(EXCLUDED.backlog, s.backlog),
           last_error = coalesce(EXCLUDED.last_error, s.last_error),
           last_error_at = greatest(EXCLUDED.last_error_at, s.last_error_at),
           last_success_at = greatest(EXCLUDED.last_success_at, s.last_success_at),
           reported_by = EXCLUDED.reported_by, reported_at = EXCLUDED.reported_at;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- The operator's view: one row per destination. Arrays are indexed by retry step (1..3).
CREATE VIEW wal_delivery.destination_status AS
SELECT d.name AS destination,
       CASE WHEN p.paused IS NOT TRUE THEN 'closed'
            WHEN p.probe_lease_until > now() THEN 'half-open'
            ELSE 'open' END AS breaker,
       coalesce(p.since, d.created_at) AS since,
       CASE WHEN p.paused THEN p.next_probe_at END AS next_probe_at,
       p.paused_step, p.probes, p.last_probe_outcome,
       ARRAY[s1.consecutive_failures, s2.consecutive_failures, s3.consecutive_failures] AS consecutive_failures,
       ARRAY[s1.delivered, s2.delivered, s3.delivered] AS delivered,
       ARRAY[s1.failed, s2.failed, s3.failed] AS failed,
       ARRAY[s1.backlog, s2.backlog, s3.backlog] AS backlog,
       le.last_error, le.last_error_at,
       greatest(s1.last_success_at, s2.last_success_at, s3.last_success_at) AS last_success_at,
       CASE WHEN p.paused THEN p.reason END AS pause_reason
  FROM wal_delivery.destinations d
  LEFT JOIN wal_delivery.destination_pauses p ON p.destination = d.name
  LEFT JOIN wal_delivery.destination_step_stats s1 ON s1.destination = d.name AND s1.step = 1
  LEFT JOIN wal_delivery.destination_step_stats s2 ON s2.destination = d.name AND s2.step = 2
  LEFT JOIN wal_delivery.destination_step_stats s3 ON s3.destination = d.name AND s3.step = 3
  LEFT JOIN LATERAL (
        SELECT s.last_error, s.last_error_at FROM wal_delivery.destination_step_stats s
         WHERE s.destination = d.name AND s.last_error_at IS NOT NULL
         ORDER BY s.last_error_at DESC LIMIT 1) le ON true;

------------------------------------------------------------------------------ dead letters

ALTER TABLE wal_delivery.dead_letters
    ADD COLUMN alerted_at timestamptz,          -- the alert went out (at least once)
    ADD COLUMN replay_requested_at timestamptz, -- on-call asked for a replay; the dlq worker does it
    ADD COLUMN replays integer NOT NULL DEFAULT 0;
-- Entries from before 0.7 were alerted when they were ingested.
UPDATE wal_delivery.dead_letters SET alerted_at = failed_at;
CREATE INDEX dead_letters_to_alert ON wal_delivery.dead_letters (id) WHERE alerted_at IS NULL;
CREATE INDEX dead_letters_to_replay ON wal_delivery.dead_letters (id)
    WHERE replay_requested_at IS NOT NULL AND resolved_at IS NULL;

-- Dead letters whose alert has not gone out yet, oldest first.
CREATE FUNCTION wal_delivery.dead_letters_to_alert(p_max_rows integer DEFAULT 100)
RETURNS TABLE (id bigint, origin text, topic text, idempotency_key text, destination text,
               last_error text)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT id, origin, topic, idempotency_key, destination, last_error
      FROM wal_delivery.dead_letters WHERE alerted_at IS NULL ORDER BY id LIMIT p_max_rows;
$$;

CREATE FUNCTION wal_delivery.mark_dead_letter_alerted(p_id bigint) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    UPDATE wal_delivery.dead_letters SET alerted_at = now() WHERE id = p_id AND alerted_at IS NULL;
$$;

-- Replays one entry to where it failed: a delivery failure goes back to its destination
-- through retry step 1 (the dlq worker writes it to Kafka, then resolves the entry); a
-- processing or relay failure puts its outbox row back to pending with fresh attempts.
CREATE FUNCTION wal_delivery.replay_dead_letter(p_id bigint) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
    UPDATE wal_delivery.outbox
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
           AND (p_destination IS NULL OR destination = p_destination)
           AND (p_topic IS NULL OR topic = p_topic)
           AND (p_failed_after IS NULL OR failed_at >= p_failed_after)
           AND (p_failed_before IS NULL OR failed_at < p_failed_before)
         ORDER BY id
    LOOP
        PERFORM wal_delivery.replay_dead_letter(v_id);
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;

-- For the dlq worker: delivery entries waiting to be written back to retry step 1.
CREATE FUNCTION wal_delivery.dead_letters_to_replay(p_max_rows integer DEFAULT 100)
RETURNS TABLE (id bigint, topic text, idempotency_key text, destination text, outbox_id bigint,
               content_type text, payload bytea, kafka_topic text, kafka_partition integer,
               kafka_offset bigint)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT id, topic, idempotency_key, destination, outbox_id, content_type, payload,
           kafka_topic, kafka_partition, kafka_offset
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
END $$;

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
    RETURN n;
END $$;

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

------------------------------------------------------------------------------ grants

REVOKE ALL ON wal_delivery.destination_pauses, wal_delivery.destination_step_stats,
              wal_delivery.destination_status FROM PUBLIC;
-- Every function of the schema is the admin's or the workers', never PUBLIC's.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA wal_delivery FROM PUBLIC;
GRANT SELECT ON wal_delivery.destination_pauses, wal_delivery.destination_step_stats,
                wal_delivery.destination_status TO wal_delivery_admin;
GRANT EXECUTE ON FUNCTION wal_delivery.pause_destination(text, integer, text, interval),
                          wal_delivery.claim_probe(text, text, interval),
                          wal_delivery.finish_probe(text, text, text, text, interval),
                          wal_delivery.resume_destination(text),
                          wal_delivery.report_step_stats(text, jsonb),
                          wal_delivery.dead_letters_to_alert(integer),
                          wal_delivery.mark_dead_letter_alerted(bigint),
                          wal_delivery.replay_dead_letter(bigint),
                          wal_delivery.replay_dead_letters(text, text, timestamptz, timestamptz),
                          wal_delivery.dead_letters_to_replay(integer),
                          wal_delivery.complete_replay(bigint),
                          wal_delivery.resolve_dead_letter(bigint, text),
                          wal_delivery.resolve_dead_letters(text, text, text, timestamptz),
                          wal_delivery.inspect_dead_letter(bigint)
    TO wal_delivery_admin;
