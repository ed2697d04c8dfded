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
--                 lease was lost or ran out before the result came: nothing was written),
--                 or released (given back unstarted, without spending an attempt)
--   processing role  settings.processing_role: the role SQL processors run as (SET LOCAL
--                 ROLE), never the worker's own; see run_sql_processor_row

CREATE SEQUENCE wal_delivery.lease_token_seq;

-- Names why a processing transition is refused: missing, wrong state, or a lost lease.
CREATE FUNCTION wal_delivery.refuse_processing_transition(p_id bigint, p_lease_token bigint) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    SELECT state, lease_token, lease_until INTO r FROM wal_delivery.outbox_rows WHERE id = p_id;
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

-- How long a row waits after its nth failed attempt: the topic's processing_backoff,
-- doubled after each attempt, at most 5 minutes. The doubling stops at 2^30, past the cap
-- for any backoff of a microsecond or more: 2^44 times a second is out of interval's range.
CREATE FUNCTION wal_delivery.processing_retry_delay(p_backoff interval, p_attempts integer) RETURNS interval
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT least(p_backoff * power(2, least(greatest(p_attempts, 1), 31) - 1), interval '5 minutes')
$$;

-- Rows whose processing lease ran out go back to pending, or to dead after the last
-- attempt. An expired lease is a failed attempt like any other, with the same backoff: a
-- row whose processor hangs must not come straight back with the rows claimed next.
CREATE FUNCTION wal_delivery.expire_processing_leases(p_max_rows integer DEFAULT 1000) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
    n integer := 0;
BEGIN
    FOR r IN
        SELECT o.id, o.attempts, t.processing_max_attempts AS max_attempts, o.lease_until,
               t.processing_backoff AS backoff
          FROM wal_delivery.outbox_rows o JOIN wal_delivery.topics t ON t.name = o.topic
         WHERE o.state = 'processing' AND o.lease_until <= now()
         ORDER BY o.lease_until LIMIT p_max_rows
           FOR UPDATE OF o SKIP LOCKED
    LOOP
        IF r.attempts >= r.max_attempts THEN
            PERFORM wal_delivery.bury_row(r.id, 'processing',
                format('processing lease expired at %s on attempt %s of %s', r.lease_until, r.attempts, r.max_attempts));
        ELSE
            UPDATE wal_delivery.outbox_rows
               SET state = 'pending', lease_until = NULL,
                   available_at = now() + wal_delivery.processing_retry_delay(r.backoff, r.attempts),
                   last_error = format('processing lease expired at %s', r.lease_until)
             WHERE id = r.id;
        END IF;
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;

-- The processing claim. Rows ready to process: each comes with a lease (the topic's
-- processing_lease, or p_lease) and a fresh fencing token that the processor passes back
-- with its result. p_kind ('sql' or 'http') takes only rows of topics with that kind of
-- processor, so a worker never makes one kind wait for the other.
CREATE FUNCTION wal_delivery.claim_ready_to_process(p_max_rows integer DEFAULT 10, p_lease interval DEFAULT NULL,
                                                    p_kind text DEFAULT NULL)
RETURNS TABLE (id bigint, topic text, idempotency_key text, content_type text, headers jsonb,
               payload bytea, attempts smallint, lease_token bigint, lease_until timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    kind_topics text[];
BEGIN
    IF p_lease IS NOT NULL AND p_lease <= interval '0' THEN
        RAISE EXCEPTION 'lease must be positive, got %', p_lease USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_kind IS NOT NULL AND p_kind NOT IN ('sql', 'http') THEN
        RAISE EXCEPTION 'processor kind must be sql, http or NULL (both), got %', p_kind
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM wal_delivery.expire_processing_leases();
    IF p_kind IS NOT NULL THEN
        -- Without a topic of that kind, do not walk the backlog of the other kind.
        kind_topics := ARRAY(SELECT k.name FROM wal_delivery.topics k WHERE k.processor_kind = p_kind);
        IF cardinality(kind_topics) = 0 THEN
            RETURN;
        END IF;
    END IF;
    RETURN QUERY
    WITH claimed AS (
        SELECT c.id FROM wal_delivery.outbox_rows c
         WHERE c.state = 'pending' AND c.needs_processing AND c.available_at <= now()
           AND (p_kind IS NULL OR c.topic = ANY (kind_topics))
         ORDER BY c.available_at LIMIT p_max_rows
           FOR UPDATE OF c SKIP LOCKED
    )
    UPDATE wal_delivery.outbox_rows o
       SET state = 'processing', attempts = o.attempts + 1,
           lease_token = nextval('wal_delivery.lease_token_seq'),
           lease_until = now() + coalesce(p_lease, t.processing_lease)
      FROM claimed, wal_delivery.topics t
     WHERE o.id = claimed.id AND t.name = o.topic
    RETURNING o.id, o.topic, o.idempotency_key, o.content_type, o.headers, o.payload,
              o.attempts, o.lease_token, o.lease_until;
END $$;

-- Rows ready to process (of one kind of processor, or both), each with its lease and its
-- topic's processor and limits. lease_ms_left is measured by the database's clock, so the
-- worker need not trust its own against it. traceparent is the record's (any case), for
-- the worker's log lines about it.
CREATE FUNCTION wal_delivery.claim_for_processor(p_max_rows integer DEFAULT 100, p_kind text DEFAULT NULL)
RETURNS TABLE (id bigint, topic text, idempotency_key text, content_type text, payload bytea,
               attempts smallint, lease_token bigint, lease_ms_left bigint,
               processor_kind text, processor text, processing_timeout_ms bigint,
               processing_lease_ms bigint, max_payload_bytes integer, traceparent text)
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
           (extract(epoch FROM t.processing_timeout) * 1000)::bigint,
           (extract(epoch FROM t.processing_lease) * 1000)::bigint, t.max_payload_bytes,
           (SELECT h.value FROM jsonb_each_text(c.headers) h WHERE lower(h.key) = 'traceparent' LIMIT 1)
      FROM wal_delivery.claim_ready_to_process(p_max_rows, NULL, p_kind) c
      JOIN wal_delivery.topics t ON t.name = c.topic;
END $$;

-- Gives rows back without spending an attempt: rows a worker claimed but will not start
-- (it is stopping, or its batch failed for a reason that was not theirs). Only rows the
-- token still holds; returns how many.
CREATE FUNCTION wal_delivery.release_processing_rows(p_ids bigint[], p_lease_tokens bigint[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
BEGIN
    UPDATE wal_delivery.outbox_rows o
       SET state = 'pending', attempts = greatest(o.attempts - 1, 0), lease_until = NULL,
           available_at = now()
      FROM unnest(p_ids, p_lease_tokens) AS x(id, token)
     WHERE o.id = x.id AND o.state = 'processing' AND o.lease_token = x.token;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
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
      FROM wal_delivery.outbox_rows o JOIN wal_delivery.topics t ON t.name = o.topic
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
-- (bench/process: the cost per row grew with every row processed), the same
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
      FROM wal_delivery.outbox_rows o JOIN wal_delivery.topics t ON t.name = o.topic
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
    UPDATE wal_delivery.outbox_rows
       SET state = 'processed', processed_payload = p_processed_payload, lease_until = NULL,
           available_at = clock_timestamp(), last_error = NULL
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
      FROM wal_delivery.outbox_rows o JOIN wal_delivery.topics t ON t.name = o.topic
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
    UPDATE wal_delivery.outbox_rows
       SET state = 'pending', lease_until = NULL, last_error = coalesce(p_error, 'processing failed'),
           available_at = clock_timestamp() + wal_delivery.processing_retry_delay(r.backoff, r.attempts)
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
    PERFORM 1 FROM wal_delivery.outbox_rows o WHERE o.id = ANY (p_ids) ORDER BY o.id FOR UPDATE OF o;
    FOR r IN
        SELECT x.id AS x_id, x.token AS x_token, o.id AS o_id, o.state, o.lease_token AS o_token,
               o.lease_until AS o_lease_until, o.payload AS o_payload, o.content_type AS o_content_type,
               t.processor_kind AS t_kind, t.processor AS t_processor, t.max_payload_bytes AS t_max
          FROM unnest(p_ids, p_lease_tokens) WITH ORDINALITY AS x(id, token, n)
          LEFT JOIN (wal_delivery.outbox_rows o JOIN wal_delivery.topics t ON t.name = o.topic) ON o.id = x.id
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

------------------------------------------------------------------------------ SQL processors

-- Why role p_role cannot be the processing role, or NULL when it can: it must exist, must
-- not be a superuser or able to make itself one (CREATEROLE, or a member of a predefined
-- role that reads or writes server files or runs programs), must not hold the rights of
-- a role of wal_delivery's that reads secrets or changes delivery state (the worker's own,
-- whose routines read every signing secret; the admin's, on-call's or ingest's) or of the
-- predefined roles that read or write every table, and the workers (members of
-- wal_delivery_worker) must be able to SET ROLE to it. Processors are their owners' code:
-- they get exactly this role's rights.
CREATE FUNCTION wal_delivery.processing_role_problem(p_role text) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    IF p_role IS NULL THEN
        RETURN 'it is NULL';
    END IF;
    SELECT oid, rolsuper, rolcreaterole INTO r FROM pg_roles WHERE rolname = p_role;
    IF NOT FOUND THEN
        RETURN format('role "%s" does not exist', p_role);
    ELSIF r.rolsuper THEN
        RETURN format('role "%s" is a superuser', p_role);
    ELSIF r.rolcreaterole THEN
        RETURN format('role "%s" has CREATEROLE', p_role);
    ELSIF pg_has_role(r.oid, 'pg_execute_server_program', 'MEMBER')
          OR pg_has_role(r.oid, 'pg_write_server_files', 'MEMBER')
          OR pg_has_role(r.oid, 'pg_read_server_files', 'MEMBER') THEN
        RETURN format('role "%s" may read or write server files or run server programs', p_role);
    ELSIF pg_has_role(r.oid, 'pg_read_all_data', 'MEMBER') OR pg_has_role(r.oid, 'pg_write_all_data', 'MEMBER') THEN
        RETURN format('role "%s" may read or write every table (the signing secrets too)', p_role);
    ELSIF EXISTS (SELECT 1 FROM unnest(ARRAY['wal_delivery_worker', 'wal_delivery_admin', 'wal_delivery_oncall',
                                             'wal_delivery_ingest']) w
                   WHERE pg_has_role(r.oid, w, 'MEMBER')) THEN
        RETURN format('role "%s" is, or has the rights of, %s, which processors must not have', p_role,
                      (SELECT string_agg(w, ', ') FROM unnest(ARRAY['wal_delivery_worker', 'wal_delivery_admin',
                                                                    'wal_delivery_oncall', 'wal_delivery_ingest']) w
                        WHERE pg_has_role(r.oid, w, 'MEMBER')));
    ELSIF NOT pg_has_role('wal_delivery_worker', r.oid, 'MEMBER') THEN
        RETURN format('wal_delivery_worker is not a member of role "%s", so the workers cannot SET ROLE to it', p_role);
    END IF;
    RETURN NULL;
END $$;

-- Refuses a processing_role that SQL processors must not run as (the other settings are
-- checked in config/settings.sql and archive.sql).
CREATE FUNCTION wal_delivery.check_processing_settings() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    problem text;
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.processing_role IS NOT DISTINCT FROM OLD.processing_role THEN
        RETURN NEW;
    END IF;
    problem := wal_delivery.processing_role_problem(NEW.processing_role);
    IF problem IS NOT NULL THEN
        PERFORM wal_delivery.refuse_setting('processing_role must be a role SQL processors may run as: ' || problem,
            NEW.processing_role,
            'Use a plain NOLOGIN role that wal_delivery_worker is a member of, like the default wal_delivery_processor (GRANT my_role TO wal_delivery_worker), and grant it what the processors need.');
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER check_processing_settings BEFORE INSERT OR UPDATE ON wal_delivery.settings
    FOR EACH ROW EXECUTE FUNCTION wal_delivery.check_processing_settings();

-- The one place a SQL processor runs: a SECURITY DEFINER function owned by
-- settings.processing_role. Postgres refuses SET ROLE, RESET ROLE, SET SESSION
-- AUTHORIZATION and set_config('role') inside a security-definer function, so a processor
-- has the processing role's rights and nothing of the session it runs in (the worker's
-- login, whose routines read every signing secret). The processor's name is resolved
-- here, as the processing role: it is the one that needs the schema.
CREATE FUNCTION wal_delivery.call_sql_processor(p_processor text, p_payload bytea) RETURNS bytea
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    fn regprocedure := to_regprocedure(p_processor || '(bytea)');
    call text;
    result bytea;
BEGIN
    IF fn IS NULL THEN
        RAISE EXCEPTION 'processor function %(bytea) does not exist', p_processor
            USING ERRCODE = 'undefined_function';
    END IF;
    SELECT format('SELECT %I.%I($1)', n.nspname, p.proname) INTO call
      FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE p.oid = fn;
    EXECUTE call INTO result USING p_payload;
    -- Deferred triggers the processor queued would fire at the worker's COMMIT, as the
    -- worker: they fire now, as the processing role.
    SET CONSTRAINTS ALL IMMEDIATE;
    RETURN result;
END $$;

-- The name of a setting (GUC) changed since the caller's current subtransaction began, or
-- NULL. run_sql_processor_row asks right after a processor returns: a plain SET in a
-- processor would outlive it in the worker's session (src/ext/session_settings.c).
-- No SET clause: one would open a nesting level of its own, and count as a change.
CREATE FUNCTION wal_delivery.setting_changed_here() RETURNS text
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'wal_delivery_setting_changed_here';

-- call_sql_processor belongs to the processing role, whichever it is now.
CREATE FUNCTION wal_delivery.own_sql_processor_call() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.processing_role IS DISTINCT FROM OLD.processing_role THEN
        EXECUTE format('ALTER FUNCTION wal_delivery.call_sql_processor(text, bytea) OWNER TO %I', NEW.processing_role);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER own_sql_processor_call AFTER INSERT OR UPDATE ON wal_delivery.settings
    FOR EACH ROW EXECUTE FUNCTION wal_delivery.own_sql_processor_call();

-- Why call_sql_processor cannot be trusted, or NULL. Its owner, the processing role, may
-- ALTER it (SECURITY INVOKER, another search_path): a processor could do so to run the
-- next one with the worker's rights. So it is checked before each call.
CREATE FUNCTION wal_delivery.sql_processor_call_problem(p_processing_role text) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN p.oid IS NULL THEN 'wal_delivery.call_sql_processor is missing'
                WHEN NOT p.prosecdef OR p.proowner <> to_regrole(p_processing_role)
                     OR p.proconfig IS DISTINCT FROM ARRAY['search_path=pg_catalog, pg_temp']
                THEN format('wal_delivery.call_sql_processor was altered (SECURITY DEFINER %s, owner %s, %s); '
                            'no SQL processor runs until an admin restores it: ALTER FUNCTION wal_delivery.call_sql_processor(text, bytea) '
                            'SECURITY DEFINER SET search_path = pg_catalog, pg_temp, then find the processor that altered it',
                            p.prosecdef, p.proowner::regrole, coalesce(array_to_string(p.proconfig, ' '), 'no settings'))
           END
      FROM (SELECT 1) one
      LEFT JOIN pg_proc p ON p.oid = to_regprocedure('wal_delivery.call_sql_processor(text, bytea)')
$$;

-- Starts the attempt on one row its caller holds: locks it and, when the row has already
-- waited (for other rows of its batch) more than a tenth of its lease or a second, starts
-- the lease again from now, so a row never spends its lease waiting for another row's
-- processor. Refused, without raising, when the token no longer holds the row or its
-- lease ran out before the caller's transaction began; a caller that locked the row then
-- (hold_processing_rows) keeps it, since nobody else can have taken it since.
CREATE FUNCTION wal_delivery.start_processing_row(p_id bigint, p_lease_token bigint,
    OUT refusal text, OUT payload bytea, OUT content_type text, OUT processor_kind text,
    OUT processor text, OUT lease_until timestamptz, OUT max_payload_bytes integer,
    OUT processing_role text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    SELECT o.state, o.lease_token, o.lease_until, o.payload, o.content_type, t.processor_kind, t.processor,
           t.max_payload_bytes, t.processing_lease
      INTO r
      FROM wal_delivery.outbox_rows o JOIN wal_delivery.topics t ON t.name = o.topic
     WHERE o.id = p_id
       FOR UPDATE OF o;
    IF NOT FOUND OR r.state <> 'processing' OR r.lease_token IS DISTINCT FROM p_lease_token
       OR r.lease_until <= now() THEN
        BEGIN
            PERFORM wal_delivery.refuse_processing_transition(p_id, p_lease_token);
        EXCEPTION WHEN lock_not_available OR object_not_in_prerequisite_state OR undefined_object THEN
            refusal := SQLERRM;
        END;
        RETURN;
    END IF;
    lease_until := r.lease_until;
    IF r.lease_until - r.processing_lease + least(r.processing_lease / 10, interval '1 second') < clock_timestamp() THEN
        lease_until := clock_timestamp() + r.processing_lease;
        UPDATE wal_delivery.outbox_rows SET lease_until = start_processing_row.lease_until WHERE id = p_id;
    END IF;
    payload := r.payload;
    content_type := r.content_type;
    processor_kind := r.processor_kind;
    processor := r.processor;
    max_payload_bytes := r.max_payload_bytes;
    SELECT s.processing_role INTO processing_role FROM wal_delivery.settings s;
END $$;

-- Why no SQL processor may run in this session, or NULL: the user who logged in is a
-- superuser. A processor can RESET ROLE (or RESET SESSION AUTHORIZATION) back to that
-- user, so it would run with a superuser's rights whatever role it was given.
CREATE FUNCTION wal_delivery.processing_session_problem() RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT format('SQL processors do not run in a session of superuser "%s" (a processor could RESET ROLE to it); connect as a non-superuser member of wal_delivery_worker',
                  r.rolname)
      FROM pg_stat_get_activity(pg_backend_pid()) a JOIN pg_roles r ON r.oid = a.usesysid
     WHERE r.rolsuper
$$;

-- Runs the SQL processor of one row its caller holds and writes the outcome. Not SECURITY
-- DEFINER: the topic's function runs as settings.processing_role inside
-- call_sql_processor (where no SET ROLE works), never with the extension owner's rights
-- nor the worker's, and never in a superuser's session. The call is a
-- subtransaction: whatever the processor wrote is undone unless its result is stored, so
-- a processor that raises, returns something unusable, is cancelled or is late leaves
-- nothing behind. A processor that outlives the caller's statement_timeout (the worker
-- sets the lease plus a second) is cancelled and that is a failed attempt (timed_out); a
-- result after the lease ran out is refused, and the lease expiry returns the row.
CREATE FUNCTION wal_delivery.run_sql_processor_row(p_id bigint, p_lease_token bigint,
    OUT outcome text, OUT detail text, OUT timed_out boolean)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    held record;
    result bytea;
    err text;
    changed text;
    held_cursor text;
    discarding boolean := false;
    late boolean := false;
BEGIN
    timed_out := false;
    SELECT * INTO held FROM wal_delivery.start_processing_row(p_id, p_lease_token);
    IF held.refusal IS NOT NULL THEN
        outcome := 'refused';
        detail := held.refusal;
        RETURN;
    END IF;
    IF held.processor_kind IS DISTINCT FROM 'sql' THEN
        err := format('the topic''s processor is no longer a SQL function (%s)', coalesce(held.processor_kind, 'none'));
    ELSE
        err := coalesce(wal_delivery.processing_session_problem(),
                        'processing_role cannot run processors: ' || wal_delivery.processing_role_problem(held.processing_role),
                        wal_delivery.sql_processor_call_problem(held.processing_role));
    END IF;
    IF err IS NULL THEN
        BEGIN
            BEGIN
                result := wal_delivery.call_sql_processor(held.processor, held.payload);
                -- Before any name is looked up again: a processor that ran SET search_path
                -- would have the next unqualified name here, and the worker's next
                -- statements, resolve to its own functions, run with the worker's rights.
                -- Raising undoes every setting it changed, with its writes.
                changed := wal_delivery.setting_changed_here();
                IF changed IS NOT NULL THEN
                    RAISE EXCEPTION 'discarded';
                END IF;
                -- A cursor WITH HOLD runs to its end at the worker's COMMIT, as the worker.
                SELECT c.name INTO held_cursor FROM pg_catalog.pg_cursors c WHERE c.is_holdable LIMIT 1;
                IF held_cursor IS NOT NULL THEN
                    RAISE EXCEPTION 'discarded';
                END IF;
            EXCEPTION WHEN undefined_function THEN
                IF SQLERRM NOT LIKE 'processor function %' THEN
                    RAISE;  -- the processor's own error
                END IF;
                err := SQLERRM;
                discarding := true;
                RAISE EXCEPTION 'discarded';
            END;
            late := clock_timestamp() >= held.lease_until;
            IF NOT late THEN
                err := wal_delivery.processed_payload_problem(result, held.content_type, held.max_payload_bytes);
            END IF;
            IF late OR err IS NOT NULL THEN
                discarding := true;
                RAISE EXCEPTION 'discarded';  -- undoes what the processor wrote
            END IF;
        EXCEPTION
            WHEN query_canceled THEN
                timed_out := true;
                err := format('processor %s did not finish within its lease (expired at %s, %s)',
                              held.processor, held.lease_until, SQLERRM);
            WHEN OTHERS THEN
                IF changed IS NOT NULL THEN
                    err := format('processor %s changed setting %s of the session it runs in (the worker''s): '
                                  'refused, and undone with its writes; a processor may set what it needs for '
                                  'itself only, with a SET clause on its function (CREATE FUNCTION ... SET %s = ...)',
                                  held.processor, changed, changed);
                ELSIF held_cursor IS NOT NULL THEN
                    err := format('processor %s left cursor %s WITH HOLD open in the session it runs in (the worker''s), '
                                  'where it would run at COMMIT with the worker''s rights: refused, and undone with its writes',
                                  held.processor, quote_ident(held_cursor));
                ELSIF NOT discarding THEN
                    err := format('processor %s raised %s: %s', held.processor, SQLSTATE, SQLERRM);
                END IF;
        END;
    END IF;
    IF late THEN
        outcome := 'refused';
        detail := format('the lease on outbox row %s (token %s) expired at %s, before the processor finished',
                         p_id, p_lease_token, held.lease_until);
        RETURN;
    END IF;
    SELECT a.outcome, a.detail INTO outcome, detail
      FROM wal_delivery.record_attempt(p_id, p_lease_token, CASE WHEN err IS NULL THEN result END, err,
                                       held.content_type, held.max_payload_bytes) a;
END $$;

-- Runs the SQL processor of each row and finishes it (run_sql_processor_row), in one
-- call: the rows are locked first, so none of them expires while the others run, and
-- each row's lease starts when its processor does. Rows come back in the order given.
-- A cancel (statement timeout, pg_cancel_backend) fails the row it cut off and ends the
-- call: the rows not started yet are given back without spending an attempt (released).
-- The worker calls run_sql_processor_row itself, one statement per row, so a statement
-- timeout cancels only the row that hangs.
CREATE FUNCTION wal_delivery.run_sql_processor(p_ids bigint[], p_lease_tokens bigint[])
RETURNS TABLE (id bigint, outcome text, detail text)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    held record;
    cancelled boolean := false;
    cut_off boolean;
BEGIN
    FOR held IN SELECT h.id, h.lease_token, h.refusal FROM wal_delivery.hold_processing_rows(p_ids, p_lease_tokens) h LOOP
        id := held.id;
        IF held.refusal IS NOT NULL THEN
            outcome := 'refused';
            detail := held.refusal;
        ELSIF cancelled THEN
            PERFORM wal_delivery.release_processing_rows(ARRAY[held.id], ARRAY[held.lease_token]);
            outcome := 'released';
            detail := 'not started: the call was cancelled';
        ELSE
            SELECT r.outcome, r.detail, r.timed_out INTO outcome, detail, cut_off
              FROM wal_delivery.run_sql_processor_row(held.id, held.lease_token) r;
            cancelled := cut_off;
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
  LEFT JOIN wal_delivery.outbox_rows o ON o.topic = t.name AND o.needs_processing
 WHERE t.processor_kind IS NOT NULL
 GROUP BY t.name, t.processor_kind, t.processor, t.processing_lease, t.processing_timeout;
