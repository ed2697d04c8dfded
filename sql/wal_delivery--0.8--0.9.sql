-- wal_delivery 0.8 -> 0.9: dead-letter archival to S3 on a pg_cron schedule.
\echo Use "ALTER EXTENSION wal_delivery UPDATE TO '0.9'" to load this file. \quit
