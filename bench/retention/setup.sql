-- bench/retention/setup.sql: the outbox designs of bench/retention/run, side by side in
-- one fresh database. psql variables: window (seconds), tuned_reloptions (A-tuned).
--
--   A         wal_delivery.outbox as the extension ships it; rows leave through
--             wal_delivery.purge_finished_rows(batch), one short transaction per batch.
--   B-keys    bench_bk.outbox: the same columns and indexes, range-partitioned on created_at;
--             old partitions are detached (CONCURRENTLY) and dropped. Global idempotency
--             through an unpartitioned key table bench_bk.keys (PRIMARY KEY (topic, key)),
--             itself purged in batches once the key's partition is gone.
--   B-lookup  bench_bl.outbox: partitioned the same way; global idempotency through an
--             advisory lock on hash(topic, key) and a lookup in every attached partition
--             (a plain index on (topic, idempotency_key) per partition).
--   A-tuned   bench_a2.outbox: a copy of A (table LIKE wal_delivery.outbox INCLUDING ALL,
--             the extension's functions copied with pg_get_functiondef) with extra storage
--             parameters (psql variable tuned_reloptions), to try a change to A side by side.
--
-- B's enqueue repeats every check of wal_delivery.enqueue_payload (same topic lookup, limits,
-- definer and search_path), so the difference in cost is the storage design alone.
\set ON_ERROR_STOP 1
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS bench, bench_a2, bench_bk, bench_bl CASCADE;
DROP EXTENSION IF EXISTS wal_delivery CASCADE;
CREATE EXTENSION wal_delivery;

INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas, partitions, idempotency_window)
SELECT name, 1, 1, 1, make_interval(secs => :window)
  FROM unnest(ARRAY['bench_a', 'bench_a2', 'bench_bk', 'bench_bl']) name;

CREATE SCHEMA bench;

-- What the purgers, relays and B's maintenance did: one row per transaction or statement.
CREATE TABLE bench.events (
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    design text NOT NULL,
    kind text NOT NULL,       -- purge | purge_keys | relay
    ms double precision NOT NULL,
    n integer
);

-- One row per design at the end of every cycle.
CREATE TABLE bench.cycles (
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    cycle integer NOT NULL,
    design text NOT NULL,
    total_bytes bigint,       -- table + indexes + toast, every partition, B-keys' key table too
    extra_bytes bigint,       -- of which the key table (B-keys)
    heap_bytes bigint,        -- of which heap (main fork): the rest is indexes, toast, fsm/vm
    rows bigint,              -- rows in the outbox (count(*))
    pending bigint,           -- not yet marked stored: the relay's backlog
    oldest_s double precision,-- age of the oldest row: how long rows are really kept
    n_dead_tup bigint,        -- pg_stat_user_tables, summed over partitions (+ key table)
    n_live_tup bigint,
    partitions integer,
    autovacuums bigint,       -- autovacuum_count, summed (partitions dropped lose theirs)
    longest_xact_s double precision  -- longest open transaction in the database (any session)
);

------------------------------------------------------------------------------ A-tuned: A's copy

CREATE FUNCTION bench.make_a_copy(s text, extra_reloptions text) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    opts text := (SELECT array_to_string(reloptions, ', ') FROM pg_class WHERE oid = 'wal_delivery.outbox'::regclass);
    f regprocedure;
    def text;
BEGIN
    EXECUTE format('CREATE SCHEMA %I', s);
    EXECUTE format('CREATE TABLE %I.outbox (LIKE wal_delivery.outbox INCLUDING ALL)', s);
    IF opts IS NOT NULL THEN
        EXECUTE format('ALTER TABLE %I.outbox SET (%s)', s, opts);
    END IF;
    IF coalesce(extra_reloptions, '') <> '' THEN
        EXECUTE format('ALTER TABLE %I.outbox SET (%s)', s, extra_reloptions);
    END IF;
    FOREACH f IN ARRAY ARRAY[
        'wal_delivery.enqueue_payload(text, bytea, text, text, text, jsonb)',
        'pg_catalog.wal_enqueue(text, text, text, text, jsonb)',
        'wal_delivery.claim_ready_to_ship(integer)',
        'wal_delivery.refuse_ship_transition(bigint)',
        'wal_delivery.mark_stored(bigint[])',
        'wal_delivery.purge_finished_rows(integer)']::regprocedure[]
    LOOP
        def := pg_get_functiondef(f);
        def := regexp_replace(def, 'wal_delivery\.outbox\M', s || '.outbox', 'g');
        def := regexp_replace(def, '(wal_delivery|pg_catalog)\.(enqueue_payload|wal_enqueue|claim_ready_to_ship|refuse_ship_transition|mark_stored|purge_finished_rows)\M',
                              s || '.\2', 'g');
        EXECUTE def;
    END LOOP;
END $fn$;

SELECT bench.make_a_copy('bench_a2', :'tuned_reloptions');

------------------------------------------------------------------------------ B: the tables

CREATE FUNCTION bench.make_partitioned(s text, dedupe text) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    opts text := (SELECT array_to_string(reloptions, ', ') FROM pg_class WHERE oid = 'wal_delivery.outbox'::regclass);
BEGIN
    EXECUTE format('CREATE SCHEMA %1$I', s);
    EXECUTE format('CREATE SEQUENCE %1$I.outbox_id_seq', s);
    -- The columns of wal_delivery.outbox; created_at is the partition key and takes
    -- clock_timestamp(), so no insert can target a partition whose range has passed (a
    -- long application transaction would, with now(), and fail once it was dropped).
    EXECUTE format($$
    CREATE TABLE %1$I.outbox (
        id bigint NOT NULL DEFAULT nextval(%2$L),
        topic text NOT NULL,
        idempotency_key text NOT NULL,
        state wal_delivery.outbox_state NOT NULL DEFAULT 'pending',
        needs_processing boolean NOT NULL DEFAULT false,
        message_key text,
        headers jsonb,
        content_type text NOT NULL,
        payload bytea NOT NULL,
        processed_payload bytea,
        attempts smallint NOT NULL DEFAULT 0,
        lease_token bigint,
        lease_until timestamptz,
        available_at timestamptz NOT NULL DEFAULT now(),
        last_error text,
        enqueued_by oid NOT NULL,
        created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        finished_at timestamptz,
        PRIMARY KEY (id, created_at)   -- a unique key must include the partition key
    ) PARTITION BY RANGE (created_at)$$, s, s || '.outbox_id_seq');
    EXECUTE format($$CREATE INDEX outbox_ready_to_ship ON %1$I.outbox (available_at)
        WHERE (state = 'pending' AND NOT needs_processing) OR state = 'processed'$$, s);
    EXECUTE format($$CREATE INDEX outbox_ready_to_process ON %1$I.outbox (available_at)
        WHERE state = 'pending' AND needs_processing$$, s);
    EXECUTE format($$CREATE INDEX outbox_processing_leases ON %1$I.outbox (lease_until)
        WHERE state = 'processing'$$, s);
    EXECUTE format($$CREATE INDEX outbox_finished ON %1$I.outbox (finished_at)
        WHERE state IN ('stored', 'dead')$$, s);
    -- Partitions get the outbox's storage parameters (autovacuum settings).
    EXECUTE format($$CREATE TABLE %1$I.settings (reloptions text NOT NULL)$$, s);
    EXECUTE format($$INSERT INTO %1$I.settings VALUES (%2$L)$$, s, coalesce(opts, 'fillfactor = 100'));

    IF dedupe = 'keys' THEN
        -- The unpartitioned dedupe table: one small row per record, kept until the
        -- record's partition is dropped, then purged in batches.
        EXECUTE format($$
        CREATE TABLE %1$I.keys (
            topic text NOT NULL,
            idempotency_key text NOT NULL,
            outbox_id bigint NOT NULL,
            created_at timestamptz NOT NULL,
            PRIMARY KEY (topic, idempotency_key)
        ) WITH (%2$s)$$, s, coalesce(opts, 'fillfactor = 100'));
        EXECUTE format($$CREATE INDEX keys_created_at ON %1$I.keys (created_at)$$, s);
    ELSE
        -- For the lookup across partitions (not unique: that would need created_at).
        EXECUTE format($$CREATE INDEX outbox_topic_idempotency_key ON %1$I.outbox (topic, idempotency_key)$$, s);
    END IF;

    ---------------------------------------------------------------- enqueue
    -- The body of wal_delivery.enqueue_payload up to the INSERT, unchanged.
    EXECUTE format($t$
    CREATE FUNCTION %1$I.enqueue_payload(
        p_topic text, p_payload bytea, p_content_type text,
        p_idempotency_key text, p_key text, p_headers jsonb)
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
    DECLARE
        t record;
        v_key text := p_idempotency_key;
        v_id bigint;
        v_created timestamptz;
    BEGIN
        IF p_topic IS NULL OR p_topic = '' THEN
            RAISE EXCEPTION 'topic must not be %%', CASE WHEN p_topic IS NULL THEN 'NULL' ELSE 'empty' END
                USING ERRCODE = 'null_value_not_allowed', HINT = 'Pass the name of a row in wal_delivery.topics.';
        END IF;
        IF p_payload IS NULL THEN
            RAISE EXCEPTION 'payload must not be NULL (topic "%%")', p_topic
                USING ERRCODE = 'null_value_not_allowed';
        END IF;
        SELECT max_payload_bytes, processor IS NOT NULL AS needs_processing INTO t
          FROM wal_delivery.topics WHERE name = p_topic;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'topic "%%" does not exist', p_topic USING ERRCODE = 'undefined_object';
        END IF;
        IF octet_length(p_payload) > t.max_payload_bytes THEN
            RAISE EXCEPTION 'payload of %% bytes is over the limit of topic "%%" (%% bytes)', octet_length(p_payload), p_topic, t.max_payload_bytes
                USING ERRCODE = 'program_limit_exceeded';
        END IF;
        IF v_key IS NULL THEN
            v_key := gen_random_uuid()::text;
        ELSIF v_key = '' OR octet_length(v_key) > 255 THEN
            RAISE EXCEPTION 'idempotency key must be 1 to 255 bytes, got %%', octet_length(v_key)
                USING ERRCODE = 'string_data_right_truncation';
        END IF;
        IF p_key IS NOT NULL AND octet_length(p_key) > 1024 THEN
            RAISE EXCEPTION 'message key must be at most 1024 bytes, got %%', octet_length(p_key)
                USING ERRCODE = 'string_data_right_truncation';
        END IF;
        IF NOT wal_delivery.is_string_map(p_headers) THEN
            RAISE EXCEPTION 'headers must be a JSON object of strings, got %%', left(p_headers::text, 200)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v_created := clock_timestamp();
        %2$s
        PERFORM wal_delivery.wake_relay_at_commit();
        RETURN v_id;
    END $body$$t$, s,
    CASE dedupe WHEN 'keys' THEN format($$
        -- The key table decides; a repeated key returns the first record's id.
        v_id := nextval(%2$L);
        INSERT INTO %1$I.keys (topic, idempotency_key, outbox_id, created_at)
        VALUES (p_topic, v_key, v_id, v_created)
        ON CONFLICT (topic, idempotency_key) DO NOTHING;
        IF NOT FOUND THEN
            SELECT outbox_id INTO v_id FROM %1$I.keys WHERE topic = p_topic AND idempotency_key = v_key;
            IF v_id IS NULL THEN
                RAISE EXCEPTION 'idempotency key "%%" of topic "%%" was enqueued by a transaction this snapshot cannot see', v_key, p_topic
                    USING ERRCODE = 'serialization_failure';
            END IF;
            RETURN v_id;
        END IF;
        INSERT INTO %1$I.outbox (id, topic, idempotency_key, needs_processing, message_key, headers,
                                 content_type, payload, enqueued_by, created_at)
        VALUES (v_id, p_topic, v_key, t.needs_processing, p_key, p_headers, p_content_type, p_payload,
                wal_delivery.invoking_role(), v_created);$$, s, s || '.outbox_id_seq')
    ELSE format($$
        -- Same-key enqueues queue on the advisory lock (held to commit), then look in
        -- every attached partition; READ COMMITTED gives the lookup a fresh snapshot.
        PERFORM pg_advisory_xact_lock(hashtextextended(p_topic || '/' || v_key, 0));
        SELECT id INTO v_id FROM %1$I.outbox WHERE topic = p_topic AND idempotency_key = v_key;
        IF FOUND THEN
            RETURN v_id;
        END IF;
        INSERT INTO %1$I.outbox (topic, idempotency_key, needs_processing, message_key, headers,
                                 content_type, payload, enqueued_by, created_at)
        VALUES (p_topic, v_key, t.needs_processing, p_key, p_headers, p_content_type, p_payload,
                wal_delivery.invoking_role(), v_created)
        RETURNING id INTO v_id;$$, s)
    END);

    -- The same shape as pg_catalog.wal_enqueue(topic, payload text, ...).
    EXECUTE format($t$
    CREATE FUNCTION %1$I.wal_enqueue(topic text, payload text, idempotency_key text DEFAULT NULL,
                                     key text DEFAULT NULL, headers jsonb DEFAULT NULL)
    RETURNS bigint LANGUAGE sql AS $body$
        SELECT %1$I.enqueue_payload(topic, convert_to(payload, 'UTF8'), 'text/plain; charset=utf-8',
                                    idempotency_key, key, headers)
    $body$$t$, s);

    ---------------------------------------------------------------- relay
    -- claim_ready_to_ship and mark_stored of the extension, carrying created_at so the
    -- update finds the partition.
    EXECUTE format($t$
    CREATE FUNCTION %1$I.claim_ready_to_ship(p_max_rows integer DEFAULT 100)
    RETURNS TABLE (id bigint, topic text, idempotency_key text, message_key text, headers jsonb,
                   content_type text, payload bytea, created_at timestamptz)
    LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
        SELECT o.id, o.topic, o.idempotency_key, o.message_key, o.headers, o.content_type,
               coalesce(o.processed_payload, o.payload), o.created_at
          FROM %1$I.outbox o
         WHERE ((o.state = 'pending' AND NOT o.needs_processing) OR o.state = 'processed')
           AND o.available_at <= now()
         ORDER BY o.available_at
         LIMIT p_max_rows
           FOR UPDATE SKIP LOCKED
    $body$$t$, s);
    EXECUTE format($t$
    CREATE FUNCTION %1$I.mark_stored(p_ids bigint[], p_created timestamptz[]) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
    DECLARE
        n integer;
        bad bigint;
    BEGIN
        SELECT u.id INTO bad FROM unnest(p_ids, p_created) u(id, created_at)
         WHERE NOT EXISTS (SELECT 1 FROM %1$I.outbox o
                            WHERE o.id = u.id AND o.created_at = u.created_at
                              AND ((o.state = 'pending' AND NOT o.needs_processing) OR o.state = 'processed'))
         LIMIT 1;
        IF bad IS NOT NULL THEN
            RAISE EXCEPTION 'outbox row %% is not ready to ship', bad USING ERRCODE = 'object_not_in_prerequisite_state';
        END IF;
        UPDATE %1$I.outbox o
           SET state = 'stored', finished_at = now(), last_error = NULL
          FROM unnest(p_ids, p_created) u(id, created_at)
         WHERE o.id = u.id AND o.created_at = u.created_at
           AND ((o.state = 'pending' AND NOT o.needs_processing) OR o.state = 'processed');
        GET DIAGNOSTICS n = ROW_COUNT;
        RETURN n;
    END $body$$t$, s);
END $fn$;

SELECT bench.make_partitioned('bench_bk', 'keys');
SELECT bench.make_partitioned('bench_bl', 'lookup');

-- B's maintenance plan for one tick, run by bench/retention/run, which carries it out one
-- statement at a time (DETACH ... CONCURRENTLY cannot run inside a function), in two loops:
-- mode 'create' (creation must not wait behind a DETACH) and mode 'retire'.
--   create    a partition for every slice from the current one to ahead_ms ahead
--             (CREATE TABLE ... LIKE, then ATTACH: CREATE TABLE ... PARTITION OF, like a
--             plain DROP of a partition, locks the parent ACCESS EXCLUSIVE, so it waits for
--             every open writer and every new writer waits behind it)
--   detach    a partition whose range ended more than the window ago and whose rows are all
--             finished, and finished more than the window ago; then DROP it. At most two a
--             tick: each waits for every transaction open on the outbox when it started.
--   finalize  a detach that was interrupted;  drop  a detached table left over
CREATE FUNCTION bench.maint_plan(s text, mode text, slice_ms bigint, ahead_ms bigint, window_s double precision)
RETURNS TABLE (action text, name text, lo text, hi text)
LANGUAGE plpgsql AS $$
DECLARE
    now_ms bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    r record;
    ok boolean;
    detaches integer := 0;
BEGIN
    IF mode = 'create' THEN
        RETURN QUERY
            SELECT 'create', 'p' || l, (l / 1000.0)::text, ((l + slice_ms) / 1000.0)::text
              FROM generate_series((now_ms / slice_ms) * slice_ms, now_ms + ahead_ms, slice_ms) l
             WHERE NOT EXISTS (SELECT 1 FROM pg_class c
                                WHERE c.relnamespace = s::regnamespace AND c.relname = 'p' || l);
        RETURN;
    END IF;
    FOR r IN
        SELECT c.relname, i.inhdetachpending AS pending,
               substr(c.relname, 2)::bigint AS lo_ms
          FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = format('%I.outbox', s)::regclass
         ORDER BY 3
    LOOP
        IF r.pending THEN
            action := 'finalize'; name := r.relname; lo := NULL; hi := NULL;
            RETURN NEXT;
        ELSIF r.lo_ms + slice_ms < now_ms - window_s * 1000 AND detaches < 2 THEN
            EXECUTE format($q$SELECT NOT EXISTS (SELECT 1 FROM %I.%I
                                WHERE state NOT IN ('stored', 'dead') OR finished_at >= now() - make_interval(secs => $1))$q$,
                           s, r.relname) INTO ok USING window_s;
            IF ok THEN
                action := 'detach'; name := r.relname; lo := NULL; hi := NULL;
                detaches := detaches + 1;
                RETURN NEXT;
            END IF;
        END IF;
    END LOOP;
    -- tables detached earlier whose DROP failed (not ones just created, not yet attached)
    RETURN QUERY
        SELECT 'drop', c.relname::text, NULL::text, NULL::text
          FROM pg_class c
         WHERE c.relnamespace = s::regnamespace AND c.relkind = 'r' AND c.relname ~ '^p[0-9]+$'
           AND NOT c.relispartition AND substr(c.relname, 2)::bigint + slice_ms < now_ms;
END $$;

------------------------------------------------------------------------------ the loops
-- Each runs as one CALL until p_until, committing after every batch, like the extension's
-- wal_delivery.purge_finished procedure; sleeps run in their own transaction.

-- The relay: claim up to p_batch ready rows and mark them stored in one transaction, as the
-- relay does once Kafka acknowledged them; when it found fewer, wait p_idle seconds.
CREATE PROCEDURE bench.relay(p_design text, p_until timestamptz, p_batch integer, p_idle double precision)
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
    t0 timestamptz;
BEGIN
    WHILE clock_timestamp() < p_until LOOP
        t0 := clock_timestamp();
        IF p_design = 'A' THEN
            n := wal_delivery.mark_stored(ARRAY(SELECT id FROM wal_delivery.claim_ready_to_ship(p_batch)));
        ELSIF p_design = 'A-tuned' THEN
            n := bench_a2.mark_stored(ARRAY(SELECT id FROM bench_a2.claim_ready_to_ship(p_batch)));
        ELSIF p_design = 'B-keys' THEN
            SELECT bench_bk.mark_stored(coalesce(array_agg(c.id), '{}'), coalesce(array_agg(c.created_at), '{}')) INTO n
              FROM bench_bk.claim_ready_to_ship(p_batch) c;
        ELSE
            SELECT bench_bl.mark_stored(coalesce(array_agg(c.id), '{}'), coalesce(array_agg(c.created_at), '{}')) INTO n
              FROM bench_bl.claim_ready_to_ship(p_batch) c;
        END IF;
        IF n > 0 THEN
            INSERT INTO bench.events (design, kind, ms, n)
            VALUES (p_design, 'relay', extract(epoch FROM clock_timestamp() - t0) * 1000, n);
        END IF;
        COMMIT;
        IF n < p_batch THEN
            PERFORM pg_sleep(p_idle);
            COMMIT;
        END IF;
    END LOOP;
END $$;

-- A's purger (or A-tuned's): every p_every seconds, wal_delivery.purge_finished_rows(p_batch) until a batch
-- comes back short, each batch its own transaction (the body of wal_delivery.purge_finished),
-- each timed.
CREATE PROCEDURE bench.purge_a(p_design text, p_until timestamptz, p_batch integer, p_every double precision)
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
    t0 timestamptz;
    tick timestamptz;
BEGIN
    WHILE clock_timestamp() < p_until LOOP
        tick := clock_timestamp();
        LOOP
            t0 := clock_timestamp();
            IF p_design = 'A' THEN
                n := wal_delivery.purge_finished_rows(p_batch);
            ELSE
                n := bench_a2.purge_finished_rows(p_batch);
            END IF;
            INSERT INTO bench.events (design, kind, ms, n)
            VALUES (p_design, 'purge', extract(epoch FROM clock_timestamp() - t0) * 1000, n);
            COMMIT;
            EXIT WHEN n < p_batch;
        END LOOP;
        -- wait for the next tick in 0.1 s naps, so no snapshot of ours is older than that
        WHILE clock_timestamp() < least(tick + make_interval(secs => p_every), p_until) LOOP
            PERFORM pg_sleep(0.1);
            COMMIT;
        END LOOP;
    END LOOP;
END $$;

-- B-keys' key purger: keys older than the oldest partition still attached (their records
-- are gone), p_batch at a time, SKIP LOCKED, each batch its own transaction.
CREATE PROCEDURE bench.purge_keys(p_until timestamptz, p_batch integer, p_every double precision)
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
    t0 timestamptz;
    tick timestamptz;
    bound timestamptz;
BEGIN
    WHILE clock_timestamp() < p_until LOOP
        tick := clock_timestamp();
        LOOP
            t0 := clock_timestamp();
            SELECT to_timestamp(min(substr(c.relname, 2)::bigint) / 1000.0) INTO bound
              FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = 'bench_bk.outbox'::regclass;
            WITH doomed AS (
                SELECT k.ctid FROM bench_bk.keys k
                 WHERE k.created_at < bound
                 ORDER BY k.created_at LIMIT p_batch
                   FOR UPDATE SKIP LOCKED
            )
            DELETE FROM bench_bk.keys k USING doomed WHERE k.ctid = doomed.ctid;
            GET DIAGNOSTICS n = ROW_COUNT;
            INSERT INTO bench.events (design, kind, ms, n)
            VALUES ('B-keys', 'purge_keys', extract(epoch FROM clock_timestamp() - t0) * 1000, n);
            COMMIT;
            EXIT WHEN n < p_batch;
        END LOOP;
        -- wait for the next tick in 0.1 s naps, so no snapshot of ours is older than that
        WHILE clock_timestamp() < least(tick + make_interval(secs => p_every), p_until) LOOP
            PERFORM pg_sleep(0.1);
            COMMIT;
        END LOOP;
    END LOOP;
END $$;

-- One row per design into bench.cycles.
CREATE FUNCTION bench.snapshot(p_cycle integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    longest double precision;
BEGIN
    SELECT coalesce(max(extract(epoch FROM clock_timestamp() - xact_start)), 0) INTO longest
      FROM pg_stat_activity
     WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
       AND backend_type = 'client backend';

    INSERT INTO bench.cycles (cycle, design, total_bytes, extra_bytes, heap_bytes, rows, pending, oldest_s,
                              n_dead_tup, n_live_tup, partitions, autovacuums, longest_xact_s)
    SELECT p_cycle, 'A', pg_total_relation_size('wal_delivery.outbox'), 0, pg_relation_size('wal_delivery.outbox'),
           (SELECT count(*) FROM wal_delivery.outbox),
           (SELECT count(*) FROM wal_delivery.outbox WHERE state = 'pending'),
           (SELECT extract(epoch FROM clock_timestamp() - min(created_at)) FROM wal_delivery.outbox),
           s.n_dead_tup, s.n_live_tup, 1, s.autovacuum_count, longest
      FROM pg_stat_user_tables s WHERE s.relid = 'wal_delivery.outbox'::regclass;

    INSERT INTO bench.cycles (cycle, design, total_bytes, extra_bytes, heap_bytes, rows, pending, oldest_s,
                              n_dead_tup, n_live_tup, partitions, autovacuums, longest_xact_s)
    SELECT p_cycle, 'A-tuned', pg_total_relation_size('bench_a2.outbox'), 0, pg_relation_size('bench_a2.outbox'),
           (SELECT count(*) FROM bench_a2.outbox),
           (SELECT count(*) FROM bench_a2.outbox WHERE state = 'pending'),
           (SELECT extract(epoch FROM clock_timestamp() - min(created_at)) FROM bench_a2.outbox),
           s.n_dead_tup, s.n_live_tup, 1, s.autovacuum_count, longest
      FROM pg_stat_user_tables s WHERE s.relid = 'bench_a2.outbox'::regclass;

    INSERT INTO bench.cycles (cycle, design, total_bytes, extra_bytes, heap_bytes, rows, pending, oldest_s,
                              n_dead_tup, n_live_tup, partitions, autovacuums, longest_xact_s)
    SELECT p_cycle, d.design,
           (SELECT coalesce(sum(pg_total_relation_size(t.relid)), 0) FROM pg_partition_tree(d.parent) t WHERE t.isleaf)
             + coalesce(pg_total_relation_size(d.keys), 0),
           coalesce(pg_total_relation_size(d.keys), 0),
           (SELECT coalesce(sum(pg_relation_size(t.relid)), 0) FROM pg_partition_tree(d.parent) t WHERE t.isleaf)
             + coalesce(pg_relation_size(d.keys), 0),
           d.rows, d.pending, d.oldest,
           (SELECT coalesce(sum(s.n_dead_tup), 0) FROM pg_stat_user_tables s
             WHERE s.relid IN (SELECT relid FROM pg_partition_tree(d.parent) WHERE isleaf) OR s.relid = d.keys),
           (SELECT coalesce(sum(s.n_live_tup), 0) FROM pg_stat_user_tables s
             WHERE s.relid IN (SELECT relid FROM pg_partition_tree(d.parent) WHERE isleaf) OR s.relid = d.keys),
           (SELECT count(*) FROM pg_partition_tree(d.parent) WHERE isleaf),
           (SELECT coalesce(sum(s.autovacuum_count), 0) FROM pg_stat_user_tables s
             WHERE s.relid IN (SELECT relid FROM pg_partition_tree(d.parent) WHERE isleaf) OR s.relid = d.keys),
           longest
      FROM (VALUES
              ('B-keys', 'bench_bk.outbox'::regclass, 'bench_bk.keys'::regclass,
               (SELECT count(*) FROM bench_bk.outbox), (SELECT count(*) FROM bench_bk.outbox WHERE state = 'pending'),
               (SELECT extract(epoch FROM clock_timestamp() - min(created_at)) FROM bench_bk.outbox)),
              ('B-lookup', 'bench_bl.outbox'::regclass, NULL::regclass,
               (SELECT count(*) FROM bench_bl.outbox), (SELECT count(*) FROM bench_bl.outbox WHERE state = 'pending'),
               (SELECT extract(epoch FROM clock_timestamp() - min(created_at)) FROM bench_bl.outbox))
           ) d(design, parent, keys, rows, pending, oldest);
END $$;
