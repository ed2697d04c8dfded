-- The extension loads, is preloaded, and its library matches its SQL.
SELECT extname, extversion FROM pg_extension WHERE extname = 'wal_delivery';
SELECT wal_delivery.library_version();
SELECT 'wal_delivery' = ANY (string_to_array(current_setting('shared_preload_libraries'), ','))
    AS preloaded;
-- Its settings prefix is reserved: a misspelt setting is refused, not silently kept.
SET wal_delivery.no_such_setting = 1;

-- Helper for the tests that follow: runs a statement and shows its SQLSTATE, message
-- and hint, or 'ok'. The statement runs in a subtransaction, so a refused one leaves
-- nothing behind, which the tests then check.
CREATE SCHEMA regress;
GRANT USAGE ON SCHEMA regress TO PUBLIC;
CREATE FUNCTION regress.try(cmd text) RETURNS TABLE (sqlstate text, message text, hint text)
LANGUAGE plpgsql AS $$
DECLARE
    s text; m text; h text;
BEGIN
    EXECUTE cmd;
    RETURN QUERY SELECT 'ok'::text, NULL::text, NULL::text;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS s = RETURNED_SQLSTATE, m = MESSAGE_TEXT, h = PG_EXCEPTION_HINT;
    RETURN QUERY SELECT s, m, nullif(h, '');
END $$;
-- The relay's two moves on the log, for tests without Kafka (src/ext/relay.c makes them
-- after Kafka's reports). regress.ack_log: Kafka took every committed record, each lane's
-- cursor moves to the end of a window taken now. regress.hold: Kafka did not take this
-- record, it is copied into the row table and goes on row by row (the claim, mark_stored,
-- mark_unshippable, ...).
CREATE FUNCTION regress.ack_log() RETURNS void
LANGUAGE sql AS $$
    SELECT wal_delivery.advance_relay_cursor(lane, pg_current_snapshot(), true, NULL, NULL)
      FROM wal_delivery.relay_cursors;
$$;
CREATE FUNCTION regress.hold(p_id bigint) RETURNS integer
LANGUAGE sql AS $$
    SELECT wal_delivery.hold_log_records(array_agg(id), array_agg(xid))
      FROM wal_delivery.outbox_log WHERE id = p_id;
$$;
