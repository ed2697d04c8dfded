-- Retention: finished rows (stored or dead) stay for their topic's idempotency window,
-- then go in small batches; unfinished rows are never purged.
\pset format unaligned
\pset fieldsep ' | '
DELETE FROM wal_delivery.outbox;
INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas, idempotency_window)
VALUES ('ret.short', 1, 1, '1 hour'), ('ret.long', 1, 1, '30 days');
SELECT cardinality(wal_enqueue_batch('ret.short', ARRAY(SELECT format('k%s', i) FROM generate_series(1, 7) i),
                                     ARRAY(SELECT format('k%s', i) FROM generate_series(1, 7) i))) AS short_rows;
SELECT cardinality(wal_enqueue_batch('ret.long', ARRAY['l1', 'l2'], ARRAY['l1', 'l2'])) AS long_rows;
SELECT wal_enqueue('ret.short', 'still pending'::text, 'pending-1') IS NOT NULL AS pending_row;
BEGIN;
SELECT wal_delivery.mark_stored(ARRAY(SELECT id FROM wal_delivery.claim_ready_to_ship(100)
                                       WHERE idempotency_key <> 'pending-1')) AS stored;
COMMIT;
-- Make the short topic's rows and one long-topic row finished two hours ago.
UPDATE wal_delivery.outbox SET finished_at = now() - interval '2 hours'
 WHERE state = 'stored' AND (topic = 'ret.short' OR idempotency_key = 'l1');
SELECT wal_delivery.purge_finished_rows(3) AS first_batch;
SELECT wal_delivery.purge_finished_rows(3) AS second_batch;
SELECT wal_delivery.purge_finished_rows(3) AS third_batch;
SELECT topic, idempotency_key, state FROM wal_delivery.outbox ORDER BY topic, idempotency_key;
-- Past the window, a key can be enqueued again as a new record.
SELECT wal_enqueue('ret.short', 'again'::text, 'k1') IS NOT NULL AS reenqueued;
SELECT count(*) FROM wal_delivery.outbox WHERE idempotency_key = 'k1';
-- The procedure commits between batches; it runs as a CALL outside a transaction block.
UPDATE wal_delivery.outbox SET state = 'stored', finished_at = now() - interval '40 days';
CALL wal_delivery.purge_finished(2, 100);
SELECT count(*) AS left_after_purge FROM wal_delivery.outbox;
BEGIN;
CALL wal_delivery.purge_finished(2, 100);
ROLLBACK;
