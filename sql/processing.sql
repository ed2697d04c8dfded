-- Processing topics (0.8): claim_for_processor, run_sql_processor and finish_processing,
-- one outcome per line: processed, a failed attempt for each kind of bad processor result,
-- dead after the last attempt, and every refusal (stale token, expired lease, not held).
\pset format unaligned
\pset fieldsep ' | '
CREATE FUNCTION regress.proc_wrap(p bytea) RETURNS bytea LANGUAGE sql AS
$$ SELECT convert_to('{"w": ' || convert_from(p, 'UTF8') || '}', 'UTF8') $$;
CREATE FUNCTION regress.proc_raises(p bytea) RETURNS bytea LANGUAGE plpgsql AS
$$ BEGIN RAISE EXCEPTION 'cannot enrich %', convert_from(p, 'UTF8') USING ERRCODE = 'data_exception'; END $$;
CREATE FUNCTION regress.proc_null(p bytea) RETURNS bytea LANGUAGE sql AS $$ SELECT NULL::bytea $$;
CREATE FUNCTION regress.proc_garbage(p bytea) RETURNS bytea LANGUAGE sql AS $$ SELECT '\x00ff'::bytea $$;
CREATE FUNCTION regress.proc_big(p bytea) RETURNS bytea LANGUAGE sql AS $$ SELECT convert_to(repeat('"', 1) || repeat('x', 200) || '"', 'UTF8') $$;
CREATE FUNCTION regress.proc_gone(p bytea) RETURNS bytea LANGUAGE sql AS $$ SELECT p $$;
-- Tokens and times differ from run to run; the messages are shown without them.
CREATE FUNCTION regress.masked(t text) RETURNS text LANGUAGE sql AS
$$ SELECT regexp_replace(regexp_replace(t, 'token \d+', 'token N', 'g'), 'expired at [^,]*', 'expired at T', 'g') $$;
CREATE FUNCTION regress.proc_writes(p bytea) RETURNS bytea LANGUAGE plpgsql AS
$$ BEGIN CREATE TABLE regress.proc_side_effect (); RAISE EXCEPTION 'after a write'; END $$;

-- processing_timeout is checked like the other settings.
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas, processing_timeout) VALUES ('pr.bad', 1, 1, '0 seconds')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas, processing_timeout) VALUES ('pr.bad', 1, 1, '2 hours')$$);
SELECT * FROM regress.try('SELECT * FROM wal_delivery.claim_for_processor(0)');

INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas, processor_kind, processor,
                                 processing_max_attempts, processing_backoff, max_payload_bytes)
VALUES ('pr.wrap', 1, 1, 'sql', 'regress.proc_wrap', 5, '0 seconds', 100),
       ('pr.raises', 1, 1, 'sql', 'regress.proc_raises', 2, '1 minute', 100),
       ('pr.null', 1, 1, 'sql', 'regress.proc_null', 5, '1 minute', 100),
       ('pr.garbage', 1, 1, 'sql', 'regress.proc_garbage', 5, '1 minute', 100),
       ('pr.big', 1, 1, 'sql', 'regress.proc_big', 5, '1 minute', 100),
       ('pr.gone', 1, 1, 'sql', 'regress.proc_gone', 5, '1 minute', 100),
       ('pr.writes', 1, 1, 'sql', 'regress.proc_writes', 5, '1 minute', 100),
       ('pr.http', 1, 1, 'http', 'http://127.0.0.1:1/transform', 5, '1 minute', 100);
DROP FUNCTION regress.proc_gone(bytea);
DELETE FROM wal_delivery.outbox;
-- Fixed ids and tokens so the messages below are the same on every run.
ALTER TABLE wal_delivery.outbox ALTER COLUMN id RESTART WITH 2000;
ALTER SEQUENCE wal_delivery.lease_token_seq RESTART WITH 500;
SELECT wal_enqueue(t, '{"k": 1}'::jsonb, 'one') FROM unnest(ARRAY['pr.wrap', 'pr.raises', 'pr.null',
       'pr.garbage', 'pr.big', 'pr.gone', 'pr.writes', 'pr.http']) t ORDER BY 1;

-- One claim takes every processing row, each with its topic's processor and lease.
CREATE TEMP TABLE claimed AS SELECT * FROM wal_delivery.claim_for_processor(100);
SELECT id, topic, attempts, lease_ms_left BETWEEN 29000 AND 30000 AS lease_30s,
       processor_kind, processor, processing_timeout_ms, convert_from(payload, 'UTF8') AS payload
  FROM claimed ORDER BY id;
SELECT count(*) AS claimable_again FROM wal_delivery.claim_for_processor(100);

-- The SQL processors, one call: each row's outcome, and why unless processed.
SELECT r.id, r.outcome, regress.masked(r.detail) AS detail
  FROM wal_delivery.run_sql_processor((SELECT array_agg(id ORDER BY id) FROM claimed WHERE processor_kind = 'sql'),
                                      (SELECT array_agg(lease_token ORDER BY id) FROM claimed WHERE processor_kind = 'sql')) r;
SELECT topic, state, attempts, convert_from(processed_payload, 'UTF8') AS processed, last_error,
       CASE WHEN state = 'pending' THEN ceil(extract(epoch FROM available_at - now())) END AS backoff_s
  FROM wal_delivery.outbox ORDER BY id;
-- What a failing processor wrote is undone with its attempt.
SELECT to_regclass('regress.proc_side_effect') AS side_effect;

-- The HTTP processor's result comes back through finish_processing_batch; a stale token,
-- a row already processed and a row that does not exist are refused, nothing written.
SELECT id, outcome, regress.masked(detail) AS detail
  FROM wal_delivery.finish_processing_batch(ARRAY[2007, 2007, 2000, 99],
       ARRAY[(SELECT lease_token + 1000 FROM claimed WHERE id = 2007), (SELECT lease_token FROM claimed WHERE id = 2007),
             (SELECT lease_token FROM claimed WHERE id = 2000), 1],
       ARRAY['{"stale": 1}', '{"ok": true}', '{"again": 1}', '{}']::bytea[], ARRAY[NULL, NULL, NULL, NULL]::text[]);
SELECT state, convert_from(processed_payload, 'UTF8') AS processed FROM wal_delivery.outbox WHERE id = 2007;

-- Once the backoff is over, a second attempt each. After processing_max_attempts (2 for
-- pr.raises) the row is dead, with its last error; the others back off twice as long.
UPDATE wal_delivery.outbox SET available_at = now() WHERE state = 'pending';
CREATE TEMP TABLE again AS SELECT * FROM wal_delivery.claim_for_processor(100);
SELECT id, topic, attempts FROM again ORDER BY id;
SELECT r.id, r.outcome, r.detail FROM wal_delivery.run_sql_processor((SELECT array_agg(id ORDER BY id) FROM again),
                                                                     (SELECT array_agg(lease_token ORDER BY id) FROM again)) r;
SELECT topic, state, attempts, ceil(extract(epoch FROM available_at - now())) AS backoff_s
  FROM wal_delivery.outbox WHERE state = 'pending' ORDER BY id;
SELECT origin, topic, attempts, last_error FROM wal_delivery.dead_letters WHERE topic = 'pr.raises';

-- A lease that ran out by the clock refuses the result, even within the transaction that
-- claimed the row; the expiry then returns it to pending.
UPDATE wal_delivery.topics SET processing_lease = '1 millisecond' WHERE name = 'pr.wrap';
SELECT wal_enqueue('pr.wrap', '{"k": 2}'::jsonb, 'two');
CREATE TEMP TABLE short AS SELECT * FROM wal_delivery.claim_for_processor(100);
SELECT id, topic, attempts FROM short;
SELECT pg_sleep(0.01);
SELECT outcome, regress.masked(detail) AS detail
  FROM wal_delivery.finish_processing((SELECT id FROM short), (SELECT lease_token FROM short), '{"late": 1}', NULL);
SELECT r.outcome, regress.masked(r.detail) AS detail FROM wal_delivery.run_sql_processor((SELECT array_agg(id) FROM short),
                                                               (SELECT array_agg(lease_token) FROM short)) r;
SELECT wal_delivery.expire_processing_leases() AS expired;
SELECT state, attempts, processed_payload IS NULL AS nothing_written, last_error LIKE 'processing lease expired at %' AS why
  FROM wal_delivery.outbox WHERE idempotency_key = 'two';

-- The operators' view.
SELECT topic, processor_kind, pending, processing, lease_expired, processed, retrying, dead
  FROM wal_delivery.processing_status WHERE topic LIKE 'pr.%' ORDER BY topic;

SET wal_delivery.force_delete = on;
DELETE FROM wal_delivery.topics WHERE name LIKE 'pr.%';
RESET wal_delivery.force_delete;
