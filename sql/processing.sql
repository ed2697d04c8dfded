-- Processing topics: claim_for_processor, run_sql_processor and finish_processing, one
-- outcome per line: processed, a failed attempt for each kind of bad processor result,
-- dead after the last attempt, and every refusal (stale token, expired lease, not held).
-- SQL processors run as settings.processing_role, only in a session a non-superuser
-- logged in to (regress_proc_worker, a member of wal_delivery_admin, like a worker), and
-- whatever they wrote is undone unless their result is stored.
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
CREATE FUNCTION regress.proc_whoami(p bytea) RETURNS bytea LANGUAGE sql AS
$$ SELECT convert_to(format('{"current_user": "%s", "session_user": "%s"}', current_user, session_user), 'UTF8') $$;
CREATE FUNCTION regress.proc_escalates(p bytea) RETURNS bytea LANGUAGE plpgsql AS
$$ BEGIN RESET ROLE; EXECUTE format('ALTER ROLE %I SUPERUSER', session_user); RETURN p; END $$;
CREATE FUNCTION regress.proc_sleeps(p bytea) RETURNS bytea LANGUAGE plpgsql AS
$$ BEGIN PERFORM pg_sleep(5); RETURN p; END $$;
CREATE TABLE regress.proc_log (what text);
CREATE FUNCTION regress.proc_logs_late(p bytea) RETURNS bytea LANGUAGE plpgsql AS
$$ BEGIN INSERT INTO regress.proc_log VALUES ('late'); PERFORM pg_sleep(0.05); RETURN p; END $$;
CREATE FUNCTION regress.proc_logs_null(p bytea) RETURNS bytea LANGUAGE plpgsql AS
$$ BEGIN INSERT INTO regress.proc_log VALUES ('null'); RETURN NULL; END $$;
-- What the processors need, granted to the processing role as a DBA would.
GRANT CREATE ON SCHEMA regress TO wal_delivery_processor;
GRANT INSERT, SELECT ON regress.proc_log TO wal_delivery_processor;
CREATE ROLE regress_proc_worker LOGIN IN ROLE wal_delivery_admin;
SELECT current_user AS regress_superuser \gset

-- processing_role must be a role processors may run as.
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET processing_role = 'regress_no_such_role'$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET processing_role = NULL$$);
SELECT sqlstate, replace(message, :'regress_superuser', '<superuser>') AS message
  FROM regress.try(format('UPDATE wal_delivery.settings SET processing_role = %L', :'regress_superuser'));
CREATE ROLE regress_proc_unreachable NOLOGIN;
CREATE ROLE regress_proc_creates NOLOGIN CREATEROLE;
GRANT regress_proc_creates TO wal_delivery_worker;
CREATE ROLE regress_proc_files NOLOGIN IN ROLE pg_read_server_files;
GRANT regress_proc_files TO wal_delivery_worker;
CREATE ROLE regress_proc_reads_all NOLOGIN IN ROLE pg_read_all_data;
GRANT regress_proc_reads_all TO wal_delivery_worker;
CREATE ROLE regress_proc_oncall NOLOGIN IN ROLE wal_delivery_oncall;
GRANT regress_proc_oncall TO wal_delivery_worker;
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET processing_role = 'regress_proc_unreachable'$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET processing_role = 'regress_proc_creates'$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET processing_role = 'regress_proc_files'$$);
-- Nor a role that holds what processors must not reach: every table, or wal_delivery's
-- rights.
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET processing_role = 'regress_proc_reads_all'$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET processing_role = 'regress_proc_oncall'$$);
DROP ROLE regress_proc_unreachable, regress_proc_creates, regress_proc_files, regress_proc_reads_all,
          regress_proc_oncall;
-- The worker's own role, set by an admin login: processors would run with the rights
-- that read every signing secret (worker_config()).
CREATE ROLE regress_proc_admin_login LOGIN IN ROLE wal_delivery_admin;
SET ROLE regress_proc_admin_login;
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET processing_role = 'wal_delivery_worker'$$);
RESET ROLE;
DROP ROLE regress_proc_admin_login;
SELECT processing_role FROM wal_delivery.settings;

-- processing_timeout is checked like the other settings.
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas, processing_timeout) VALUES ('pr.bad', 1, 1, '0 seconds')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas, processing_timeout) VALUES ('pr.bad', 1, 1, '2 hours')$$);
SELECT * FROM regress.try('SELECT * FROM wal_delivery.claim_for_processor(0)');
SELECT * FROM regress.try($$SELECT * FROM wal_delivery.claim_for_processor(1, 'grpc')$$);

INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas, processor_kind, processor,
                                 processing_max_attempts, processing_backoff, max_payload_bytes)
VALUES ('pr.wrap', 1, 1, 'sql', 'regress.proc_wrap', 5, '0 seconds', 100),
       ('pr.raises', 1, 1, 'sql', 'regress.proc_raises', 2, '1 minute', 100),
       ('pr.null', 1, 1, 'sql', 'regress.proc_null', 5, '1 minute', 100),
       ('pr.garbage', 1, 1, 'sql', 'regress.proc_garbage', 5, '1 minute', 100),
       ('pr.big', 1, 1, 'sql', 'regress.proc_big', 5, '1 minute', 100),
       ('pr.gone', 1, 1, 'sql', 'regress.proc_gone', 5, '1 minute', 100),
       ('pr.writes', 1, 1, 'sql', 'regress.proc_writes', 5, '1 minute', 100),
       ('pr.http', 1, 1, 'http', 'http://127.0.0.1:1/transform', 5, '1 minute', 100),
       ('pr.who', 1, 1, 'sql', 'regress.proc_whoami', 5, '1 minute', 100),
       ('pr.escalates', 1, 1, 'sql', 'regress.proc_escalates', 1, '1 minute', 100),
       ('pr.late', 1, 1, 'sql', 'regress.proc_logs_late', 5, '1 minute', 100),
       ('pr.nullw', 1, 1, 'sql', 'regress.proc_logs_null', 1, '1 minute', 100),
       ('pr.sleeps', 1, 1, 'sql', 'regress.proc_sleeps', 5, '1 minute', 100);
UPDATE wal_delivery.topics SET processing_lease = '1 millisecond' WHERE name = 'pr.late';
DROP FUNCTION regress.proc_gone(bytea);
DELETE FROM wal_delivery.outbox;
-- Fixed ids and tokens so the messages below are the same on every run.
ALTER SEQUENCE wal_delivery.outbox_ids RESTART WITH 2000;
ALTER SEQUENCE wal_delivery.lease_token_seq RESTART WITH 500;
SELECT wal_enqueue(t, '{"k": 1}'::jsonb, 'one') FROM unnest(ARRAY['pr.wrap', 'pr.raises', 'pr.null',
       'pr.garbage', 'pr.big', 'pr.gone', 'pr.writes', 'pr.http']) t ORDER BY 1;

-- From here on as a worker would: a non-superuser member of wal_delivery_admin.
\c - regress_proc_worker
-- One claim takes every processing row, each with its topic's processor and lease.
CREATE TEMP TABLE claimed AS SELECT * FROM wal_delivery.claim_for_processor(100);
SELECT id, topic, attempts, lease_ms_left BETWEEN 29000 AND 30000 AS lease_30s,
       processor_kind, processor, processing_timeout_ms, processing_lease_ms, max_payload_bytes,
       convert_from(payload, 'UTF8') AS payload
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
\c - :regress_superuser
UPDATE wal_delivery.outbox_rows SET available_at = now() WHERE state = 'pending';
\c - regress_proc_worker
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

-- Processors run as the processing role; one that resets its role is the worker, not a
-- superuser. Claims take one kind of processor at a time.
UPDATE wal_delivery.topics SET processing_lease = '30 seconds' WHERE name = 'pr.wrap';
SELECT wal_enqueue(t, '{"k": 3}'::jsonb, 'three') FROM unnest(ARRAY['pr.who', 'pr.escalates', 'pr.http']) t ORDER BY 1;
SELECT id, topic FROM wal_delivery.claim_for_processor(100, 'http') ORDER BY id;
CREATE TEMP TABLE sql_only AS SELECT * FROM wal_delivery.claim_for_processor(100, 'sql');
SELECT id, topic, processor_kind FROM sql_only ORDER BY id;
SELECT r.id, r.outcome, regress.masked(r.detail) AS detail FROM wal_delivery.run_sql_processor((SELECT array_agg(id ORDER BY id) FROM sql_only),
                                                                     (SELECT array_agg(lease_token ORDER BY id) FROM sql_only)) r;
SELECT topic, state, convert_from(processed_payload, 'UTF8') AS processed FROM wal_delivery.outbox
 WHERE topic IN ('pr.who', 'pr.escalates') ORDER BY id;
SELECT rolsuper FROM pg_roles WHERE rolname = 'regress_proc_worker';

-- What a processor wrote is undone when its result is refused (after the lease) or
-- cannot be stored (NULL), as when it raises. pr.late has a 1 ms lease: claimed and run
-- in one transaction, its lease starts again when its processor does, and ends before.
SELECT wal_enqueue(t, '{"k": 4}'::jsonb, 'four') FROM unnest(ARRAY['pr.late', 'pr.nullw']) t ORDER BY 1;
BEGIN;
CREATE TEMP TABLE undone ON COMMIT DROP AS SELECT * FROM wal_delivery.claim_for_processor(100, 'sql');
SELECT u.topic, r.outcome, regress.masked(r.detail) AS detail, r.timed_out
  FROM undone u, wal_delivery.run_sql_processor_row(u.id, u.lease_token) r ORDER BY u.id;
COMMIT;
SELECT count(*) AS writes_kept FROM regress.proc_log;

-- A processor cancelled by the statement timeout is a failed attempt of its own row, and
-- ends a call of many rows: the rows not started are given back, no attempt spent.
SELECT wal_enqueue('pr.sleeps', '{"k": 5}'::jsonb, 'five');
CREATE TEMP TABLE hung AS SELECT * FROM wal_delivery.claim_for_processor(1, 'sql');
BEGIN;
SET LOCAL statement_timeout = '100ms';
SELECT r.outcome, r.timed_out, regress.masked(r.detail) AS detail
  FROM hung h, wal_delivery.run_sql_processor_row(h.id, h.lease_token) r;
COMMIT;
SELECT state, attempts, last_error LIKE 'processor regress.proc_sleeps did not finish%' AS why
  FROM wal_delivery.outbox WHERE idempotency_key = 'five';
SELECT wal_enqueue('pr.sleeps', format('{"k": %s}', i)::jsonb, 'five-' || i) FROM generate_series(1, 2) i;
CREATE TEMP TABLE hung_two AS SELECT * FROM wal_delivery.claim_for_processor(2, 'sql');
BEGIN;
SET LOCAL statement_timeout = '100ms';
SELECT r.id, r.outcome, regress.masked(r.detail) AS detail
  FROM wal_delivery.run_sql_processor((SELECT array_agg(id ORDER BY id) FROM hung_two),
                                      (SELECT array_agg(lease_token ORDER BY id) FROM hung_two)) r;
COMMIT;
SELECT idempotency_key, state, attempts FROM wal_delivery.outbox WHERE idempotency_key LIKE 'five-%' ORDER BY id;

-- Rows given back unstarted do not spend an attempt; only their holder can give them back.
SELECT wal_enqueue('pr.wrap', '{"k": 6}'::jsonb, 'six');
CREATE TEMP TABLE unstarted AS SELECT * FROM wal_delivery.claim_for_processor(1, 'sql');
SELECT attempts FROM unstarted;
SELECT wal_delivery.release_processing_rows(ARRAY[id], ARRAY[lease_token + 1]) AS stale_released FROM unstarted;
SELECT wal_delivery.release_processing_rows(ARRAY[id], ARRAY[lease_token]) AS released FROM unstarted;
SELECT state, attempts, lease_until IS NULL AS lease_cleared FROM wal_delivery.outbox WHERE idempotency_key = 'six';

-- An expired lease is a failed attempt with the topic's backoff, like any other.
UPDATE wal_delivery.topics SET processing_backoff = '1 minute', processing_lease = '1 millisecond' WHERE name = 'pr.wrap';
SELECT count(*) AS claimed FROM wal_delivery.claim_for_processor(1, 'sql');
SELECT pg_sleep(0.01);
SELECT wal_delivery.expire_processing_leases() AS expired;
SELECT state, attempts, ceil(extract(epoch FROM available_at - now())) AS backoff_s
  FROM wal_delivery.outbox WHERE idempotency_key = 'six';

-- The operators' view.
SELECT topic, processor_kind, pending, processing, lease_expired, processed, retrying, dead
  FROM wal_delivery.processing_status WHERE topic LIKE 'pr.%' ORDER BY topic;

-- No SQL processor runs in a session a superuser logged in to, even acting as another role.
\c - :regress_superuser
SELECT wal_enqueue('pr.who', '{"k": 7}'::jsonb, 'seven');
SET SESSION AUTHORIZATION regress_proc_worker;
SELECT r.outcome, replace(r.detail, :'regress_superuser', '<superuser>') AS detail
  FROM wal_delivery.claim_for_processor(1, 'sql') c, wal_delivery.run_sql_processor_row(c.id, c.lease_token) r;
RESET SESSION AUTHORIZATION;

-- A processor may not leave a setting (SET, SET LOCAL) or a cursor WITH HOLD behind in
-- the worker's session, where they would act with the worker's rights once it returns:
-- the attempt fails and is undone. A SET clause on its own function is its own.
CREATE FUNCTION regress.proc_sets_path(p bytea) RETURNS bytea LANGUAGE plpgsql AS
$$ BEGIN SET search_path = regress, pg_catalog; RETURN p; END $$;
CREATE FUNCTION regress.proc_sets_local(p bytea) RETURNS bytea LANGUAGE plpgsql AS
$$ BEGIN PERFORM set_config('statement_timeout', '1', true); RETURN p; END $$;
CREATE FUNCTION regress.proc_holds_cursor(p bytea) RETURNS bytea LANGUAGE plpgsql AS
$$ BEGIN EXECUTE 'DECLARE held CURSOR WITH HOLD FOR SELECT 1'; RETURN p; END $$;
CREATE FUNCTION regress.proc_own_setting(p bytea) RETURNS bytea LANGUAGE sql
SET search_path = regress, pg_catalog SET work_mem = '8MB' AS 'SELECT p';
UPDATE wal_delivery.outbox_rows SET available_at = 'infinity' WHERE state = 'pending';
INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas, processor_kind, processor,
                                 processing_max_attempts)
VALUES ('pr.set_path', 1, 1, 'sql', 'regress.proc_sets_path', 1),
       ('pr.set_local', 1, 1, 'sql', 'regress.proc_sets_local', 1),
       ('pr.set_cursor', 1, 1, 'sql', 'regress.proc_holds_cursor', 1),
       ('pr.set_own', 1, 1, 'sql', 'regress.proc_own_setting', 1);
SELECT count(wal_enqueue(t, '{"k": 8}'::jsonb, 'eight')) AS enqueued
  FROM unnest(ARRAY['pr.set_path', 'pr.set_local', 'pr.set_cursor', 'pr.set_own']) t;
\c - regress_proc_worker
SELECT c.topic, r.outcome, r.detail
  FROM wal_delivery.claim_for_processor(10, 'sql') c, wal_delivery.run_sql_processor_row(c.id, c.lease_token) r
 ORDER BY c.topic;
SELECT current_setting('search_path') AS search_path, current_setting('statement_timeout') AS statement_timeout,
       (SELECT count(*) FROM pg_cursors) AS cursors;
\c - :regress_superuser

SET wal_delivery.force_delete = on;
DELETE FROM wal_delivery.topics WHERE name LIKE 'pr.%';
DROP TABLE regress.proc_log;
REVOKE ALL ON SCHEMA regress FROM wal_delivery_processor;
DROP OWNED BY regress_proc_worker;
DROP ROLE regress_proc_worker;
RESET wal_delivery.force_delete;
