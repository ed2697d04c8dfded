-- Dead-letter archival to S3 on a pg_cron schedule.
--
-- Unresolved dead letters older than settings.dead_letter_archive_after go to S3 as gzip
-- newline-delimited JSON, one object per batch, and are deleted (or kept, marked archived)
-- only after S3 answered 200 to the upload. restore_dead_letters reads an object back.
-- The upload itself (SigV4, gzip) is C: src/ext/s3_archive.c and its helpers.
--
-- Words used below:
--   archive entry   one JSON line of an archive object: every column of the dead letter,
--                   the payload as payload_base64, and archive_format (1)
--   archive object  prefix/YYYY/MM/DD/dead-letters-<first id>-<last id>.ndjson.gz, the day
--                   of its first entry's failed_at in UTC; the same rows give the same name
--                   and the same bytes, so a retried run overwrites instead of duplicating

------------------------------------------------------------------------------ settings

-- The archive_* columns of wal_delivery.settings (config/settings.sql).
CREATE FUNCTION wal_delivery.check_archive_settings() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.archive_s3_endpoint !~ '^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?/?$' THEN
        PERFORM wal_delivery.refuse_setting('archive_s3_endpoint must be a scheme and a host, with an optional port',
            NEW.archive_s3_endpoint, 'For example https://s3.eu-west-1.amazonaws.com; the bucket goes in archive_s3_bucket.');
    END IF;
    IF NEW.archive_s3_endpoint ~* '^http://' AND NOT NEW.archive_s3_allow_http THEN
        PERFORM wal_delivery.refuse_setting('archive_s3_endpoint must use https unless archive_s3_allow_http is on',
            NEW.archive_s3_endpoint, 'Credentials and dead letters would cross the network unencrypted; allow http only for a local test server.');
    END IF;
    IF NEW.archive_s3_bucket !~ '^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$' THEN
        PERFORM wal_delivery.refuse_setting('archive_s3_bucket must be a valid S3 bucket name',
            NEW.archive_s3_bucket, 'Use 3 to 63 lower-case letters, digits, "." and "-".');
    END IF;
    IF NEW.archive_s3_region !~ '^[a-z0-9-]{1,40}$' THEN
        PERFORM wal_delivery.refuse_setting('archive_s3_region must be a region name',
            NEW.archive_s3_region, 'For example us-east-1 or eu-west-1.');
    END IF;
    -- A "." or ".." segment would be resolved away by libcurl before the request is sent:
    -- the object would land under another key, with path style even in another bucket.
    IF NEW.archive_s3_prefix !~ '^([A-Za-z0-9_.=-]+(/[A-Za-z0-9_.=-]+)*)?$'
       OR NEW.archive_s3_prefix ~ '(^|/)\.\.?(/|$)' THEN
        PERFORM wal_delivery.refuse_setting('archive_s3_prefix must be path segments separated by "/", without a leading or trailing "/" and without a "." or ".." segment',
            NEW.archive_s3_prefix, 'Use letters, digits, "_", ".", "=" and "-", for example wal_delivery/dead_letters.');
    END IF;
    IF NEW.archive_s3_timeout NOT BETWEEN interval '1 second' AND interval '1 hour'
       OR NEW.archive_max_run_time <= interval '0' THEN
        PERFORM wal_delivery.refuse_setting('archive_s3_timeout must be between 1 second and 1 hour and archive_max_run_time positive',
            format('%s and %s', NEW.archive_s3_timeout, NEW.archive_max_run_time), 'The defaults are 2 minutes and 30 minutes.');
    END IF;
    IF NEW.archive_batch_rows NOT BETWEEN 1 AND 1000000
       OR NEW.archive_batch_bytes NOT BETWEEN 1024 AND 536870912 THEN
        PERFORM wal_delivery.refuse_setting('archive_batch_rows must be between 1 and 1000000 and archive_batch_bytes between 1 kB and 512 MB',
            format('%s and %s', NEW.archive_batch_rows, NEW.archive_batch_bytes), 'The defaults are 10000 rows and 64 MB.');
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER check_archive_settings BEFORE INSERT OR UPDATE ON wal_delivery.settings
    FOR EACH ROW EXECUTE FUNCTION wal_delivery.check_archive_settings();

-- Kept apart from settings so the keys are readable by the admin role only.
CREATE TABLE wal_delivery.archive_credentials (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    access_key_id text NOT NULL CHECK (access_key_id ~ '^[[:graph:]]{1,128}$'),
    secret_access_key text NOT NULL CHECK (secret_access_key ~ '^[[:graph:]]+$' AND length(secret_access_key) <= 256),
    session_token text                               -- temporary credentials only
);

SELECT pg_catalog.pg_extension_config_dump('wal_delivery.archive_credentials', '');

------------------------------------------------------------------------------ archiving

-- Where archive objects go, with the keys; refuses when archival is not configured.
CREATE FUNCTION wal_delivery.archive_target(
    OUT endpoint text, OUT region text, OUT bucket text, OUT prefix text, OUT path_style boolean,
    OUT allow_http boolean, OUT timeout_ms bigint, OUT batch_rows integer, OUT batch_bytes integer,
    OUT access_key_id text, OUT secret_access_key text, OUT session_token text)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    SELECT s.archive_s3_endpoint, s.archive_s3_region, s.archive_s3_bucket, s.archive_s3_prefix,
           s.archive_s3_path_style, s.archive_s3_allow_http,
           (extract(epoch FROM s.archive_s3_timeout) * 1000)::bigint, s.archive_batch_rows,
           s.archive_batch_bytes, c.access_key_id, c.secret_access_key, c.session_token
      INTO endpoint, region, bucket, prefix, path_style, allow_http, timeout_ms, batch_rows,
           batch_bytes, access_key_id, secret_access_key, session_token
      FROM wal_delivery.settings s LEFT JOIN wal_delivery.archive_credentials c ON true;
    IF endpoint IS NULL OR bucket IS NULL THEN
        RAISE EXCEPTION 'dead-letter archival is not configured'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Set archive_s3_endpoint and archive_s3_bucket in wal_delivery.settings.';
    END IF;
    IF access_key_id IS NULL THEN
        RAISE EXCEPTION 'dead-letter archival has no S3 credentials'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'INSERT INTO wal_delivery.archive_credentials (access_key_id, secret_access_key) VALUES (...).';
    END IF;
END $$;

-- The next batch to archive as archive entries, oldest id first, locked so a concurrent
-- run takes other rows. A restored entry ages from its restore, not its failure.
CREATE FUNCTION wal_delivery.dead_letters_to_archive(p_max_rows integer)
RETURNS TABLE (id bigint, failed_day text, entry text)
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    SELECT d.id, to_char(d.failed_at AT TIME ZONE 'UTC', 'YYYY/MM/DD'),
           (jsonb_build_object('archive_format', 1,
                               'payload_base64', translate(encode(d.payload, 'base64'), E'\n', ''))
            || (to_jsonb(d) - 'payload' - 'archived_at' - 'archive_object'))::text
      FROM wal_delivery.dead_letters d, wal_delivery.settings s
     WHERE d.resolved_at IS NULL AND d.archived_at IS NULL
       AND d.replay_requested_at IS NULL   -- on-call is replaying it: not unhandled
       AND coalesce(d.restored_at, d.failed_at) < now() - s.dead_letter_archive_after
     ORDER BY d.id
     LIMIT p_max_rows
       FOR UPDATE OF d SKIP LOCKED;
$$;

-- Every archive object S3 confirmed, so on-call can find which one holds a day without
-- listing the bucket (and restore it). day is the UTC day of its first entry's failure.
CREATE TABLE wal_delivery.archive_objects (
    object text PRIMARY KEY,
    day date NOT NULL,
    first_id bigint NOT NULL,
    last_id bigint NOT NULL,
    entries integer NOT NULL,
    archived_at timestamptz NOT NULL DEFAULT now()
);
-- The console lists objects newest day first, by keyset on (day, object).
CREATE INDEX archive_objects_day ON wal_delivery.archive_objects (day, object);

-- Called only after S3 confirmed p_object: deletes the entries, or marks them archived,
-- and lists the object in archive_objects (a retried upload of the same rows updates it).
CREATE FUNCTION wal_delivery.mark_dead_letters_archived(p_ids bigint[], p_object text) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
BEGIN
    INSERT INTO wal_delivery.archive_objects (object, day, first_id, last_id, entries)
    SELECT p_object, (array_agg((d.failed_at AT TIME ZONE 'UTC')::date ORDER BY d.id))[1], min(d.id),
           max(d.id), count(*)
      FROM wal_delivery.dead_letters d WHERE d.id = ANY (p_ids)
    HAVING count(*) > 0
    ON CONFLICT (object) DO UPDATE
       SET entries = EXCLUDED.entries, first_id = EXCLUDED.first_id, last_id = EXCLUDED.last_id,
           archived_at = now();
    IF (SELECT archive_keeps_rows FROM wal_delivery.settings) THEN
        UPDATE wal_delivery.dead_letters SET archived_at = now(), archive_object = p_object
         WHERE id = ANY (p_ids) AND archived_at IS NULL;
    ELSE
        DELETE FROM wal_delivery.dead_letters WHERE id = ANY (p_ids);
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- One batch: build, upload, then mark. NULL when nothing is old enough.
CREATE FUNCTION wal_delivery.archive_dead_letter_batch() RETURNS jsonb
LANGUAGE c SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'wal_delivery_archive_dead_letter_batch';

-- The decompressed NDJSON text of one archive object.
CREATE FUNCTION wal_delivery.fetch_archive_object(p_object text) RETURNS text
LANGUAGE c STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'wal_delivery_fetch_archive_object';

-- The daily job: batches until none is left or archive_max_run_time is used up, committing
-- after each, so a failure later in the run keeps what S3 already confirmed. CALL it
-- outside a transaction block (pg_cron does).
CREATE PROCEDURE wal_delivery.archive_dead_letters(INOUT summary jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    started timestamptz := clock_timestamp();
    max_run interval;
    batch jsonb;
    batches integer := 0;
    archived bigint := 0;
    bytes bigint := 0;
    objects jsonb := '[]';
BEGIN
    SELECT archive_max_run_time INTO max_run FROM wal_delivery.settings;
    LOOP
        batch := wal_delivery.archive_dead_letter_batch();
        IF batch IS NULL THEN
            summary := jsonb_build_object('finished', true);
            EXIT;
        END IF;
        COMMIT;
        batches := batches + 1;
        archived := archived + (batch->>'rows')::bigint;
        bytes := bytes + (batch->>'compressed_bytes')::bigint;
        objects := objects || jsonb_build_array(batch->>'object');
        -- Checked after a batch, so even a short limit makes progress.
        IF clock_timestamp() - started >= max_run THEN
            summary := jsonb_build_object('finished', false, 'reason', 'archive_max_run_time');
            EXIT;
        END IF;
    END LOOP;
    summary := summary || jsonb_build_object('batches', batches, 'archived', archived,
                                             'compressed_bytes', bytes, 'objects', objects);
END $$;

-- Schedules the daily archival with pg_cron under one job name (calling it again changes
-- the schedule). The job runs as the role that calls this.
CREATE FUNCTION wal_delivery.schedule_dead_letter_archival(p_schedule text DEFAULT '17 3 * * *') RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    job bigint;
BEGIN
    IF to_regnamespace('cron') IS NULL THEN
        RAISE EXCEPTION 'pg_cron is not installed in this database'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Add pg_cron to shared_preload_libraries, set cron.database_name to this database, restart, then CREATE EXTENSION pg_cron.';
    END IF;
    IF NOT has_schema_privilege('cron', 'USAGE') THEN
        RAISE EXCEPTION 'permission denied for schema cron'
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'As a superuser: GRANT USAGE ON SCHEMA cron TO wal_delivery_admin (CREATE EXTENSION wal_delivery does it when pg_cron is installed first).';
    END IF;
    EXECUTE 'SELECT cron.schedule($1, $2, $3)' INTO job
        USING 'wal_delivery_archive_dead_letters', p_schedule, 'CALL wal_delivery.archive_dead_letters()';
    RETURN job;
END $$;

------------------------------------------------------------------------------ restore

-- Reads one archive object back into dead_letters with the entries' own ids, so they can
-- be inspected, replayed or resolved again. Idempotent: an entry still present is left as
-- is, one kept as archived becomes live again. Columns an older archive lacks take their
-- defaults, and keys the table no longer has are ignored.
CREATE FUNCTION wal_delivery.restore_dead_letters(p_object text,
    OUT restored bigint, OUT reactivated bigint, OUT already_present bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    bad text;
    total bigint;
    columns text;
    values_ text;
BEGIN
    IF p_object IS NULL OR p_object = '' THEN
        RAISE EXCEPTION 'restore_dead_letters needs an archive object key'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'Pass a key such as wal_delivery/dead_letters/2026/11/20/dead-letters-1-500.ndjson.gz.';
    END IF;
    CREATE TEMP TABLE restore_entries ON COMMIT DROP AS
    SELECT line::jsonb AS e
      FROM string_to_table(wal_delivery.fetch_archive_object(p_object), E'\n') line
     WHERE line <> '';
    SELECT e::text INTO bad FROM restore_entries
     WHERE NOT (e ? 'id' AND e ? 'payload_base64' AND e->>'archive_format' = '1') LIMIT 1;
    IF bad IS NOT NULL THEN
        DROP TABLE restore_entries;
        RAISE EXCEPTION 'object % is not a dead-letter archive', p_object
            USING ERRCODE = 'data_exception', DETAIL = format('An entry lacks id, payload_base64 or archive_format 1: %s', left(bad, 200));
    END IF;
    SELECT count(*) INTO total FROM restore_entries;

    UPDATE wal_delivery.dead_letters d
       SET archived_at = NULL, archive_object = NULL, restored_at = now()
      FROM restore_entries r
     WHERE d.id = (r.e->>'id')::bigint AND d.archived_at IS NOT NULL;
    GET DIAGNOSTICS reactivated = ROW_COUNT;

    SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum),
           string_agg('p.' || quote_ident(a.attname), ', ' ORDER BY a.attnum) INTO columns, values_
      FROM pg_attribute a
     WHERE a.attrelid = 'wal_delivery.dead_letters'::regclass AND a.attnum > 0 AND NOT a.attisdropped
       AND (a.attname IN ('payload', 'restored_at')
            OR EXISTS (SELECT 1 FROM restore_entries r WHERE r.e ? a.attname));
    EXECUTE format(
        'INSERT INTO wal_delivery.dead_letters (%s) OVERRIDING SYSTEM VALUE
         SELECT %s FROM restore_entries r,
                jsonb_populate_record(NULL::wal_delivery.dead_letters,
                    r.e || jsonb_build_object(
                        ''payload'', ''\x'' || encode(decode(r.e->>''payload_base64'', ''base64''), ''hex''),
                        ''restored_at'', now())) p
          WHERE NOT EXISTS (SELECT 1 FROM wal_delivery.dead_letters d WHERE d.id = (r.e->>''id'')::bigint)
         ON CONFLICT DO NOTHING', columns, values_);
    GET DIAGNOSTICS restored = ROW_COUNT;
    already_present := total - restored - reactivated;
    DROP TABLE restore_entries;
END $$;
