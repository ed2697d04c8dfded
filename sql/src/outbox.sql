-- The outbox: every enqueued record, from the transaction that wrote it until Kafka has
-- it (or it is dead), and then for its topic's idempotency window so a repeated key still
-- finds it.
--
-- Words used below:
--   record         one payload an application enqueued for one topic
--   finished row   an outbox row in state stored (in Kafka) or dead (in dead_letters)
--   the log        where records of topics without a processor go: append-only tables
--                  (outbox_log, three generations), never updated or deleted row by row
--   row table      outbox_rows: records with a per-row state machine (topics with a
--                  processor, and log records held back, see below)
--   lane           one of 8 parts of the log (log_lane(id)); each lane has one relay cursor and
--                  belongs to one relay worker, so relays ship side by side
--   cursor         per lane, which of its log records Kafka has acknowledged: every record
--                  whose transaction is visible in done_snap, plus, in the window being
--                  shipped (win_snap), those up to (pos_xid, pos_id). One update per
--                  relay batch, never one per record.
--   held           a log record the relay could not ship when its cursor passed it (topic
--                  not in Kafka, Kafka refused it, topic deleted): it is copied once into
--                  outbox_rows with the same id and goes on from there row by row, so the
--                  cursor never waits for it.
--
-- Why (docs/design.md, "The outbox's physical design"): the per-row stored update and the
-- per-row purge were two thirds of the WAL a record cost over its life; a record in the log
-- costs its insert and nothing after it: stored is derived from the cursor, and a whole
-- generation is TRUNCATEd once it is shipped and past the idempotency window.
--
-- The state machine of outbox_rows (each move is a function in relay.sql, processing.sql,
-- dead_letters.sql or retention.sql):
--   pending --claim_ready_to_ship, mark_stored--> stored          held records
--   pending --claim_ready_to_process--> processing --complete_processing--> processed
--           --claim_ready_to_ship, mark_stored--> stored          topics with a processor
--   processing --fail_processing, or its lease ran out--> pending again, or dead after
--           the topic's last attempt
--   pending or processed --mark_unshippable--> dead
--   dead --replay_dead_letter--> pending
--   stored or dead --purge_finished, after the topic's idempotency window--> deleted
-- A log record is pending until its lane's cursor passes it, then stored (or held).

CREATE TYPE wal_delivery.outbox_state AS ENUM ('pending', 'processing', 'processed', 'stored', 'dead');

-- Autovacuum settings for a queue table: vacuum early, by dead and by inserted rows.
-- vacuum_truncate is off, as measured by bench/retention: under steady writes autovacuum
-- kept trying to truncate the outbox's tail, could not get the lock, and gave up after 5 s
-- each time, which was most of its time; without truncation the table stayed smaller at
-- the same throughput. The cost: space after a peak is only returned by a manual
-- VACUUM (TRUNCATE).
-- Outbox ids, for the log and the row table alike (a held record keeps its id).
CREATE SEQUENCE wal_delivery.outbox_ids;

CREATE TABLE wal_delivery.outbox_rows (
    id bigint NOT NULL DEFAULT nextval('wal_delivery.outbox_ids') PRIMARY KEY,
    topic text NOT NULL,
    idempotency_key text NOT NULL,
    state wal_delivery.outbox_state NOT NULL DEFAULT 'pending',
    needs_processing boolean NOT NULL DEFAULT false,
    message_key text,                      -- the Kafka message key
    headers jsonb,                         -- extra Kafka headers, strings only
    content_type text NOT NULL,
    payload bytea NOT NULL,
    processed_payload bytea,
    attempts smallint NOT NULL DEFAULT 0,  -- processing claims so far
    lease_token bigint,
    lease_until timestamptz,
    available_at timestamptz NOT NULL DEFAULT now(),  -- not claimed before (backoff)
    last_error text,
    enqueued_by oid NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,               -- when it became stored or dead
    -- The session (login) user that enqueued it; with enqueued_by (the role it acted as),
    -- what my_records shows a writer.
    enqueued_by_session oid NOT NULL,
    -- A log record held here (Kafka did not take it when its lane's cursor passed it): its
    -- transaction's xid, so the log's copy is found by (lane, xid, id) and goes with this
    -- row when retention purges it (else the log's copy would show in the outbox again).
    held_xid xid8,
    CONSTRAINT outbox_rows_topic_idempotency_key UNIQUE (topic, idempotency_key)
) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_insert_scale_factor = 0.05,
        vacuum_truncate = off);

-- One partial index per claim routine, so each scans only rows it can take.
CREATE INDEX outbox_ready_to_ship ON wal_delivery.outbox_rows (available_at)
    WHERE (state = 'pending' AND NOT needs_processing) OR state = 'processed';
CREATE INDEX outbox_ready_to_process ON wal_delivery.outbox_rows (available_at)
    WHERE state = 'pending' AND needs_processing;
CREATE INDEX outbox_processing_leases ON wal_delivery.outbox_rows (lease_until)
    WHERE state = 'processing';
CREATE INDEX outbox_finished ON wal_delivery.outbox_rows (finished_at)
    WHERE state IN ('stored', 'dead');

-- The lane of a log record: runs of 64 consecutive ids share a lane, taking the 8 lanes
-- in turn (src/ext/outbox_log_layout.h, the one place the rule is written). A pass of the
-- relay at a steady rate then finds its few records in one lane, and moves one cursor.
CREATE FUNCTION wal_delivery.log_lane(id bigint) RETURNS smallint
LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', 'wal_delivery_log_lane';

-- A log record's place in the relay's order as one bigint: the lane in the top byte, the
-- xid below (src/ext/outbox_log_layout.h). The index is on (log_order(lane, xid), id), 16 B
-- of key where (lane, xid, id) had 24 with its padding: 29% more entries a page, so fewer
-- page splits, whose WAL was most of what a record cost beyond Debezium's (docs/design.md).
-- Every query that walks the index uses this expression; log_order(lane + 1, '0') is where
-- a lane's range ends.
CREATE FUNCTION wal_delivery.log_order(lane smallint, xid xid8) RETURNS bigint
LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', 'wal_delivery_log_order';

-- The log. Columns ordered to waste no alignment padding. gen is the generation, lane is
-- log_lane(id), caller_key whether the caller gave the idempotency key (false: generated, a
-- random UUID, new by construction), xid the enqueuing transaction. Indexes:
-- (log_order(lane, xid), id), the relay's order (lane, xid, id); (gen, topic,
-- idempotency_key) of the records with a caller's key only, the dedupe within a generation
-- (enqueue.sql looks in the others). A generated key needs no dedupe, and its index entry
-- (a random UUID: an insert anywhere in the index, a full-page image and splits after every
-- checkpoint) was about a fifth of a record's WAL.
-- No primary key: nothing looks a log record up by id on a hot path, and it would be one
-- more index insert per record. Autovacuum is off: nothing is ever updated or
-- deleted (aborted inserts excepted), a generation is truncated long before its xids need
-- freezing, and a vacuum would only write visibility-map WAL nobody reads.
CREATE TABLE wal_delivery.outbox_log (
    gen smallint NOT NULL,
    lane smallint NOT NULL,
    caller_key boolean NOT NULL,
    xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    id bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    enqueued_by oid NOT NULL,
    enqueued_by_session oid NOT NULL,
    topic text NOT NULL,
    idempotency_key text NOT NULL,
    message_key text,
    content_type text NOT NULL,
    headers jsonb,
    payload bytea NOT NULL
) PARTITION BY LIST (gen);
CREATE TABLE wal_delivery.outbox_log_0 PARTITION OF wal_delivery.outbox_log FOR VALUES IN (0)
    WITH (autovacuum_enabled = off);
CREATE TABLE wal_delivery.outbox_log_1 PARTITION OF wal_delivery.outbox_log FOR VALUES IN (1)
    WITH (autovacuum_enabled = off);
CREATE TABLE wal_delivery.outbox_log_2 PARTITION OF wal_delivery.outbox_log FOR VALUES IN (2)
    WITH (autovacuum_enabled = off);
CREATE INDEX outbox_log_lane_order ON wal_delivery.outbox_log (wal_delivery.log_order(lane, xid), id);
CREATE UNIQUE INDEX outbox_log_topic_idempotency_key ON wal_delivery.outbox_log (gen, topic, idempotency_key)
    WHERE caller_key;

-- The generations: the one with sealed_at NULL takes new records; a sealed one is
-- truncated once every record in it is shipped and its topics' windows have passed
-- (retention.sql), and later becomes the current one again.
CREATE TABLE wal_delivery.outbox_generations (
    gen smallint PRIMARY KEY CHECK (gen BETWEEN 0 AND 2),
    started_at timestamptz NOT NULL DEFAULT now(),
    sealed_at timestamptz
);
INSERT INTO wal_delivery.outbox_generations (gen, started_at, sealed_at)
VALUES (0, now(), NULL), (1, now(), now()), (2, now(), now());

-- The relay's cursor of each lane (see "cursor" above); acked_at is when done_snap last
-- moved. A new lane starts before the transaction of CREATE EXTENSION: nothing before it
-- exists, and a record enqueued in that same transaction is still to ship (its own
-- snapshot would count that transaction as visible, so it is not used as it is).
CREATE TABLE wal_delivery.relay_cursors (
    lane smallint PRIMARY KEY CHECK (lane BETWEEN 0 AND 7),
    done_snap pg_snapshot NOT NULL,
    win_snap pg_snapshot,
    pos_xid xid8,
    pos_id bigint,
    acked_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO wal_delivery.relay_cursors (lane, done_snap)
SELECT l, format('%1$s:%1$s:', least(pg_snapshot_xmin(pg_current_snapshot()), pg_current_xact_id()))::pg_snapshot
  FROM generate_series(0, 7) l;

-- The two rules on a log record and its lane's cursor c, each written once; the outbox and
-- backlog views, the rotation check (retention.sql) and the delete guard use them. Each is
-- one expression in LANGUAGE sql, so the planner inlines it into the query that calls it:
-- the query runs as if it were written there, the range below still walks the order index,
-- and no call is made per row. Like log_order they read nothing and are everyone's
-- (roles.sql): a view's functions are checked against its reader, a writer included.
--
-- Acknowledged: the record's transaction is visible in done_snap, or in win_snap and the
-- record is at or before (pos_xid, pos_id), where the relay stopped within that window.
CREATE FUNCTION wal_delivery.log_acked(p_xid xid8, p_id bigint, c wal_delivery.relay_cursors)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN pg_visible_in_snapshot(p_xid, c.done_snap)
       OR (c.win_snap IS NOT NULL AND pg_visible_in_snapshot(p_xid, c.win_snap)
           AND (p_xid, p_id) <= (c.pos_xid, c.pos_id));

-- Where the unacknowledged records of lane c can be: from done_snap's xmin (every older
-- transaction is acknowledged) to the lane's end, a range of the log's order index.
CREATE FUNCTION wal_delivery.log_in_unacked_range(p_lane smallint, p_xid xid8, c wal_delivery.relay_cursors)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN wal_delivery.log_order(p_lane, p_xid) >= wal_delivery.log_order(c.lane, pg_snapshot_xmin(c.done_snap))
       AND wal_delivery.log_order(p_lane, p_xid) < wal_delivery.log_order((c.lane + 1)::smallint, '0');

-- The outbox as DBAs and writers read it, whatever table a record is in: the row table,
-- and the log records not held there, with their state derived from their lane's cursor.
-- A stored log record's finished_at is when its lane's cursor last moved past a window
-- (at or after its acknowledgement).
CREATE VIEW wal_delivery.outbox AS
SELECT id, topic, idempotency_key, state, needs_processing, message_key, headers, content_type,
       payload, processed_payload, attempts, lease_token, lease_until, available_at, last_error,
       enqueued_by, created_at, finished_at, enqueued_by_session
  FROM wal_delivery.outbox_rows
UNION ALL
SELECT l.id, l.topic, l.idempotency_key,
       CASE WHEN a.acked THEN 'stored' ELSE 'pending' END::wal_delivery.outbox_state,
       false, l.message_key, l.headers, l.content_type, l.payload, NULL::bytea, 0::smallint,
       NULL::bigint, NULL::timestamptz, l.created_at, NULL::text, l.enqueued_by, l.created_at,
       CASE WHEN a.acked THEN c.acked_at END, l.enqueued_by_session
  FROM wal_delivery.outbox_log l
  JOIN wal_delivery.relay_cursors c ON c.lane = l.lane
 CROSS JOIN LATERAL (SELECT wal_delivery.log_acked(l.xid, l.id, c) AS acked) a
 WHERE NOT EXISTS (SELECT 1 FROM wal_delivery.outbox_rows r WHERE r.id = l.id);

-- Unshipped records by topic and state, with the oldest age.
CREATE VIEW wal_delivery.backlog AS
SELECT topic, state, count(*) AS records, min(created_at) AS oldest_created_at,
       now() - min(created_at) AS oldest_age
  FROM (SELECT topic, state, created_at FROM wal_delivery.outbox_rows
         WHERE state IN ('pending', 'processing', 'processed')
        UNION ALL
        -- Log records not acknowledged yet: only those at or after their lane's done_snap
        -- xmin can be, so this reads the lane order index from there to the lane's end.
        SELECT l.topic, 'pending'::wal_delivery.outbox_state, l.created_at
          FROM wal_delivery.relay_cursors c
          JOIN LATERAL (SELECT * FROM wal_delivery.outbox_log x
                         WHERE wal_delivery.log_in_unacked_range(x.lane, x.xid, c)) l ON true
         WHERE NOT wal_delivery.log_acked(l.xid, l.id, c)
           AND NOT EXISTS (SELECT 1 FROM wal_delivery.outbox_rows r WHERE r.id = l.id)) u
 GROUP BY topic, state;

-- What a writer may see: the status of the records this login enqueued acting as this
-- role. Both count: two logins that SET ROLE wal_delivery_writer act as one role, and a
-- pooler's one login acts as many roles; neither sees the other's records.
CREATE VIEW wal_delivery.my_records WITH (security_barrier) AS
SELECT id, topic, idempotency_key, state, attempts, created_at, finished_at, last_error
  FROM wal_delivery.outbox
 WHERE enqueued_by = (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user)
   AND enqueued_by_session = (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = session_user);

-- DELETE FROM wal_delivery.outbox (tests and DBAs clearing records) deletes the record
-- wherever it is. Row by row: the log has no index on id, so this is not for bulk work.
CREATE FUNCTION wal_delivery.delete_outbox_record() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM wal_delivery.outbox_rows WHERE id = OLD.id;
    DELETE FROM wal_delivery.outbox_log WHERE id = OLD.id;
    RETURN OLD;
END $$;

CREATE TRIGGER delete_outbox_record INSTEAD OF DELETE ON wal_delivery.outbox
    FOR EACH ROW EXECUTE FUNCTION wal_delivery.delete_outbox_record();
