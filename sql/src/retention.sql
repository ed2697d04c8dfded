-- Retention: finished rows stay in the outbox for their topic's idempotency window (so a
-- repeated key still finds its first id), then they are purged, by the maintenance
-- pass of the relay background worker (src/ext/relay.c) or by pg_cron.

-- One batch of finished rows past their topic's idempotency window. Small batches with
-- SKIP LOCKED keep each transaction short and never wait on a relay or processor.
CREATE FUNCTION wal_delivery.purge_finished_rows(p_batch_size integer DEFAULT 1000) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
    shortest interval;
BEGIN
    SELECT coalesce(min(idempotency_window), interval '0') INTO shortest FROM wal_delivery.topics;
    WITH doomed AS (
        SELECT o.id FROM wal_delivery.outbox o
          LEFT JOIN wal_delivery.topics t ON t.name = o.topic
         WHERE o.state IN ('stored', 'dead')
           AND o.finished_at < now() - shortest
           AND (t.name IS NULL OR o.finished_at < now() - t.idempotency_window)
         ORDER BY o.finished_at LIMIT p_batch_size
           FOR UPDATE OF o SKIP LOCKED
    )
    DELETE FROM wal_delivery.outbox o USING doomed WHERE o.id = doomed.id;
    GET DIAGNOSTICS n = ROW_COUNT;
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
