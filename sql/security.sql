-- Roles: the writer may only enqueue and read its own records' status; the admin runs
-- the control plane; secrets are readable by neither the writer nor PUBLIC; every
-- SECURITY DEFINER function pins its search_path.
\pset format unaligned
\pset fieldsep ' | '
INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas) VALUES ('sec.events', 1, 1);
INSERT INTO wal_delivery.destinations (name, endpoint) VALUES ('sec-dest', 'https://example.test/hook');
INSERT INTO wal_delivery.destination_secrets VALUES ('sec-dest', 'whsec_0123456789abcdef');
CREATE ROLE regress_app LOGIN IN ROLE wal_delivery_writer;
CREATE ROLE regress_other_app LOGIN IN ROLE wal_delivery_writer;
CREATE ROLE regress_ops LOGIN IN ROLE wal_delivery_admin;
CREATE ROLE regress_nobody LOGIN;

SET ROLE regress_app;
SELECT wal_enqueue('sec.events', '{"by": "app"}'::jsonb, 'sec-1') IS NOT NULL AS app_enqueued;
SELECT wal_enqueue_batch('sec.events', ARRAY['{"by": "app"}']::jsonb[], ARRAY['sec-2']) IS NOT NULL AS app_batch;
SELECT topic, idempotency_key, state FROM wal_delivery.my_records ORDER BY idempotency_key;
SELECT * FROM regress.try('SELECT count(*) FROM wal_delivery.outbox');
SELECT * FROM regress.try('SELECT signing_secret FROM wal_delivery.destination_secrets');
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name) VALUES ('sec.mine')$$);
SELECT * FROM regress.try('SELECT * FROM wal_delivery.claim_ready_to_ship(1)');
SELECT * FROM regress.try('SELECT count(*) FROM wal_delivery.dead_letters');
RESET ROLE;

SET ROLE regress_other_app;
SELECT wal_enqueue('sec.events', '{"by": "other"}'::jsonb, 'sec-3') IS NOT NULL AS other_enqueued;
SELECT idempotency_key FROM wal_delivery.my_records ORDER BY idempotency_key;
RESET ROLE;

SET ROLE regress_nobody;
SELECT * FROM regress.try($$SELECT wal_enqueue('sec.events', '{}'::jsonb)$$);
SELECT * FROM regress.try('SELECT signing_secret FROM wal_delivery.destination_secrets');
SELECT * FROM regress.try('SELECT * FROM wal_delivery.topics');
RESET ROLE;

SET ROLE regress_ops;
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas) VALUES ('sec.ops', 1, 1)$$);
SELECT signing_secret FROM wal_delivery.destination_secrets;
SELECT count(*) AS outbox_rows FROM wal_delivery.outbox WHERE topic = 'sec.events';
SELECT topic, records FROM wal_delivery.backlog WHERE topic = 'sec.events';
RESET ROLE;

-- The writer's door is wal_enqueue* and my_records, nothing else: every function of the
-- extension a writer member may execute (and log_order, log_acked and log_in_unacked_range,
-- everyone's pure computations on the log's records that its index and views use), and every
-- relation it holds any privilege on.
SELECT p.oid::regprocedure AS writer_may_execute
  FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.classid = 'pg_proc'::regclass AND d.deptype = 'e'
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'wal_delivery')
   AND has_function_privilege('regress_app', p.oid, 'EXECUTE')
 ORDER BY p.oid::regprocedure::text COLLATE "C";
SELECT c.oid::regclass AS writer_may_use,
       array_to_string(ARRAY(SELECT x FROM unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE',
                                                         'REFERENCES', 'TRIGGER']) x
                              WHERE has_table_privilege('regress_app', c.oid, x)), ',') AS privileges
  FROM pg_class c
 WHERE c.relnamespace = 'wal_delivery'::regnamespace AND c.relkind IN ('r', 'v', 'm', 'p', 'f')
   AND (has_table_privilege('regress_app', c.oid, 'SELECT,INSERT,UPDATE,DELETE,TRUNCATE,REFERENCES,TRIGGER')
        OR has_any_column_privilege('regress_app', c.oid, 'SELECT,INSERT,UPDATE,REFERENCES'))
 ORDER BY c.oid::regclass::text COLLATE "C";
SELECT c.oid::regclass AS writer_may_use_sequence FROM pg_class c
 WHERE c.relnamespace = 'wal_delivery'::regnamespace
   AND CASE WHEN c.relkind = 'S' THEN has_sequence_privilege('regress_app', c.oid, 'USAGE,SELECT,UPDATE') END;
-- So a writer cannot reach the outbox around wal_enqueue's checks (any content type, any size).
SET ROLE regress_app;
SELECT * FROM regress.try($$SELECT wal_delivery.enqueue_payload('sec.events', '\x00'::bytea, E'text/x\r\nX-Evil: 1', 'door-1', NULL, NULL)$$);
SELECT * FROM regress.try($$SELECT wal_delivery.enqueue_payload_batch('sec.events', ARRAY['\x00'::bytea], 'x', NULL, NULL, NULL)$$);
RESET ROLE;
SELECT count(*) AS rows_around_the_door FROM wal_delivery.outbox WHERE idempotency_key = 'door-1';

-- my_records is the records of this login acting as this role: two logins that both
-- SET ROLE wal_delivery_writer do not see each other's records.
SET SESSION AUTHORIZATION regress_app;
SET ROLE wal_delivery_writer;
SELECT wal_enqueue('sec.events', '{"by": "app as writer"}'::jsonb, 'sec-shared-1') IS NOT NULL AS app_as_writer_enqueued;
SELECT idempotency_key FROM wal_delivery.my_records ORDER BY idempotency_key;
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION regress_other_app;
SET ROLE wal_delivery_writer;
SELECT wal_enqueue('sec.events', '{"by": "other as writer"}'::jsonb, 'sec-shared-2') IS NOT NULL AS other_as_writer_enqueued;
SELECT idempotency_key FROM wal_delivery.my_records ORDER BY idempotency_key;
RESET ROLE;
-- The same login acting as itself: none (sec-3 was enqueued from the superuser's session).
SELECT idempotency_key FROM wal_delivery.my_records ORDER BY idempotency_key;
RESET SESSION AUTHORIZATION;
-- Keys are per topic, shared by every writer of the topic: the same record again returns
-- the first writer's id (a retry), though that record is not in the second writer's
-- my_records; a different record under the key is 23W01, never a silent no-op that would
-- lose it.
SELECT id AS sec1_id FROM wal_delivery.outbox WHERE idempotency_key = 'sec-1' \gset
SET ROLE regress_other_app;
SELECT wal_enqueue('sec.events', '{"by": "app"}'::jsonb, 'sec-1') = :sec1_id AS shared_key_gives_first_id;
SELECT * FROM regress.try($$SELECT wal_enqueue('sec.events', '{"by": "other"}'::jsonb, 'sec-1')$$);
SELECT count(*) AS first_writers_record_visible FROM wal_delivery.my_records WHERE idempotency_key = 'sec-1';
RESET ROLE;
-- A topic's writers list keeps other writers out (42501), on the C path and the batch too.
UPDATE wal_delivery.topics SET writers = ARRAY['regress_app']::regrole[] WHERE name = 'sec.events';
SET ROLE regress_other_app;
SELECT * FROM regress.try($$SELECT wal_enqueue('sec.events', '{"by": "other"}'::jsonb, 'sec-9')$$);
SELECT * FROM regress.try($$SELECT wal_enqueue_batch('sec.events', ARRAY['{}']::jsonb[])$$);
RESET ROLE;
SET ROLE regress_app;
SELECT wal_enqueue('sec.events', '{"by": "app"}'::jsonb, 'sec-8') IS NOT NULL AS listed_writer_enqueues;
RESET ROLE;
UPDATE wal_delivery.topics SET writers = NULL WHERE name = 'sec.events';

-- Every SECURITY DEFINER function of the extension sets search_path.
SELECT p.oid::regprocedure AS definer_without_search_path
  FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'wal_delivery')
   AND p.prosecdef AND NOT coalesce(p.proconfig::text LIKE '%search_path%', false);
SELECT count(*) > 0 AS has_definer_functions FROM pg_proc p
  JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'wal_delivery') AND p.prosecdef;
-- PUBLIC holds no privilege on any of the extension's tables.
SELECT c.relname FROM pg_class c, aclexplode(c.relacl) a
 WHERE c.relnamespace = 'wal_delivery'::regnamespace AND a.grantee = 0;

DROP OWNED BY regress_app, regress_other_app, regress_ops, regress_nobody;
DROP ROLE regress_app, regress_other_app, regress_ops, regress_nobody;
