-- The outbox state machine: every transition, its claim routine, and every refusal
-- (wrong state, stale fencing token, expired lease). A plain topic's record is in the log
-- and goes from pending to stored when its lane's cursor passes it after Kafka's ack (at
-- the end); the row-by-row transitions of plain records are those of a held record (Kafka
-- did not take it when the cursor passed it: regress.hold does what the relay does then).
\pset format unaligned
\pset fieldsep ' | '
INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas,
                                 processor_kind, processor, processing_max_attempts, processing_backoff)
VALUES ('sm.plain', 1, 1, NULL, NULL, 5, '1 second'),
       ('sm.proc', 1, 1, 'sql', 'regress.upper_payload', 2, '0 seconds');
DELETE FROM wal_delivery.outbox;
-- Fixed ids and tokens so the messages below are the same on every run.
ALTER SEQUENCE wal_delivery.outbox_ids RESTART WITH 1000;
ALTER SEQUENCE wal_delivery.lease_token_seq RESTART WITH 1;

-- Held plain record: pending -> stored.
SELECT wal_enqueue('sm.plain', 'p1'::text, 'p1') AS p1 \gset
SELECT wal_enqueue('sm.proc', 'q1'::text, 'q1') AS q1 \gset
SELECT count(*) AS claimable_before_held FROM wal_delivery.claim_ready_to_ship(10);
SELECT regress.hold(:p1) AS held;
SELECT regress.hold(:p1) AS held_again;
BEGIN;
-- Only the plain row is ready to ship; the processing row is not.
SELECT id = :p1 AS is_p1, convert_from(payload, 'UTF8') AS payload FROM wal_delivery.claim_ready_to_ship(10);
SELECT wal_delivery.mark_stored(ARRAY[:p1]::bigint[]) AS marked;
COMMIT;
SELECT state, finished_at IS NOT NULL AS finished FROM wal_delivery.outbox WHERE id = :p1;
SELECT * FROM regress.try(format('SELECT wal_delivery.mark_stored(ARRAY[%s]::bigint[])', :p1));
SELECT * FROM regress.try(format('SELECT wal_delivery.mark_stored(ARRAY[%s]::bigint[])', :q1));
SELECT * FROM regress.try('SELECT wal_delivery.mark_stored(ARRAY[-1]::bigint[])');

-- Processing topic: pending -> processing -> processed -> stored.
SELECT id = :q1 AS is_q1, attempts, lease_token AS t1, lease_until > now() AS leased
  FROM wal_delivery.claim_ready_to_process(10) \gset
SELECT :'is_q1' AS claimed_q1, :attempts AS attempts, :'leased' AS leased;
SELECT count(*) AS claimable_again FROM wal_delivery.claim_ready_to_process(10);
SELECT * FROM regress.try(format('SELECT wal_delivery.complete_processing(%s, %s, %L)', :q1, :t1 + 1000, 'x'));
SELECT * FROM regress.try(format('SELECT wal_delivery.complete_processing(%s, %s, NULL)', :q1, :t1));
SELECT wal_delivery.complete_processing(:q1, :t1, convert_to('Q1', 'UTF8'));
SELECT state, convert_from(processed_payload, 'UTF8') AS processed FROM wal_delivery.outbox WHERE id = :q1;
SELECT * FROM regress.try(format('SELECT wal_delivery.complete_processing(%s, %s, %L)', :q1, :t1, 'again'));
BEGIN;
SELECT convert_from(payload, 'UTF8') AS shipped_payload FROM wal_delivery.claim_ready_to_ship(10);
SELECT wal_delivery.mark_stored(ARRAY[:q1]::bigint[]) AS marked;
COMMIT;
SELECT state FROM wal_delivery.outbox WHERE id = :q1;

-- An expired lease: the old holder's late write is refused, the row is claimed again.
SELECT wal_enqueue('sm.proc', 'q2'::text, 'q2') AS q2 \gset
SELECT lease_token AS old_token FROM wal_delivery.claim_ready_to_process(1, '1 millisecond') \gset
SELECT pg_sleep(0.01);
SELECT sqlstate, regexp_replace(message, 'expired at .*', 'expired at <time>') AS message, hint
  FROM regress.try(format('SELECT wal_delivery.complete_processing(%s, %s, %L)', :q2, :old_token, 'late'));
SELECT lease_token AS new_token, attempts FROM wal_delivery.claim_ready_to_process(1) \gset
SELECT :new_token > :old_token AS newer_token, :attempts AS attempts;
SELECT * FROM regress.try(format('SELECT wal_delivery.complete_processing(%s, %s, %L)', :q2, :old_token, 'stale'));
SELECT * FROM regress.try(format('SELECT wal_delivery.fail_processing(%s, %s, %L)', :q2, :old_token, 'stale'));
-- Second failure is the last allowed attempt (processing_max_attempts = 2): dead + dead letter.
SELECT wal_delivery.fail_processing(:q2, :new_token, 'processor said no') AS new_state;
SELECT state, last_error, attempts FROM wal_delivery.outbox WHERE id = :q2;
SELECT origin, topic, idempotency_key, convert_from(payload, 'UTF8') AS payload, attempts, last_error
  FROM wal_delivery.dead_letters WHERE outbox_id = :q2;
SELECT topic, idempotency_key, attempts, last_error FROM wal_delivery.unresolved_dead_letters;

-- A failure before the last attempt frees the row for retry with backoff.
SELECT wal_enqueue('sm.proc', 'q3'::text, 'q3') AS q3 \gset
SELECT lease_token AS t3 FROM wal_delivery.claim_ready_to_process(1) \gset
SELECT wal_delivery.fail_processing(:q3, :t3, 'timeout') AS new_state;
SELECT state, attempts, last_error, lease_until IS NULL AS lease_cleared FROM wal_delivery.outbox WHERE id = :q3;

-- A lease that expires on the last attempt makes the row dead.
SELECT lease_token AS t3b FROM wal_delivery.claim_ready_to_process(1, '1 millisecond') \gset
SELECT pg_sleep(0.01);
SELECT wal_delivery.expire_processing_leases() AS expired;
SELECT state, attempts, last_error LIKE 'processing lease expired%on attempt 2 of 2' AS reason
  FROM wal_delivery.outbox WHERE id = :q3;

-- Unshippable rows (the relay's verdict) become dead letters too.
SELECT wal_enqueue('sm.plain', 'too big for the broker'::text, 'p2') AS p2 \gset
SELECT regress.hold(:p2) AS held;
SELECT wal_delivery.mark_unshippable(:p2, 'Broker: Message size too large');
SELECT origin, last_error FROM wal_delivery.dead_letters WHERE outbox_id = :p2;
SELECT * FROM regress.try(format('SELECT wal_delivery.mark_unshippable(%s, %L)', :p2, 'again'));

-- Deferred shipping is not claimable before its time.
SELECT wal_enqueue('sm.plain', 'later'::text, 'p3') AS p3 \gset
SELECT regress.hold(:p3) AS held;
SELECT wal_delivery.defer_shipping(ARRAY[:p3]::bigint[], 'broker down', '1 hour') AS deferred;
SELECT count(*) AS claimable FROM wal_delivery.claim_ready_to_ship(10);
SELECT * FROM regress.try($$SELECT * FROM wal_delivery.claim_ready_to_process(1, '-1 second')$$);

-- A plain record in the log: pending, never claimed, until its lane's cursor passes it
-- (the relay, after Kafka's ack); then stored, with no write to the record itself (the
-- isolation spec rollback_never_claimed shows a window never passes over a running one).
SELECT wal_enqueue('sm.plain', 'logged'::text, 'p4') AS p4 \gset
SELECT state, finished_at IS NULL AS unfinished, attempts FROM wal_delivery.outbox WHERE id = :p4;
SELECT topic, state, records FROM wal_delivery.backlog WHERE topic = 'sm.plain';
SELECT count(*) AS claimable FROM wal_delivery.claim_ready_to_ship(10);
SELECT regress.ack_log();
SELECT state, finished_at IS NOT NULL AS finished FROM wal_delivery.outbox WHERE id = :p4;
SELECT topic, state, records FROM wal_delivery.backlog WHERE topic = 'sm.plain';
SELECT * FROM regress.try(format('SELECT wal_delivery.mark_stored(ARRAY[%s]::bigint[])', :p4));
-- Held records keep their own state, whatever the cursor says.
SELECT id = :p2 AS p2, state FROM wal_delivery.outbox WHERE id IN (:p2, :p3) ORDER BY id;
SELECT count(*) AS rows_per_record FROM wal_delivery.outbox GROUP BY id ORDER BY 1 DESC LIMIT 1;
