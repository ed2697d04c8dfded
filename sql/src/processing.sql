-- Processing: topics with a processor (topics.processor_kind 'sql' or 'http') have each
-- record processed before it is shipped, by `wal-worker process`.
--
-- The worker claims rows with claim_for_processor (a lease and a fencing token per row,
-- plus the topic's processor), runs each topic's processor and hands the outcome back:
-- SQL processors run here, in run_sql_processor; the results of HTTP processors come back
-- through finish_processing. Both go through the same checks, so a result is written only
-- by the row's current holder, within its lease.
--
-- Words used below:
--   lease token   the fencing token a processor gets with a claim; a write with an older
--                 token, or after the lease ran out, is refused
--   outcome       what became of one claimed row: processed, failed (back to pending after
--                 a backoff), dead (in dead_letters after the last attempt) or refused (the
--                 lease was lost or ran out before the result came: nothing was written)

CREATE SEQUENCE wal_delivery.lease_token_seq;

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

-- The processing claim. Rows ready to process: each comes with a lease (the topic's
-- processing_lease, or p_lease) and a fresh fencing token that the processor passes back
-- with its result.
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

-- Rows ready to process, each with its lease and its topic's processor. lease_ms_left is
-- measured by the database's clock, so the worker need not trust its own against it.
CREATE FUNCTION wal_delivery.claim_for_processor(p_max_rows integer DEFAULT 100)
RETURNS TABLE (id bigint, topic text, idempotency_key text, content_type text, payload bytea,
               attempts smallint, lease_token bigint, lease_ms_left bigint,
               processor_kind text, processor text, processing_timeout_ms bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_max_rows IS NULL OR p_max_rows < 1 THEN
        RAISE EXCEPTION 'max_rows must be at least 1, got %', coalesce(p_max_rows::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    SELECT c.id, c.topic, c.idempotency_key, c.content_type, c.payload, c.attempts, c.lease_token,
           greatest(0, (extract(epoch FROM c.lease_until - clock_timestamp()) * 1000))::bigint,
           t.processor_kind, t.processor,
           (extract(epoch FROM t.processing_timeout) * 1000)::bigint
      FROM wal_delivery.claim_ready_to_process(p_max_rows) c
      JOIN wal_delivery.topics t ON t.name = c.topic;
END $$;

-- Locks a row its holder is about to finish and returns what finishing needs, or, when
-- p_lease_token no longer holds it or the lease ran out by the clock (not by the
-- transaction's start, which may be long past), only refusal: why, in the words of
-- refuse_processing_transition. It does not raise, so callers need no subtransaction.
CREATE FUNCTION wal_delivery.hold_processing_row(p_id bigint, p_lease_token bigint,
    OUT refusal text, OUT payload bytea, OUT content_type text, OUT processor_kind text,
    OUT processor text, OUT lease_until timestamptz, OUT max_payload_bytes integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    -- By primary key alone, then checked: see complete_processing below for why.
    SELECT o.state, o.lease_token, o.lease_until, o.payload, o.content_type, t.processor_kind, t.processor,
           t.max_payload_bytes
      INTO r
      FROM wal_delivery.outbox o JOIN wal_delivery.topics t ON t.name = o.topic
     WHERE o.id = p_id
       FOR UPDATE OF o;
    IF NOT FOUND OR r.state <> 'processing' OR r.lease_token IS DISTINCT FROM p_lease_token
       OR r.lease_until <= clock_timestamp() THEN
        BEGIN
            PERFORM wal_delivery.refuse_processing_transition(p_id, p_lease_token);
        EXCEPTION WHEN lock_not_available OR object_not_in_prerequisite_state OR undefined_object THEN
            refusal := SQLERRM;
        END;
        RETURN;
    END IF;
    payload := r.payload;
    content_type := r.content_type;
    processor_kind := r.processor_kind;
    processor := r.processor;
    lease_until := r.lease_until;
    max_payload_bytes := r.max_payload_bytes;
END $$;

-- complete_processing and fail_processing find the row by primary key alone and check its
-- state and lease afterwards. With the conditions in the WHERE clause, PL/pgSQL's generic
-- plan scanned the outbox_processing_leases index on "lease_until > now()" and filtered by
-- id: every call read every index entry of every row processed since the last vacuum
-- (bench/process: 1 ms per row after 5,000 rows and growing, 3 ms after 10,000), the same
-- trap as mark_stored's (relay.sql).

-- The processor's result, accepted only from the current lease holder within its lease.
CREATE FUNCTION wal_delivery.complete_processing(p_id bigint, p_lease_token bigint, p_processed_payload bytea)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    IF p_processed_payload IS NULL THEN
        RAISE EXCEPTION 'processed payload of outbox row % must not be NULL', p_id
            USING ERRCODE = 'null_value_not_allowed', HINT = 'Report a failure with wal_delivery.fail_processing instead.';
    END IF;
    SELECT o.state, o.lease_token, o.lease_until, t.max_payload_bytes INTO r
      FROM wal_delivery.outbox o JOIN wal_delivery.topics t ON t.name = o.topic
     WHERE o.id = p_id
       FOR UPDATE OF o;
    IF octet_length(p_processed_payload) > r.max_payload_bytes THEN
        RAISE EXCEPTION 'processed payload of outbox row % has % bytes, over its topic''s limit of % bytes', p_id, octet_length(p_processed_payload), r.max_payload_bytes
            USING ERRCODE = 'program_limit_exceeded', HINT = 'The processor must keep payloads within the topic''s max_payload_bytes.';
    END IF;
    IF r.state IS DISTINCT FROM 'processing' OR r.lease_token IS DISTINCT FROM p_lease_token
       OR r.lease_until <= now() THEN
        PERFORM wal_delivery.refuse_processing_transition(p_id, p_lease_token);
    END IF;
    UPDATE wal_delivery.outbox
       SET state = 'processed', processed_payload = p_processed_payload, lease_until = NULL,
           available_at = now(), last_error = NULL
     WHERE id = p_id;
END $$;

-- The processor failed on this row: retry after a backoff, or bury it after the last attempt.
CREATE FUNCTION wal_delivery.fail_processing(p_id bigint, p_lease_token bigint, p_error text)
RETURNS wal_delivery.outbox_state
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    SELECT o.state, o.lease_token, o.lease_until, o.attempts,
           t.processing_max_attempts AS max_attempts, t.processing_backoff AS backoff INTO r
      FROM wal_delivery.outbox o JOIN wal_delivery.topics t ON t.name = o.topic
     WHERE o.id = p_id
       FOR UPDATE OF o;
    IF NOT FOUND OR r.state <> 'processing' OR r.lease_token IS DISTINCT FROM p_lease_token
       OR r.lease_until <= now() THEN
        PERFORM wal_delivery.refuse_processing_transition(p_id, p_lease_token);
    END IF;
    IF r.attempts >= r.max_attempts THEN
        PERFORM wal_delivery.bury_row(p_id, 'processing', coalesce(p_error, 'processing failed'));
        RETURN 'dead';
    END IF;
    -- Exponential backoff from the topic's processing_backoff, capped at 5 minutes. The
    -- doubling stops at 2^30, past the cap for any backoff of a microsecond or more: 2^44
    -- times a second is out of interval's range.
    UPDATE wal_delivery.outbox
       SET state = 'pending', lease_until = NULL, last_error = coalesce(p_error, 'processing failed'),
           available_at = now() + least(r.backoff * power(2, least(r.attempts, 31) - 1), interval '5 minutes')
     WHERE id = p_id;
    RETURN 'pending';
END $$;

-- Why a processed payload cannot be stored, or NULL when it can: NULL, over the topic's
-- size limit, or not JSON for a JSON record (consumers and destinations rely on the
-- content type).
CREATE FUNCTION wal_delivery.processed_payload_problem(p_payload bytea, p_content_type text, p_max_bytes integer)
RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_payload IS NULL THEN
        RETURN 'the processor returned NULL';
    END IF;
    IF octet_length(p_payload) > p_max_bytes THEN
        RETURN format('the processor returned %s bytes, over the topic''s max_payload_bytes (%s)',
                      octet_length(p_payload), p_max_bytes);
    END IF;
    IF p_content_type = 'application/json' THEN
        BEGIN
            PERFORM convert_from(p_payload, 'UTF8')::jsonb;
        EXCEPTION WHEN data_exception THEN
            RETURN format('the processor returned %s bytes that are not JSON, for an application/json record (%s)',
                          octet_length(p_payload), SQLERRM);
        END;
    END IF;
    RETURN NULL;
END $$;

-- Writes the outcome of an attempt on a row its caller holds (hold_processing_row):
-- processed when there is no error and the payload passes the checks, else a failed
-- attempt (pending after a backoff, or dead after the last one).
CREATE FUNCTION wal_delivery.record_attempt(p_id bigint, p_lease_token bigint, p_payload bytea,
    p_error text, p_content_type text, p_max_bytes integer, OUT outcome text, OUT detail text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    detail := coalesce(p_error, wal_delivery.processed_payload_problem(p_payload, p_content_type, p_max_bytes));
    IF detail IS NULL THEN
        PERFORM wal_delivery.complete_processing(p_id, p_lease_token, p_payload);
        PERFORM wal_delivery.wake_relay_at_commit();
        outcome := 'processed';
        RETURN;
    END IF;
    outcome := wal_delivery.fail_processing(p_id, p_lease_token, detail)::text;
    IF outcome = 'pending' THEN
        outcome := 'failed';
    END IF;
END $$;

-- The outcome of one attempt, from its holder: p_error set means the processor failed;
-- otherwise p_payload is the processed payload, stored if it passes the checks (a
-- payload that does not is a failed attempt too). Returns the outcome and, unless
-- processed, why. Wakes the relay when a row became processed.
CREATE FUNCTION wal_delivery.finish_processing(p_id bigint, p_lease_token bigint, p_payload bytea, p_error text,
    OUT outcome text, OUT detail text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    held record;
BEGIN
    SELECT * INTO held FROM wal_delivery.hold_processing_row(p_id, p_lease_token);
    IF held.refusal IS NOT NULL THEN
        outcome := 'refused';
        detail := held.refusal;
        RETURN;
    END IF;
    SELECT a.outcome, a.detail INTO outcome, detail
      FROM wal_delivery.record_attempt(p_id, p_lease_token, p_payload, p_error, held.content_type,
                                       held.max_payload_bytes) a;
END $$;

-- finish_processing for many rows in one round trip; the arrays line up by position.
CREATE FUNCTION wal_delivery.finish_processing_batch(p_ids bigint[], p_lease_tokens bigint[],
                                                     p_payloads bytea[], p_errors text[])
RETURNS TABLE (id bigint, outcome text, detail text)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT p_ids[i], f.outcome, f.detail
      FROM generate_subscripts(p_ids, 1) i,
           LATERAL wal_delivery.finish_processing(p_ids[i], p_lease_tokens[i], p_payloads[i], p_errors[i]) f
     ORDER BY i
$$;

-- hold_processing_row for many rows: one statement locks them all (found by primary key
-- alone, see complete_processing), then each is checked. Rows come back in the order
-- given, with refusal set for those the token no longer holds.
CREATE FUNCTION wal_delivery.hold_processing_rows(p_ids bigint[], p_lease_tokens bigint[])
RETURNS TABLE (id bigint, lease_token bigint, refusal text, payload bytea, content_type text,
               processor_kind text, processor text, lease_until timestamptz, max_payload_bytes integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    PERFORM 1 FROM wal_delivery.outbox o WHERE o.id = ANY (p_ids) ORDER BY o.id FOR UPDATE OF o;
    FOR r IN
        SELECT x.id AS x_id, x.token AS x_token, o.id AS o_id, o.state, o.lease_token AS o_token,
               o.lease_until AS o_lease_until, o.payload AS o_payload, o.content_type AS o_content_type,
               t.processor_kind AS t_kind, t.processor AS t_processor, t.max_payload_bytes AS t_max
          FROM unnest(p_ids, p_lease_tokens) WITH ORDINALITY AS x(id, token, n)
          LEFT JOIN (wal_delivery.outbox o JOIN wal_delivery.topics t ON t.name = o.topic) ON o.id = x.id
         ORDER BY x.n
    LOOP
        id := r.x_id;
        lease_token := r.x_token;
        refusal := NULL;
        payload := r.o_payload;
        content_type := r.o_content_type;
        processor_kind := r.t_kind;
        processor := r.t_processor;
        lease_until := r.o_lease_until;
        max_payload_bytes := r.t_max;
        IF r.o_id IS NULL OR r.state <> 'processing' OR r.o_token IS DISTINCT FROM r.x_token
           OR r.o_lease_until <= clock_timestamp() THEN
            BEGIN
                PERFORM wal_delivery.refuse_processing_transition(r.x_id, r.x_token);
            EXCEPTION WHEN lock_not_available OR object_not_in_prerequisite_state OR undefined_object THEN
                refusal := SQLERRM;
            END;
        END IF;
        RETURN NEXT;
    END LOOP;
END $$;

-- Stores the processed payloads of rows the caller holds, in one statement, and wakes the
-- relay. Returns the ids it stored; a row whose token or lease no longer holds is left
-- alone. The caller has checked each payload (processed_payload_problem).
CREATE FUNCTION wal_delivery.complete_processing_batch(p_ids bigint[], p_lease_tokens bigint[], p_payloads bytea[])
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_ids bigint[];
    v_payloads bytea[];
BEGIN
    SELECT array_agg(h.id ORDER BY h.n), array_agg(p_payloads[h.n] ORDER BY h.n) INTO v_ids, v_payloads
      FROM wal_delivery.hold_processing_rows(p_ids, p_lease_tokens)
           WITH ORDINALITY AS h(id, lease_token, refusal, payload, content_type, processor_kind,
                                processor, lease_until, max_payload_bytes, n)
     WHERE h.refusal IS NULL AND p_payloads[h.n] IS NOT NULL;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    UPDATE wal_delivery.outbox o
       SET state = 'processed', processed_payload = x.payload, lease_until = NULL,
           available_at = now(), last_error = NULL
      FROM unnest(v_ids, v_payloads) AS x(id, payload)
     WHERE o.id = x.id
    RETURNING o.id;
    PERFORM wal_delivery.wake_relay_at_commit();
END $$;

-- Runs the SQL processor of each held row and finishes it. Not SECURITY DEFINER: the
-- topic's function runs with the worker's own rights, never the extension owner's. Each
-- function call is its own subtransaction, so a processor that raises fails only its own
-- row, and whatever it wrote is undone. A result that comes after the row's lease ran
-- out is refused, not written. Failures are written row by row, results all at once.
CREATE FUNCTION wal_delivery.run_sql_processor(p_ids bigint[], p_lease_tokens bigint[])
RETURNS TABLE (id bigint, outcome text, detail text)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    held record;
    fn regprocedure;
    call text;
    call_for text;
    result bytea;
    err text;
    done_ids bigint[] := '{}';
    done_tokens bigint[] := '{}';
    done_payloads bytea[] := '{}';
    stored bigint[];
BEGIN
    FOR held IN SELECT * FROM wal_delivery.hold_processing_rows(p_ids, p_lease_tokens) LOOP
        id := held.id;
        IF held.refusal IS NOT NULL THEN
            outcome := 'refused';
            detail := held.refusal;
            RETURN NEXT;
            CONTINUE;
        END IF;
        result := NULL;
        err := NULL;
        IF call_for IS DISTINCT FROM held.processor THEN
            fn := to_regprocedure(held.processor || '(bytea)');
            SELECT format('SELECT %I.%I($1)', n.nspname, p.proname) INTO call
              FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE p.oid = fn;
            call_for := held.processor;
        END IF;
        IF held.processor_kind IS DISTINCT FROM 'sql' THEN
            err := format('the topic''s processor is no longer a SQL function (%s)', coalesce(held.processor_kind, 'none'));
        ELSIF fn IS NULL THEN
            err := format('processor function %s(bytea) does not exist', held.processor);
        ELSE
            BEGIN
                EXECUTE call INTO result USING held.payload;
            EXCEPTION WHEN OTHERS THEN
                err := format('processor %s raised %s: %s', held.processor, SQLSTATE, SQLERRM);
            END;
        END IF;
        IF clock_timestamp() >= held.lease_until THEN
            outcome := 'refused';
            detail := format('the lease on outbox row %s (token %s) expired at %s, before the processor finished',
                             held.id, held.lease_token, held.lease_until);
            RETURN NEXT;
            CONTINUE;
        END IF;
        err := coalesce(err, wal_delivery.processed_payload_problem(result, held.content_type, held.max_payload_bytes));
        IF err IS NULL THEN
            done_ids := done_ids || held.id;
            done_tokens := done_tokens || held.lease_token;
            done_payloads := done_payloads || result;
            CONTINUE;
        END IF;
        SELECT a.outcome, a.detail INTO outcome, detail
          FROM wal_delivery.record_attempt(held.id, held.lease_token, NULL, err, held.content_type,
                                           held.max_payload_bytes) a;
        RETURN NEXT;
    END LOOP;
    stored := ARRAY(SELECT * FROM wal_delivery.complete_processing_batch(done_ids, done_tokens, done_payloads));
    FOR i IN 1 .. cardinality(done_ids) LOOP
        id := done_ids[i];
        IF id = ANY (stored) THEN
            outcome := 'processed';
            detail := NULL;
        ELSE
            outcome := 'refused';
            detail := format('the lease on outbox row %s (token %s) ran out before its result was written',
                             id, done_tokens[i]);
        END IF;
        RETURN NEXT;
    END LOOP;
END $$;

-- What the processors are doing, per processing topic: rows waiting, being processed
-- (and how many of those hold an expired lease), processed and not yet shipped, retried
-- at least once, and dead.
CREATE VIEW wal_delivery.processing_status AS
SELECT t.name AS topic, t.processor_kind, t.processor, t.processing_lease, t.processing_timeout,
       count(*) FILTER (WHERE o.state = 'pending') AS pending,
       count(*) FILTER (WHERE o.state = 'processing') AS processing,
       count(*) FILTER (WHERE o.state = 'processing' AND o.lease_until <= now()) AS lease_expired,
       count(*) FILTER (WHERE o.state = 'processed') AS processed,
       count(*) FILTER (WHERE o.state = 'pending' AND o.attempts > 0) AS retrying,
       count(*) FILTER (WHERE o.state = 'dead') AS dead
  FROM wal_delivery.topics t
  LEFT JOIN wal_delivery.outbox o ON o.topic = t.name AND o.needs_processing
 WHERE t.processor_kind IS NOT NULL
 GROUP BY t.name, t.processor_kind, t.processor, t.processing_lease, t.processing_timeout;
