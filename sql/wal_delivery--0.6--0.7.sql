-- wal_delivery 0.6 -> 0.7: retries without making an outage worse. Shared per-destination
-- pause state with a probe lease, the operator view, dead-letter replay and resolve, and
-- at-least-once alerts for dead letters written by the database itself.
\echo Use "ALTER EXTENSION wal_delivery UPDATE TO '0.7'" to load this file. \quit
