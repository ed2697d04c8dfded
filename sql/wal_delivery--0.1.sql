-- wal_delivery 0.1: the foundation. The schema every other object lives in.
\echo Use "CREATE EXTENSION wal_delivery" to load this file. \quit

COMMENT ON SCHEMA wal_delivery IS 'wal_delivery: outbox, control plane and delivery state';

-- The version of the loaded shared library, to spot a server that runs an old build.
CREATE FUNCTION wal_delivery.library_version() RETURNS text
LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'wal_delivery_library_version';
