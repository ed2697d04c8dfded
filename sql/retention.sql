-- Retention: finished rows (stored or dead) stay for their topic's idempotency window,
-- then go in small batches; unfinished rows are never purged. That is the row table's
-- way (processing topics, and plain records held there: regress.hold does what the relay
-- does when Kafka does not take one); the log goes a generation at a time (at the end).
\pset format unaligned
\pset fieldsep ' | '
DELETE FROM wal_delivery.outbox;
INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas, idempotency_window)
VALUES ('ret.short', 1, 1, '1 hour'), ('ret.long', 1, 1, '30 days');
SELECT cardinality(wal_enqueue_batch('ret.short', ARRAY(SELECT format('k%s', i) FROM generate_series(1, 7) i),
                                     ARRAY(SELECT format('k%s', i) FROM generate_series(1, 7) i))) AS short_rows;
SELECT cardinality(wal_enqueue_batch('ret.long', ARRAY['l1', 'l2'], ARRAY['l1', 'l2'])) AS long_rows;
SELECT wal_enqueue('ret.short', 'still pending'::text, 'pending-1') IS NOT NULL AS pending_row;
SELECT sum(regress.hold(id)) AS held FROM wal_delivery.outbox_log WHERE topic LIKE 'ret.%';
SELECT id AS first_k1 FROM wal_delivery.outbox WHERE idempotency_key = 'k1' \gset
BEGIN;
SELECT wal_delivery.mark_stored(ARRAY(SELECT id FROM wal_delivery.claim_ready_to_ship(100)
                                       WHERE idempotency_key <> 'pending-1')) AS stored;
COMMIT;
-- Make the short topic's rows and one long-topic row finished two hours ago.
UPDATE wal_delivery.outbox_rows SET finished_at = now() - interval '2 hours'
 WHERE state = 'stored' AND (topic = 'ret.short' OR idempotency_key = 'l1');
SELECT wal_delivery.purge_finished_rows(3) AS first_batch;
SELECT wal_delivery.purge_finished_rows(3) AS second_batch;
SELECT wal_delivery.purge_finished_rows(3) AS third_batch;
-- A purged held record is gone from the log too: it does not show again.
SELECT topic, idempotency_key, state FROM wal_delivery.outbox ORDER BY topic, idempotency_key;
SELECT count(*) AS log_copies FROM wal_delivery.outbox_log WHERE topic LIKE 'ret.%';
-- Past the window, a key can be enqueued again as a new record.
SELECT wal_enqueue('ret.short', 'again'::text, 'k1') > :first_k1 AS reenqueued_as_new;
SELECT count(*), min(state::text) AS state FROM wal_delivery.outbox WHERE idempotency_key = 'k1';
-- The procedure commits between batches; it runs as a CALL outside a transaction block.
SELECT sum(regress.hold(id)) AS held FROM wal_delivery.outbox_log l
 WHERE NOT EXISTS (SELECT 1 FROM wal_delivery.outbox_rows r WHERE r.id = l.id);
UPDATE wal_delivery.outbox_rows SET state = 'stored', finished_at = now() - interval '40 days';
CALL wal_delivery.purge_finished(2, 100);
SELECT count(*) AS left_after_purge FROM wal_delivery.outbox;
BEGIN;
CALL wal_delivery.purge_finished(2, 100);
ROLLBACK;

-- The log: rotate_outbox_log seals the current generation once it is older than the
-- longest idempotency window (30 days here), and TRUNCATEs a sealed generation past that
-- window only once Kafka has every record in it. Time is moved by hand.
SELECT wal_enqueue('ret.long', 'in the first generation'::text, 'g1') AS g1 \gset
SELECT wal_delivery.rotate_outbox_log() AS too_young;
UPDATE wal_delivery.outbox_generations SET started_at = now() - interval '31 days' WHERE sealed_at IS NULL;
SELECT wal_delivery.rotate_outbox_log() AS sealed;
SELECT wal_enqueue('ret.long', 'in the next generation'::text, 'g2') AS g2 \gset
SELECT wal_enqueue('ret.long', 'in the first generation'::text, 'g1') = :g1 AS repeat_finds_the_sealed_one;
SELECT wal_delivery.rotate_outbox_log() AS window_not_over;
UPDATE wal_delivery.outbox_generations SET sealed_at = now() - interval '31 days' WHERE sealed_at IS NOT NULL;
SELECT wal_delivery.rotate_outbox_log() AS not_all_in_kafka;
SELECT idempotency_key, state FROM wal_delivery.outbox WHERE idempotency_key IN ('g1', 'g2') ORDER BY 1;
SELECT regress.ack_log();
SELECT wal_delivery.rotate_outbox_log() AS truncated;
SELECT idempotency_key, state FROM wal_delivery.outbox WHERE idempotency_key IN ('g1', 'g2') ORDER BY 1;
-- The truncated generation has no page, and enqueue does not look in it: a key of its
-- records is new again. A generation that was empty and took records since is looked in.
SELECT wal_enqueue('ret.long', 'after the truncation'::text, 'g1') AS g1_again \gset
SELECT :g1_again <> :g1 AS truncated_key_is_new;
UPDATE wal_delivery.outbox_generations SET started_at = now() - interval '31 days' WHERE sealed_at IS NULL;
SELECT wal_delivery.rotate_outbox_log() AS sealed_again;
SELECT wal_enqueue('ret.long', 'after the truncation'::text, 'g1') = :g1_again AS repeat_finds_the_sealed_one_again,
       wal_enqueue('ret.long', 'in the next generation'::text, 'g2') = :g2 AS and_the_other_key;
SELECT wal_enqueue_batch('ret.long', ARRAY['in the next generation', 'after the truncation']::text[], ARRAY['g2', 'g1'])
       = ARRAY[:g2, :g1_again]::bigint[] AS batch_repeats_find_them;
DELETE FROM wal_delivery.outbox;
