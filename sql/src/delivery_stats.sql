-- Deliveries per minute, topic and destination: the rates, failures and charts of the
-- console's overview (or psql). `wal-worker consume` and `retry` count in memory and add
-- their counts here about every 10 s (src/workers/common/delivery_stats.c), one call of
-- add_delivery_stats per process and flush: one upsert per key. The same call deletes
-- minutes older than settings.delivery_stats_retention. Delivery never waits on this:
-- counts that cannot be added are kept by the worker for a while, then dropped with a
-- metric and a log line, so a rate here errs low (see docs/operations.md).
--
-- Words used below:
--   delivered      attempts answered 2xx (consume's first attempts and retries)
--   failed         attempts that failed: the copy went to a retry step or the DLQ
--   dead_lettered  copies handed to the DLQ (after failed attempts, or refused before one)

CREATE TABLE wal_delivery.delivery_stats (
    minute timestamptz NOT NULL,   -- the minute's start
    topic text NOT NULL,
    destination text NOT NULL,
    delivered bigint NOT NULL DEFAULT 0,
    failed bigint NOT NULL DEFAULT 0,
    dead_lettered bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (minute, topic, destination)
);

-- Adds a worker's counts: p_stats is an array of {minute (seconds since the epoch),
-- topic, destination, delivered, failed, dead_lettered}. Keys of unknown topics or
-- destinations and minutes outside the retention are skipped. Returns the keys added.
-- SECURITY DEFINER and granted to wal_delivery_worker only: a worker may add counts,
-- not read or change anything else. Keys are upserted in one order, so two workers'
-- flushes never deadlock; one flush at a time deletes old minutes, the others skip it
-- (as does a flush while an admin's transaction has changed the settings).
CREATE FUNCTION wal_delivery.add_delivery_stats(p_stats jsonb) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
    keep interval := (SELECT delivery_stats_retention FROM wal_delivery.settings);
BEGIN
    IF jsonb_typeof(p_stats) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'add_delivery_stats takes a JSON array of counts'
            USING ERRCODE = '22023', HINT = 'Send [{"minute": 1767225600, "topic": "t", "destination": "d", "delivered": 1, "failed": 0, "dead_lettered": 0}].';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_to_recordset(p_stats) AS r(delivered bigint, failed bigint, dead_lettered bigint)
                WHERE r.delivered < 0 OR r.failed < 0 OR r.dead_lettered < 0) THEN
        RAISE EXCEPTION 'add_delivery_stats adds counts: none may be negative'
            USING ERRCODE = '22023', HINT = 'Send the counts since the last call, 0 or more each.';
    END IF;
    INSERT INTO wal_delivery.delivery_stats AS s (minute, topic, destination, delivered, failed, dead_lettered)
    SELECT k.minute, k.topic, k.destination, k.delivered, k.failed, k.dead_lettered
      FROM (SELECT date_trunc('minute', to_timestamp(r.minute)) AS minute, r.topic, r.destination,
                   sum(coalesce(r.delivered, 0))::bigint AS delivered,
                   sum(coalesce(r.failed, 0))::bigint AS failed,
                   sum(coalesce(r.dead_lettered, 0))::bigint AS dead_lettered
              FROM jsonb_to_recordset(p_stats) AS r(minute double precision, topic text,
                       destination text, delivered bigint, failed bigint, dead_lettered bigint)
             WHERE r.topic IN (SELECT name FROM wal_delivery.topics)
               AND r.destination IN (SELECT name FROM wal_delivery.destinations)
               -- an hour inside the retention, so a flush never adds to a row being deleted
               AND to_timestamp(r.minute) > now() - keep + interval '1 hour'
               AND to_timestamp(r.minute) < now() + interval '1 hour'
             GROUP BY 1, 2, 3) k
     ORDER BY k.minute, k.topic, k.destination
    ON CONFLICT (minute, topic, destination) DO UPDATE
       SET delivered = s.delivered + EXCLUDED.delivered,
           failed = s.failed + EXCLUDED.failed,
           dead_lettered = s.dead_lettered + EXCLUDED.dead_lettered;
    GET DIAGNOSTICS n = ROW_COUNT;
    -- The settings row as the lock: only wal_delivery's routines and the admin may lock it,
    -- where an advisory lock is any login's to take and hold.
    IF EXISTS (SELECT FROM wal_delivery.settings FOR NO KEY UPDATE SKIP LOCKED) THEN
        DELETE FROM wal_delivery.delivery_stats WHERE minute < now() - keep;
    END IF;
    RETURN n;
END $$;

-- Per topic and destination: the last 5 minutes (from the start of the minute 5 minutes
-- ago to now, window_seconds long) and the last hour. Counts reach the table up to 10 s
-- late, so the newest seconds may be missing.
CREATE VIEW wal_delivery.delivery_rates AS
SELECT s.topic, s.destination,
       coalesce(sum(s.delivered) FILTER (WHERE s.minute >= w.start), 0)::bigint AS delivered_5m,
       coalesce(sum(s.failed) FILTER (WHERE s.minute >= w.start), 0)::bigint AS failed_5m,
       coalesce(sum(s.dead_lettered) FILTER (WHERE s.minute >= w.start), 0)::bigint AS dead_lettered_5m,
       sum(s.delivered)::bigint AS delivered_last_hour,
       sum(s.failed)::bigint AS failed_last_hour,
       sum(s.dead_lettered)::bigint AS dead_lettered_last_hour,
       extract(epoch FROM now() - w.start)::numeric(10, 1) AS window_seconds
  FROM wal_delivery.delivery_stats s,
       (SELECT date_trunc('minute', now()) - interval '5 minutes' AS start) w
 WHERE s.minute >= date_trunc('minute', now()) - interval '1 hour'
 GROUP BY s.topic, s.destination, w.start;
