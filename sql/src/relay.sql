-- The relay's side of the outbox: the relay background worker (src/ext/relay.c) reads
-- the log lane by lane after its cursor, claims rows of the row table ready to ship,
-- produces them to Kafka, and moves the cursor or marks what Kafka acknowledged.

-- Wakes the relay when the calling transaction commits (once per transaction; nothing on
-- rollback). Enqueue and processing call it.
CREATE FUNCTION wal_delivery.wake_relay_at_commit() RETURNS void
LANGUAGE c AS 'MODULE_PATHNAME', 'wal_delivery_wake_relay_at_commit';

-- How many committed transactions have woken the relay since the server started.
CREATE FUNCTION wal_delivery.relay_wakeups() RETURNS bigint
LANGUAGE c AS 'MODULE_PATHNAME', 'wal_delivery_relay_wakeups';

-- What the relays did since the server started: passes run, and lanes of the log read
-- (a pass reads the lanes the commits that woke it wrote, and every lane now and then).
-- What a record costs the database host follows from these (bench/relay_latency).
-- possible_duplicates: records Kafka may have stored though it never acknowledged them
-- (timed out or purged after being sent); each is sent again, so each may be a second copy.
CREATE FUNCTION wal_delivery.relay_passes(OUT passes bigint, OUT lanes_read bigint,
                                          OUT possible_duplicates bigint)
LANGUAGE c AS 'MODULE_PATHNAME', 'wal_delivery_relay_passes';

-- What became of the relays' spans since the server started (wal_delivery.otlp_endpoint):
-- accepted by the collector, or dropped because the relay's buffer was full, the
-- collector failed or did not answer in time, or the relay stopped or the endpoint changed
-- before they were sent; and the export requests that failed. A down collector shows here,
-- never as a slower relay.
CREATE FUNCTION wal_delivery.relay_span_export(OUT spans_exported bigint,
    OUT spans_dropped_buffer_full bigint, OUT spans_dropped_export_failed bigint,
    OUT spans_dropped_discarded bigint, OUT export_requests_failed bigint)
LANGUAGE c AS 'MODULE_PATHNAME', 'wal_delivery_relay_span_export';

-- The relay claim. Rows ready to ship to Kafka: plain pending rows and processed rows,
-- oldest first. They stay locked (FOR UPDATE SKIP LOCKED) until the caller's transaction
-- ends, so relays side by side never take the same row and a crashed relay leaves them
-- claimable.
CREATE FUNCTION wal_delivery.claim_ready_to_ship(p_max_rows integer DEFAULT 100)
RETURNS TABLE (id bigint, topic text, idempotency_key text, message_key text, headers jsonb,
               content_type text, payload bytea, created_at timestamptz)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT * FROM wal_delivery.claim_ready_to_ship(p_max_rows, NULL)
$$;

-- The same, passing over the rows of p_skip_topics: topics Kafka did not take records of
-- a moment ago, which the relay tries again later without rewriting their rows, so they
-- hold up neither the other topics nor the WAL.
CREATE FUNCTION wal_delivery.claim_ready_to_ship(p_max_rows integer, p_skip_topics text[])
RETURNS TABLE (id bigint, topic text, idempotency_key text, message_key text, headers jsonb,
               content_type text, payload bytea, created_at timestamptz)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT o.id, o.topic, o.idempotency_key, o.message_key, o.headers, o.content_type,
           coalesce(o.processed_payload, o.payload), o.created_at
      FROM wal_delivery.outbox_rows o
     WHERE ((o.state = 'pending' AND NOT o.needs_processing) OR o.state = 'processed')
       AND o.available_at <= now()
       AND (p_skip_topics IS NULL OR o.topic <> ALL (p_skip_topics))
     ORDER BY o.available_at
     LIMIT p_max_rows
       FOR UPDATE SKIP LOCKED
$$;

-- Names why a row cannot take a shipping transition: missing, or not ready to ship.
CREATE FUNCTION wal_delivery.refuse_ship_transition(p_id bigint) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    SELECT state, needs_processing INTO r FROM wal_delivery.outbox_rows WHERE id = p_id;
    IF NOT FOUND AND EXISTS (SELECT 1 FROM wal_delivery.outbox_log WHERE id = p_id) THEN
        RAISE EXCEPTION 'outbox record % is in the log, not the row table', p_id
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'A log record is stored when its lane''s relay cursor passes it after Kafka''s acknowledgement; only rows returned by wal_delivery.claim_ready_to_ship can be marked stored or unshippable.';
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'outbox row % does not exist', p_id
            USING ERRCODE = 'undefined_object', HINT = 'It may have been purged after its idempotency window.';
    END IF;
    RAISE EXCEPTION 'outbox row % is %, not ready to ship', p_id, r.state::text ||
                    CASE WHEN r.needs_processing AND r.state IN ('pending', 'processing') THEN ' (its topic needs processing first)' ELSE '' END
        USING ERRCODE = 'object_not_in_prerequisite_state',
              HINT = 'Only rows returned by wal_delivery.claim_ready_to_ship can be marked stored or unshippable.';
END $$;

-- Kafka acknowledged these rows with their topic's acks. All or nothing. It finds its
-- rows by primary key: with statistics taken while nothing was pending, "id = ANY(...)
-- AND ready to ship" was planned as a scan of the whole ready-to-ship index on every call
-- (bench/relay).
CREATE FUNCTION wal_delivery.mark_stored(p_ids bigint[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
    bad bigint;
BEGIN
    UPDATE wal_delivery.outbox_rows o
       SET state = 'stored', finished_at = now(), last_error = NULL
      FROM (SELECT DISTINCT unnest(p_ids) AS id) ids
     WHERE o.id = ids.id
       AND ((o.state = 'pending' AND NOT o.needs_processing) OR o.state = 'processed');
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n < (SELECT count(DISTINCT i) FROM unnest(p_ids) i) THEN
        -- All or nothing: name the first row that was not ready (this aborts the update).
        SELECT i INTO bad FROM unnest(p_ids) i
         WHERE NOT EXISTS (SELECT 1 FROM wal_delivery.outbox_rows x WHERE x.id = i AND x.finished_at = now())
         LIMIT 1;
        PERFORM wal_delivery.refuse_ship_transition(bad);
    END IF;
    RETURN n;
END $$;

-- Shipping failed in a way worth retrying: try again after p_delay.
CREATE FUNCTION wal_delivery.defer_shipping(p_ids bigint[], p_error text, p_delay interval) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
BEGIN
    UPDATE wal_delivery.outbox_rows SET available_at = now() + p_delay, last_error = p_error
     WHERE id = ANY (p_ids) AND ((state = 'pending' AND NOT needs_processing) OR state = 'processed');
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- Why Kafka did not take these rows this time (p_errors lines up with p_ids), for
-- my_records and the outbox. Only a row whose reason changed is written: rows retried
-- through a long outage are not rewritten on every try.
CREATE FUNCTION wal_delivery.note_shipping_failures(p_ids bigint[], p_errors text[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
BEGIN
    UPDATE wal_delivery.outbox_rows o SET last_error = f.error
      FROM unnest(p_ids, p_errors) AS f(id, error)
     WHERE o.id = f.id AND ((o.state = 'pending' AND NOT o.needs_processing) OR o.state = 'processed')
       AND o.last_error IS DISTINCT FROM f.error;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- Rows whose topic is not in Kafka (yet): they wait, untouched, until the reconciler has
-- the topic (release_rows_waiting_for_topics in reconcile.sql lets them go). One write
-- each, here, and none while they wait, however long Kafka takes. A row whose topic
-- came into Kafka since the caller looked is left as it is, to ship now.
CREATE FUNCTION wal_delivery.wait_for_topic(p_ids bigint[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
BEGIN
    UPDATE wal_delivery.outbox_rows o
       SET available_at = 'infinity',
           last_error = format('waiting for Kafka topic "%s" (wal_delivery.reconcile_status says why): %s', o.topic,
                               coalesce((SELECT k.error FROM wal_delivery.kafka_topics k WHERE k.topic = o.topic),
                                        'the reconciler has not created it yet'))
     WHERE o.id = ANY (p_ids) AND ((o.state = 'pending' AND NOT o.needs_processing) OR o.state = 'processed')
       AND NOT EXISTS (SELECT 1 FROM wal_delivery.kafka_topics k
                        WHERE k.topic = o.topic AND k.role = 'main' AND k.in_kafka);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- A row that can never be shipped (Kafka refuses it as too large, its topic was deleted).
CREATE FUNCTION wal_delivery.mark_unshippable(p_id bigint, p_error text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM 1 FROM wal_delivery.outbox_rows
     WHERE id = p_id AND ((state = 'pending' AND NOT needs_processing) OR state = 'processed') FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM wal_delivery.refuse_ship_transition(p_id);
    END IF;
    PERFORM wal_delivery.bury_row(p_id, 'relay', p_error);
END $$;

-- Log records the relay could not ship when its cursor passed them: copied once into the
-- row table, same id, pending, so the cursor moves on and they go on row by row
-- (wait_for_topic, note_shipping_failures, mark_unshippable). Returns how many.
CREATE FUNCTION wal_delivery.hold_log_records(p_ids bigint[], p_xids xid8[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
BEGIN
    -- By the log's order index (log_order(lane, xid), id), its one besides the dedupe one.
    INSERT INTO wal_delivery.outbox_rows (id, topic, idempotency_key, needs_processing, message_key, headers,
                                          content_type, payload, enqueued_by, created_at, enqueued_by_session,
                                          held_xid)
    SELECT l.id, l.topic, l.idempotency_key, false, l.message_key, l.headers, l.content_type, l.payload,
           l.enqueued_by, l.created_at, l.enqueued_by_session, l.xid
      FROM unnest(p_ids, p_xids) AS h(id, xid)
      JOIN wal_delivery.outbox_log l
        ON wal_delivery.log_order(l.lane, l.xid) = wal_delivery.log_order(wal_delivery.log_lane(h.id), h.xid)
       AND l.id = h.id
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- Moves a lane's cursor after a batch: past (p_pos_xid, p_pos_id) in window p_win, or, when
-- the batch was the window's last (p_window_done), to the end of the window.
CREATE FUNCTION wal_delivery.advance_relay_cursor(p_lane smallint, p_win pg_snapshot, p_window_done boolean,
                                                  p_pos_xid xid8, p_pos_id bigint) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    UPDATE wal_delivery.relay_cursors
       SET done_snap = CASE WHEN p_window_done THEN p_win ELSE done_snap END,
           win_snap = CASE WHEN p_window_done THEN NULL ELSE p_win END,
           pos_xid = CASE WHEN p_window_done THEN NULL ELSE p_pos_xid END,
           pos_id = CASE WHEN p_window_done THEN NULL ELSE p_pos_id END,
           acked_at = CASE WHEN p_window_done THEN now() ELSE acked_at END
     WHERE lane = p_lane;
$$;
