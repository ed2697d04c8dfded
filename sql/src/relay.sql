-- The relay's side of the outbox: the relay background worker (src/ext/relay.c) claims
-- rows ready to ship, produces them to Kafka, and marks what Kafka acknowledged.

-- Wakes the relay when the calling transaction commits (once per transaction; nothing on
-- rollback). Enqueue and processing call it.
CREATE FUNCTION wal_delivery.wake_relay_at_commit() RETURNS void
LANGUAGE c AS 'MODULE_PATHNAME', 'wal_delivery_wake_relay_at_commit';

-- How many committed transactions have woken the relay since the server started.
CREATE FUNCTION wal_delivery.relay_wakeups() RETURNS bigint
LANGUAGE c AS 'MODULE_PATHNAME', 'wal_delivery_relay_wakeups';

-- The relay claim. Rows ready to ship to Kafka: plain pending rows and processed rows,
-- oldest first. They stay locked (FOR UPDATE SKIP LOCKED) until the caller's transaction
-- ends, so relays side by side never take the same row and a crashed relay leaves them
-- claimable.
CREATE FUNCTION wal_delivery.claim_ready_to_ship(p_max_rows integer DEFAULT 100)
RETURNS TABLE (id bigint, topic text, idempotency_key text, message_key text, headers jsonb,
               content_type text, payload bytea, created_at timestamptz)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT o.id, o.topic, o.idempotency_key, o.message_key, o.headers, o.content_type,
           coalesce(o.processed_payload, o.payload), o.created_at
      FROM wal_delivery.outbox o
     WHERE ((o.state = 'pending' AND NOT o.needs_processing) OR o.state = 'processed')
       AND o.available_at <= now()
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
    SELECT state, needs_processing INTO r FROM wal_delivery.outbox WHERE id = p_id;
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
-- AND ready to ship" was planned as a scan of the whole ready-to-ship index, 110 ms per
-- call against 10 ms (bench/relay).
CREATE FUNCTION wal_delivery.mark_stored(p_ids bigint[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
    bad bigint;
BEGIN
    UPDATE wal_delivery.outbox o
       SET state = 'stored', finished_at = now(), last_error = NULL
      FROM (SELECT DISTINCT unnest(p_ids) AS id) ids
     WHERE o.id = ids.id
       AND ((o.state = 'pending' AND NOT o.needs_processing) OR o.state = 'processed');
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n < (SELECT count(DISTINCT i) FROM unnest(p_ids) i) THEN
        -- All or nothing: name the first row that was not ready (this aborts the update).
        SELECT i INTO bad FROM unnest(p_ids) i
         WHERE NOT EXISTS (SELECT 1 FROM wal_delivery.outbox x WHERE x.id = i AND x.finished_at = now())
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
    UPDATE wal_delivery.outbox SET available_at = now() + p_delay, last_error = p_error
     WHERE id = ANY (p_ids) AND ((state = 'pending' AND NOT needs_processing) OR state = 'processed');
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- A row that can never be shipped (too large for the broker, topic cannot be created).
CREATE FUNCTION wal_delivery.mark_unshippable(p_id bigint, p_error text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM 1 FROM wal_delivery.outbox
     WHERE id = p_id AND ((state = 'pending' AND NOT needs_processing) OR state = 'processed') FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM wal_delivery.refuse_ship_transition(p_id);
    END IF;
    PERFORM wal_delivery.bury_row(p_id, 'relay', p_error);
END $$;
