-- The on-call role (wal-worker console, or psql): it reads dead letters and the delivery
-- status, replays, resolves, pauses and resumes, and each of those changes is in
-- audit_log with the login that made it. It reads no secret and no config, and changes
-- neither; it changes dead letters only through the audited functions.
\pset format unaligned
\pset fieldsep ' | '
INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas) VALUES ('oc.events', 1, 1);
INSERT INTO wal_delivery.destinations (name, endpoint, headers)
VALUES ('oc-dest', 'https://example.test/hook', '{"Authorization": "Bearer oc-token"}');
INSERT INTO wal_delivery.destination_secrets VALUES ('oc-dest', 'whsec_0123456789abcdef');
CREATE ROLE regress_oncall LOGIN IN ROLE wal_delivery_oncall;
SELECT wal_delivery.ingest_dead_letter('dlq', 0, o, 'oc.events', 'oc-' || o, 'oc-dest', NULL,
                                       'application/json', '{"n": 1}', 5, 'HTTP 400', '{}') IS NOT NULL AS ingested
  FROM generate_series(1, 6) o;
SELECT min(id) AS first_id FROM wal_delivery.dead_letters WHERE topic = 'oc.events' \gset

SET SESSION AUTHORIZATION regress_oncall;
-- What it reads.
SELECT count(*) AS dead_letters FROM wal_delivery.dead_letters WHERE topic = 'oc.events';
SELECT topic, waiting, unresolved_dead_letters, dead_letters_last_hour FROM wal_delivery.topic_status WHERE topic = 'oc.events';
SELECT destination, breaker FROM wal_delivery.destination_status WHERE destination = 'oc-dest';
SELECT (wal_delivery.inspect_dead_letter(:first_id))->>'payload' AS payload;
-- What it may not read: secrets, and the config that may hold them (headers, the
-- workers' config document), and the rest of the control plane.
SELECT * FROM regress.try('SELECT signing_secret FROM wal_delivery.destination_secrets');
SELECT * FROM regress.try('SELECT headers FROM wal_delivery.destinations');
SELECT * FROM regress.try('SELECT wal_delivery.worker_config()');
SELECT * FROM regress.try('SELECT * FROM wal_delivery.topics');
SELECT * FROM regress.try('SELECT * FROM wal_delivery.settings');
SELECT * FROM regress.try('SELECT * FROM wal_delivery.archive_credentials');
SELECT * FROM regress.try('SELECT * FROM wal_delivery.ingest_tokens');
-- What it may not change: config, and dead letters or the audit log around the functions.
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name) VALUES ('oc.mine')$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.destinations SET endpoint = 'https://evil.test/'$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET dlq_topic = 'x'$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.dead_letters SET resolved_at = now()$$);
SELECT * FROM regress.try('DELETE FROM wal_delivery.dead_letters');
SELECT * FROM regress.try($$INSERT INTO wal_delivery.audit_log (who, action, target) VALUES ('x', 'pause', '{}')$$);
SELECT * FROM regress.try('DELETE FROM wal_delivery.audit_log');
SELECT * FROM regress.try($$SELECT wal_delivery.write_audit('pause', '{}', 1)$$);
SELECT * FROM regress.try($$SELECT wal_delivery.requeue_dead_letter(1)$$);
SELECT * FROM regress.try($$SELECT wal_delivery.pause_destination('oc-dest', 1, 'x', '1 minute')$$);
SELECT * FROM regress.try($$SELECT wal_delivery.restore_dead_letters('x')$$);
SELECT * FROM regress.try($$SELECT wal_delivery.create_ingest_token('x', NULL)$$);
-- What it does, each audited.
SELECT wal_delivery.replay_dead_letter(:first_id) AS replayed;
SELECT wal_delivery.resolve_dead_letter(:first_id + 1, 'fixed by hand') IS NOT NULL AS resolved;
SELECT wal_delivery.replay_dead_letters_by_id(ARRAY[:first_id, :first_id + 2, :first_id + 3]) AS replayed_by_id;
SELECT wal_delivery.resolve_dead_letters_by_id(ARRAY[:first_id + 4, :first_id + 5, :first_id + 1], 'customer deleted') AS resolved_by_id;
SELECT * FROM regress.try($$SELECT wal_delivery.resolve_dead_letters_by_id(ARRAY[1], ' ')$$);
SELECT wal_delivery.resolve_dead_letters('bulk', 'oc-dest') AS resolved_by_filter;
SELECT wal_delivery.hold_destination('oc-dest', 'their maintenance') AS held;
SELECT wal_delivery.hold_destination('oc-dest', 'again') AS held_again;
SELECT * FROM regress.try($$SELECT wal_delivery.hold_destination('nope', 'x')$$);
RESET SESSION AUTHORIZATION;
-- A hold gets no probe and outlasts the breaker's own pause; only a resume ends it.
SELECT paused, next_probe_at, reason FROM wal_delivery.destination_pauses WHERE destination = 'oc-dest';
SELECT wal_delivery.claim_probe('oc-dest', 'w1', '1 minute') AS probe_claimed;
SELECT wal_delivery.pause_destination('oc-dest', 2, 'HTTP 503', '0 seconds') AS breaker_paused;
SELECT wal_delivery.claim_probe('oc-dest', 'w1', '1 minute') AS probe_claimed_after_breaker;
SET SESSION AUTHORIZATION regress_oncall;
SELECT wal_delivery.resume_destination('oc-dest') AS resumed;
SELECT wal_delivery.resume_destination('oc-dest') AS resumed_again;
-- Ids relative to the first dead letter, so the output does not depend on earlier tests.
SELECT who, action, target - 'id' - 'ids' AS target, (target->>'id')::bigint - :first_id AS id,
       ARRAY(SELECT x::bigint - :first_id FROM jsonb_array_elements_text(target->'ids') x) AS ids, count
  FROM wal_delivery.audit_log ORDER BY id;
RESET SESSION AUTHORIZATION;
-- The same actions from a superuser's psql are audited under that login.
SELECT wal_delivery.hold_destination('oc-dest', NULL) AS held_by_superuser;
SELECT who = session_user AS who_is_the_login, action, target FROM wal_delivery.audit_log ORDER BY id DESC LIMIT 1;

-- Everything the on-call role may execute and use, so a new grant shows up here.
SELECT p.oid::regprocedure AS oncall_may_execute
  FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.classid = 'pg_proc'::regclass AND d.deptype = 'e'
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'wal_delivery')
   AND has_function_privilege('regress_oncall', p.oid, 'EXECUTE')
 ORDER BY p.oid::regprocedure::text COLLATE "C";
SELECT c.oid::regclass AS oncall_may_use,
       array_to_string(ARRAY(SELECT x FROM unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE',
                                                         'REFERENCES', 'TRIGGER']) x
                              WHERE has_table_privilege('regress_oncall', c.oid, x)), ',') AS privileges
  FROM pg_class c
 WHERE c.relnamespace = 'wal_delivery'::regnamespace AND c.relkind IN ('r', 'v', 'm', 'p', 'f')
   AND (has_table_privilege('regress_oncall', c.oid, 'SELECT,INSERT,UPDATE,DELETE,TRUNCATE,REFERENCES,TRIGGER')
        OR has_any_column_privilege('regress_oncall', c.oid, 'SELECT,INSERT,UPDATE,REFERENCES'))
 ORDER BY c.oid::regclass::text COLLATE "C";

-- Deliveries per minute (delivery_stats): only the workers' role adds counts, through
-- add_delivery_stats; it reads nothing back. On-call and writers read or add nothing
-- there beyond what on-call may read (above).
CREATE ROLE regress_stats_worker LOGIN IN ROLE wal_delivery_worker;
CREATE ROLE regress_stats_writer LOGIN IN ROLE wal_delivery_writer;
INSERT INTO wal_delivery.delivery_stats VALUES
    (date_trunc('minute', now()) - interval '20 days', 'oc.events', 'oc-dest', 1, 0, 0);
CREATE TEMP VIEW stats_now AS
SELECT jsonb_build_array(jsonb_build_object('minute', extract(epoch FROM now()), 'topic', 'oc.events',
           'destination', 'oc-dest', 'delivered', 2, 'failed', 1, 'dead_lettered', 1),
       jsonb_build_object('minute', extract(epoch FROM now()), 'topic', 'oc.events',
           'destination', 'oc-dest', 'delivered', 1, 'failed', 0, 'dead_lettered', 0),
       jsonb_build_object('minute', extract(epoch FROM now()), 'topic', 'no.such.topic',
           'destination', 'oc-dest', 'delivered', 5)) AS counts;
GRANT SELECT ON stats_now TO regress_stats_worker, regress_oncall, regress_stats_writer;
SET ROLE regress_stats_worker;
SELECT wal_delivery.add_delivery_stats(counts) AS keys_added FROM stats_now;
SELECT wal_delivery.add_delivery_stats(counts) AS keys_added FROM stats_now;
SELECT * FROM regress.try('SELECT * FROM wal_delivery.delivery_stats');
SELECT * FROM regress.try($$SELECT wal_delivery.add_delivery_stats('[{"minute": 0, "topic": "oc.events", "destination": "oc-dest", "delivered": -5}]')$$);
SELECT * FROM regress.try($$SELECT wal_delivery.add_delivery_stats('{"delivered": 1}')$$);
RESET ROLE;
-- Added twice in one minute, one row; the unknown topic skipped; the minute older than
-- the retention (7 days) deleted by the same call.
SELECT topic, destination, delivered, failed, dead_lettered, minute = date_trunc('minute', now()) AS this_minute
  FROM wal_delivery.delivery_stats ORDER BY minute;
SELECT topic, delivered_5m, failed_5m, dead_lettered_5m, failed_last_hour
  FROM wal_delivery.topic_status WHERE topic = 'oc.events';
SET ROLE regress_oncall;
SELECT * FROM regress.try('SELECT wal_delivery.add_delivery_stats(counts) FROM stats_now');
SELECT destination, delivered_5m, failed_5m, dead_lettered_last_hour FROM wal_delivery.delivery_rates;
RESET ROLE;
SET ROLE regress_stats_writer;
SELECT * FROM regress.try('SELECT wal_delivery.add_delivery_stats(counts) FROM stats_now');
SELECT * FROM regress.try('SELECT count(*) FROM wal_delivery.delivery_stats');
RESET ROLE;
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET delivery_stats_retention = '1 hour'$$);
DROP VIEW stats_now;
DELETE FROM wal_delivery.delivery_stats;
DROP ROLE regress_stats_worker, regress_stats_writer;

DELETE FROM wal_delivery.audit_log;
DELETE FROM wal_delivery.dead_letters WHERE topic = 'oc.events';
DELETE FROM wal_delivery.destinations WHERE name = 'oc-dest';
DELETE FROM wal_delivery.topics WHERE name = 'oc.events';
DROP OWNED BY regress_oncall;
DROP ROLE regress_oncall;
