-- Retention: finished rows stay in the outbox for their topic's idempotency window (so a
-- repeated key still finds its first id), then they are purged, by the maintenance
-- pass of the relay background worker (src/ext/relay.c) or by pg_cron: the row table row
-- by row, the log a whole generation at a time (rotate_outbox_log).

-- One batch of finished rows past their topic's idempotency window. Small batches with
-- SKIP LOCKED keep each transaction short and never wait on a relay or processor. A held
-- row takes its record's copy in the log with it (by the log's order index), so
-- the record neither shows in the outbox again nor keeps its key taken.
CREATE FUNCTION wal_delivery.purge_finished_rows(p_batch_size integer DEFAULT 1000) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
    shortest interval;
BEGIN
    SELECT coalesce(min(idempotency_window), interval '0') INTO shortest FROM wal_delivery.topics;
    WITH doomed AS (
        SELECT o.id FROM wal_delivery.outbox_rows o
          LEFT JOIN wal_delivery.topics t ON t.name = o.topic
         WHERE o.state IN ('stored', 'dead')
           AND o.finished_at < now() - shortest
           AND (t.name IS NULL OR o.finished_at < now() - t.idempotency_window)
         ORDER BY o.finished_at LIMIT p_batch_size
           FOR UPDATE OF o SKIP LOCKED
    ), gone AS (
        DELETE FROM wal_delivery.outbox_rows o USING doomed WHERE o.id = doomed.id
        RETURNING o.id, o.held_xid
    ), log_copies AS (
        DELETE FROM wal_delivery.outbox_log l USING gone
         WHERE gone.held_xid IS NOT NULL
           AND wal_delivery.log_order(l.lane, l.xid) = wal_delivery.log_order(wal_delivery.log_lane(gone.id), gone.held_xid)
           AND l.id = gone.id
    )
    SELECT count(*) INTO n FROM gone;
    RETURN n;
END $$;

-- Purges in batches, committing after each, until nothing is left or p_max_batches ran.
-- CALL it outside a transaction block (pg_cron or the maintenance worker do).
CREATE PROCEDURE wal_delivery.purge_finished(p_batch_size integer DEFAULT 1000, p_max_batches integer DEFAULT 1000)
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    FOR i IN 1 .. p_max_batches LOOP
        n := wal_delivery.purge_finished_rows(p_batch_size);
        COMMIT;
        EXIT WHEN n < p_batch_size;
    END LOOP;
END $$;

-- The log's rotation, run by the maintenance pass. A sealed generation whose newest
-- record is older than the longest idempotency window and whose every record Kafka has
-- (or is held in the row table) is TRUNCATEd: no per-record delete, no vacuum. The current
-- generation is sealed once it is older than that window (10 s at least), when the next
-- one is empty. Returns the number of generations truncated or sealed.
CREATE FUNCTION wal_delivery.rotate_outbox_log() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    longest interval;
    g record;
    cur smallint;
    unshipped boolean;
    n integer := 0;
BEGIN
    SELECT greatest(coalesce(max(idempotency_window), interval '0'), interval '10 seconds') INTO longest
      FROM wal_delivery.topics;
    FOR g IN SELECT gen FROM wal_delivery.outbox_generations
              WHERE sealed_at IS NOT NULL AND sealed_at < now() - longest ORDER BY sealed_at LOOP
        CONTINUE WHEN wal_delivery.log_generation_empty(g.gen);
        BEGIN
            -- Waits for no one: an enqueue that still writes to it, or a relay reading it,
            -- holds it for the next pass.
            EXECUTE format('LOCK TABLE wal_delivery.outbox_log_%s IN ACCESS EXCLUSIVE MODE NOWAIT', g.gen);
        EXCEPTION WHEN lock_not_available THEN
            CONTINUE;
        END;
        -- Under the lock, with a snapshot taken now: every record ever written to it.
        EXECUTE format($q$
            SELECT EXISTS (SELECT 1 FROM wal_delivery.outbox_log_%s l
                             JOIN wal_delivery.relay_cursors c ON c.lane = l.lane
                            WHERE wal_delivery.log_in_unacked_range(l.lane, l.xid, c)
                              AND NOT wal_delivery.log_acked(l.xid, l.id, c)
                              AND NOT EXISTS (SELECT 1 FROM wal_delivery.outbox_rows r WHERE r.id = l.id))$q$, g.gen)
            INTO unshipped;
        CONTINUE WHEN unshipped;
        EXECUTE format('TRUNCATE wal_delivery.outbox_log_%s', g.gen);
        n := n + 1;
    END LOOP;

    SELECT gen INTO cur FROM wal_delivery.outbox_generations WHERE sealed_at IS NULL AND started_at < now() - longest;
    IF FOUND AND wal_delivery.log_generation_empty(((cur + 1) % 3)::smallint) THEN
        UPDATE wal_delivery.outbox_generations SET sealed_at = now() WHERE gen = cur;
        UPDATE wal_delivery.outbox_generations SET started_at = now(), sealed_at = NULL WHERE gen = (cur + 1) % 3;
        n := n + 1;
    END IF;
    RETURN n;
END $$;

-- Whether a generation of the log holds no record (not even a rolled-back one).
CREATE FUNCTION wal_delivery.log_generation_empty(p_gen smallint) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pages bigint;
BEGIN
    EXECUTE format('SELECT pg_relation_size(%L)', 'wal_delivery.outbox_log_' || p_gen) INTO pages;
    RETURN pages = 0;
END $$;
