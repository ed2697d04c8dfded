-- The extension loads, is preloaded, and its library matches its SQL.
SELECT extname, extversion FROM pg_extension WHERE extname = 'wal_delivery';
SELECT wal_delivery.library_version();
SELECT 'wal_delivery' = ANY (string_to_array(current_setting('shared_preload_libraries'), ','))
    AS preloaded;
-- Its settings prefix is reserved: a misspelt setting is refused, not silently kept.
SET wal_delivery.no_such_setting = 1;
