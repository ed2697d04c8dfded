-- wal_delivery 0.7 -> 0.8: processing topics run by `wal-worker process`.
\echo Use "ALTER EXTENSION wal_delivery UPDATE TO '0.8'" to load this file. \quit
