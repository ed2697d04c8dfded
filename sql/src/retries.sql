-- Retries without making an outage worse: the state `wal-worker retry` and `wal-worker
-- consume` share per destination. A destination that keeps failing is paused on all three
-- retry steps at once; while paused, one half-open probe per probe interval tries a
-- single delivery, and its answer resumes the destination or keeps it paused.
--
-- Words used below:
--   retry step   one of the three retry topics (retry.1, retry.2, retry.3), each with its
--                destination's delay; a destination owns one partition in each
--   pause        the breaker is open: no deliveries to the destination but the probe's
--   probe        the one delivery a paused destination gets per probe interval, under a
--                lease so only one process sends it

------------------------------------------------------------------------------ pause

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

-- On-call's override: resume a paused destination now, without waiting for a probe.
-- Audited when it resumed one.
CREATE FUNCTION wal_delivery.resume_destination(p_destination text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM wal_delivery.destinations WHERE name = p_destination) THEN
        RAISE EXCEPTION 'destination "%" does not exist', p_destination
            USING ERRCODE = 'undefined_object', HINT = 'See SELECT destination FROM wal_delivery.destination_status.';
    END IF;
    UPDATE wal_delivery.destination_pauses
       SET paused = false, since = now(), next_probe_at = NULL, probe_holder = NULL,
           probe_lease_until = NULL, last_probe_outcome = 'resumed by ' || session_user
     WHERE destination = p_destination AND paused;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_notify('wal_delivery_pause', p_destination);
    PERFORM wal_delivery.write_audit('resume', jsonb_build_object('destination', p_destination), 1);
    RETURN true;
END $$;

-- On-call's hold: pause a destination on all three steps until someone resumes it. No
-- probe runs meanwhile (next_probe_at stays NULL, which claim_probe never takes), so a
-- destination under maintenance is not woken by its own probe. A destination the
-- breaker paused is held from now on. True when this call changed its state; audited then.
CREATE FUNCTION wal_delivery.hold_destination(p_destination text, p_reason text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_reason text := 'paused by ' || session_user || ': ' || coalesce(nullif(btrim(p_reason), ''), 'no reason given');
BEGIN
    IF NOT EXISTS (SELECT 1 FROM wal_delivery.destinations WHERE name = p_destination) THEN
        RAISE EXCEPTION 'destination "%" does not exist', p_destination
            USING ERRCODE = 'undefined_object', HINT = 'See SELECT destination FROM wal_delivery.destination_status.';
    END IF;
    INSERT INTO wal_delivery.destination_pauses AS p
           (destination, paused, since, paused_step, reason, next_probe_at)
    VALUES (p_destination, true, now(), NULL, v_reason, NULL)
    ON CONFLICT (destination) DO UPDATE
       SET paused = true, since = CASE WHEN p.paused THEN p.since ELSE now() END, paused_step = NULL,
           reason = EXCLUDED.reason, next_probe_at = NULL, probes = 0, probe_holder = NULL,
           probe_lease_until = NULL
     WHERE NOT p.paused OR p.next_probe_at IS NOT NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_notify('wal_delivery_pause', p_destination);
    PERFORM wal_delivery.write_audit('pause',
        jsonb_build_object('destination', p_destination, 'reason', p_reason), 1);
    RETURN true;
END $$;

------------------------------------------------------------------------------ probe

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

------------------------------------------------------------------------------ retry steps

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

------------------------------------------------------------------------------ status

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
