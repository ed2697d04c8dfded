-- The schema every object of wal_delivery lives in (CREATE EXTENSION creates it, see
-- wal_delivery.control), and the small helpers the other files share.

COMMENT ON SCHEMA wal_delivery IS 'wal_delivery: outbox, control plane and delivery state';

-- The version of the loaded shared library, to spot a server that runs an old build.
CREATE FUNCTION wal_delivery.library_version() RETURNS text
LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'wal_delivery_library_version';

-- Raises a check_violation naming the setting, what it got and what to do.
CREATE FUNCTION wal_delivery.refuse_setting(what text, got text, hint text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION '%, got %', what, coalesce(got, 'NULL')
        USING ERRCODE = 'check_violation', HINT = hint;
END $$;

-- True when v is NULL or a JSON object whose values are all strings (Kafka/HTTP headers).
-- Inlinable on purpose: no SET clause (it calls only pg_catalog functions, qualified, and
-- its callers pin search_path); with one it was planned anew in every transaction
-- (bench/enqueue).
CREATE FUNCTION wal_delivery.is_string_map(v jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT v IS NULL
        OR (pg_catalog.jsonb_typeof(v) = 'object'
            AND NOT EXISTS (SELECT 1 FROM pg_catalog.jsonb_each(v) e
                             WHERE pg_catalog.jsonb_typeof(e.value) <> 'string'))
$$;
