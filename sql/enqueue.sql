-- wal_enqueue and wal_enqueue_batch: payload kinds, idempotency, stored metadata, the
-- commit-time wakeup, and every bad input refused without writing a row.
\pset format unaligned
\pset fieldsep ' | '
INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas, max_payload_bytes)
VALUES ('orders.events', 1, 1, 1000), ('plain.events', 1, 1, 1000000);

-- jsonb, bytea and text payloads, each with its content type; unqualified from any search_path.
SET search_path = nowhere;
SELECT wal_enqueue('orders.events', '{"order_id": 42}'::jsonb, 'order-42-created', 'order-42',
                   '{"trace-id": "abc"}') AS id_json \gset
SELECT wal_enqueue('orders.events', '\x00ff'::bytea, 'bin-1') AS id_bytea \gset
SELECT wal_enqueue('orders.events', 'hello'::text, 'text-1') AS id_text \gset
RESET search_path;
SELECT idempotency_key, message_key, headers, content_type, convert_from(payload, 'UTF8') AS payload_text,
       state, needs_processing, attempts
  FROM wal_delivery.outbox WHERE id IN (:id_json, :id_text) ORDER BY id;
SELECT payload FROM wal_delivery.outbox WHERE id = :id_bytea;
SELECT enqueued_by::regrole FROM wal_delivery.outbox WHERE id = :id_json;

-- A repeated idempotency key returns the existing id and writes nothing.
SELECT wal_enqueue('orders.events', '{"order_id": 42, "again": true}'::jsonb, 'order-42-created') = :id_json AS same_id;
SELECT count(*) FROM wal_delivery.outbox WHERE idempotency_key = 'order-42-created';
SELECT convert_from(payload, 'UTF8') AS first_payload_kept FROM wal_delivery.outbox WHERE id = :id_json;
-- The same key on another topic is another record.
SELECT wal_enqueue('plain.events', '{}'::jsonb, 'order-42-created') <> :id_json AS other_topic_other_id;
-- A NULL key gets a generated one, so two NULL-key records are two rows.
SELECT wal_enqueue('plain.events', '{"k": null}'::jsonb) <> wal_enqueue('plain.events', '{"k": null}'::jsonb) AS distinct_ids;
SELECT count(*) AS generated_keys FROM wal_delivery.outbox
 WHERE topic = 'plain.events' AND idempotency_key ~ '^[0-9a-f-]{36}$';

-- Batches: ids in input order, existing ids for known keys, duplicates inside a batch collapse.
SELECT wal_enqueue_batch('orders.events', ARRAY['{"n": 1}', '{"n": 2}', '{"n": 3}']::jsonb[],
                         ARRAY['b-1', 'order-42-created', 'b-1']) AS ids \gset
SELECT (:'ids'::bigint[])[2] = :id_json AS known_key_gives_existing_id,
       (:'ids'::bigint[])[1] = (:'ids'::bigint[])[3] AS duplicate_in_batch_collapses,
       cardinality(:'ids'::bigint[]) AS n;
SELECT cardinality(wal_enqueue_batch('plain.events', ARRAY['a', 'b']::text[])) AS text_batch,
       cardinality(wal_enqueue_batch('plain.events', ARRAY['\x01'::bytea])) AS bytea_batch,
       cardinality(wal_enqueue_batch('plain.events', '{}'::jsonb[])) AS empty_batch;
SELECT content_type, message_key, headers FROM wal_delivery.outbox
 WHERE id = (SELECT max(id) FROM wal_delivery.outbox WHERE topic = 'plain.events');
SELECT wal_enqueue_batch('plain.events', ARRAY['{"x": 1}']::jsonb[], ARRAY['hb-1'], ARRAY['key-1'],
                         ARRAY['{"h": "v"}']::jsonb[]) IS NOT NULL AS with_keys_and_headers;
SELECT message_key, headers FROM wal_delivery.outbox WHERE idempotency_key = 'hb-1';

-- The relay is woken once per committed transaction that enqueued, at commit, never before.
SELECT wal_delivery.relay_wakeups() AS w0 \gset
BEGIN;
SELECT wal_enqueue('plain.events', '{}'::jsonb, 'wake-1') IS NOT NULL AS enqueued;
SELECT wal_enqueue('plain.events', '{}'::jsonb, 'wake-2') IS NOT NULL AS enqueued;
SELECT wal_delivery.relay_wakeups() - :w0 AS wakeups_before_commit;
COMMIT;
SELECT wal_delivery.relay_wakeups() - :w0 AS wakeups_after_commit;
BEGIN;
SELECT wal_enqueue('plain.events', '{}'::jsonb, 'rolled-back') IS NOT NULL AS enqueued;
ROLLBACK;
SELECT wal_delivery.relay_wakeups() - :w0 AS wakeups_after_rollback,
       count(*) AS rolled_back_rows FROM wal_delivery.outbox WHERE idempotency_key = 'rolled-back';

-- Bad input: each refused with its SQLSTATE and what to fix, and no row written.
SELECT count(*) AS rows_before FROM wal_delivery.outbox \gset
SELECT * FROM regress.try($$SELECT wal_enqueue('no.such.topic', '{}'::jsonb)$$);
SELECT * FROM regress.try($$SELECT wal_enqueue(NULL, '{}'::jsonb)$$);
SELECT * FROM regress.try($$SELECT wal_enqueue('', '{}'::jsonb)$$);
SELECT * FROM regress.try($$SELECT wal_enqueue('orders.events', NULL::jsonb)$$);
SELECT * FROM regress.try($$SELECT wal_enqueue('orders.events', repeat('x', 1001)::text)$$);
SELECT * FROM regress.try($$SELECT wal_enqueue('orders.events', '{}'::jsonb, headers => '{"n": 1}')$$);
SELECT * FROM regress.try($$SELECT wal_enqueue('orders.events', '{}'::jsonb, headers => '"str"')$$);
SELECT * FROM regress.try($$SELECT wal_enqueue('orders.events', '{}'::jsonb, repeat('k', 256))$$);
SELECT * FROM regress.try($$SELECT wal_enqueue('orders.events', '{}'::jsonb, '')$$);
SELECT * FROM regress.try($$SELECT wal_enqueue('orders.events', '{}'::jsonb, key => repeat('k', 1025))$$);
SELECT * FROM regress.try($$SELECT wal_enqueue_batch('no.such.topic', ARRAY['{}']::jsonb[])$$);
SELECT * FROM regress.try($$SELECT wal_enqueue_batch('orders.events', ARRAY['{}', NULL]::jsonb[])$$);
SELECT * FROM regress.try($$SELECT wal_enqueue_batch('orders.events', ARRAY['{}', '{}']::jsonb[], ARRAY['one-key'])$$);
SELECT * FROM regress.try($$SELECT wal_enqueue_batch('orders.events', ARRAY['{}', repeat('y', 1001)]::text[])$$);
SELECT * FROM regress.try($$SELECT wal_enqueue_batch('orders.events', ARRAY['{}']::jsonb[], headers => ARRAY['{"n": 1}']::jsonb[])$$);
SELECT * FROM regress.try($$SELECT wal_enqueue_batch('orders.events', NULL::jsonb[])$$);
SELECT count(*) - :rows_before AS rows_written_by_bad_input FROM wal_delivery.outbox;
-- The payload limit is the topic's: exactly at the limit is accepted.
SELECT wal_enqueue('orders.events', repeat('x', 1000)::text, 'at-limit') IS NOT NULL AS at_limit_ok;

-- The backlog view counts unshipped records by topic and state.
SELECT topic, state, records, oldest_age >= interval '0' AS has_age
  FROM wal_delivery.backlog ORDER BY topic, state;
