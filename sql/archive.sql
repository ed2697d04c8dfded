-- Dead-letter archival to S3: its settings refuse bad values, it says what is missing
-- before it touches S3, and its credentials and functions are the admin's alone.
-- (Uploads, restores and failures against a real S3 server: tests/integration/test_archive.py.)
\pset format unaligned
\pset fieldsep ' | '
SELECT dead_letter_archive_after, archive_s3_endpoint, archive_s3_region, archive_s3_bucket,
       archive_s3_prefix, archive_s3_path_style, archive_s3_allow_http, archive_s3_timeout,
       archive_batch_rows, archive_batch_bytes, archive_max_run_time, archive_keeps_rows
  FROM wal_delivery.settings;

-- Not configured: nothing is read or sent, and the error says what to set.
SELECT * FROM regress.try('SELECT wal_delivery.archive_dead_letter_batch()');
SELECT * FROM regress.try('CALL wal_delivery.archive_dead_letters()');
SELECT * FROM regress.try($$SELECT * FROM wal_delivery.restore_dead_letters('a/b.ndjson.gz')$$);
SELECT * FROM regress.try($$SELECT * FROM wal_delivery.restore_dead_letters('')$$);
SELECT * FROM regress.try('SELECT * FROM wal_delivery.restore_dead_letters(NULL)');

-- Bad settings.
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET archive_s3_endpoint = 's3.amazonaws.com'$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET archive_s3_endpoint = 'https://s3.amazonaws.com/bucket'$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET archive_s3_endpoint = 'http://127.0.0.1:9000'$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET archive_s3_bucket = 'Bad_Bucket'$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET archive_s3_region = 'EU West'$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET archive_s3_prefix = '/dead'$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET archive_s3_prefix = 'dead/'$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET archive_s3_prefix = 'dead/../other'$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET archive_s3_timeout = '0 seconds'$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET archive_max_run_time = '0 seconds'$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET archive_batch_rows = 0$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET archive_batch_bytes = 100$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.archive_credentials VALUES (true, 'AKIA EXAMPLE', 'secret')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.archive_credentials (singleton, access_key_id, secret_access_key) VALUES (false, 'AKIAEXAMPLE', 'secret')$$);

-- Plain http only when asked for; then a configured endpoint without keys is refused.
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET archive_s3_endpoint = 'http://127.0.0.1:9', archive_s3_allow_http = true, archive_s3_bucket = 'dead-letters'$$);
SELECT * FROM regress.try('SELECT wal_delivery.archive_dead_letter_batch()');
-- pg_cron is not installed in the regression database.
SELECT * FROM regress.try('SELECT wal_delivery.schedule_dead_letter_archival()');

-- Roles: the keys are the admin's; neither the writer nor PUBLIC reads them or archives.
INSERT INTO wal_delivery.archive_credentials (access_key_id, secret_access_key) VALUES ('AKIAEXAMPLE', 'not-a-real-secret');
CREATE ROLE regress_archive_app LOGIN IN ROLE wal_delivery_writer;
CREATE ROLE regress_archive_ops LOGIN IN ROLE wal_delivery_admin;
CREATE ROLE regress_archive_nobody LOGIN;
SET ROLE regress_archive_app;
SELECT * FROM regress.try('SELECT secret_access_key FROM wal_delivery.archive_credentials');
SELECT * FROM regress.try('SELECT * FROM wal_delivery.archive_target()');
SELECT * FROM regress.try('SELECT wal_delivery.archive_dead_letter_batch()');
SELECT * FROM regress.try($$SELECT wal_delivery.fetch_archive_object('a/b.ndjson.gz')$$);
SELECT * FROM regress.try($$SELECT * FROM wal_delivery.restore_dead_letters('a/b.ndjson.gz')$$);
RESET ROLE;
SET ROLE regress_archive_nobody;
SELECT * FROM regress.try('SELECT secret_access_key FROM wal_delivery.archive_credentials');
SELECT * FROM regress.try('SELECT * FROM wal_delivery.dead_letters_to_archive(1)');
SELECT * FROM regress.try($$SELECT wal_delivery.mark_dead_letters_archived('{1}', 'x')$$);
RESET ROLE;
SET ROLE regress_archive_ops;
SELECT access_key_id FROM wal_delivery.archive_credentials;
SELECT * FROM regress.try('SELECT * FROM wal_delivery.archive_target()');
RESET ROLE;
-- No archival function is executable by PUBLIC.
SELECT p.oid::regprocedure AS public_can_execute
  FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
 WHERE p.pronamespace = 'wal_delivery'::regnamespace AND a.grantee = 0
   AND p.proname IN ('check_archive_settings', 'archive_target', 'dead_letters_to_archive',
                     'mark_dead_letters_archived', 'archive_dead_letter_batch', 'fetch_archive_object',
                     'archive_dead_letters', 'restore_dead_letters', 'schedule_dead_letter_archival');

DELETE FROM wal_delivery.archive_credentials;
UPDATE wal_delivery.settings SET archive_s3_endpoint = NULL, archive_s3_bucket = NULL, archive_s3_allow_http = false;
DROP OWNED BY regress_archive_app, regress_archive_ops, regress_archive_nobody;
DROP ROLE regress_archive_app, regress_archive_ops, regress_archive_nobody;
