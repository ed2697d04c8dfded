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

-- A repeated idempotency key with the same record returns the existing id and writes
-- nothing; with a different record (payload, message key, headers or content type) it is
-- 23W01, since a key names one record.
SELECT wal_enqueue('orders.events', '{"order_id": 42}'::jsonb, 'order-42-created', 'order-42',
                   '{"trace-id": "abc"}') = :id_json AS same_id;
SELECT * FROM regress.try($$SELECT wal_enqueue('orders.events', '{"order_id": 42, "again": true}'::jsonb, 'order-42-created', 'order-42', '{"trace-id": "abc"}')$$);
SELECT * FROM regress.try($$SELECT wal_enqueue('orders.events', '{"order_id": 42}'::jsonb, 'order-42-created')$$);
SELECT * FROM regress.try($$SELECT wal_enqueue('orders.events', '{"order_id": 42}'::text, 'order-42-created', 'order-42', '{"trace-id": "abc"}')$$);
SELECT * FROM regress.try($$SELECT wal_enqueue_batch('orders.events', ARRAY['{"n": 1}']::jsonb[], ARRAY['order-42-created'])$$);
SELECT count(*) FROM wal_delivery.outbox WHERE idempotency_key = 'order-42-created';
SELECT convert_from(payload, 'UTF8') AS first_payload_kept FROM wal_delivery.outbox WHERE id = :id_json;
-- The same key on another topic is another record.
SELECT wal_enqueue('plain.events', '{}'::jsonb, 'order-42-created') <> :id_json AS other_topic_other_id;
-- A NULL key gets a generated one, so two NULL-key records are two rows.
SELECT wal_enqueue('plain.events', '{"k": null}'::jsonb) <> wal_enqueue('plain.events', '{"k": null}'::jsonb) AS distinct_ids;
SELECT count(*) AS generated_keys FROM wal_delivery.outbox
 WHERE topic = 'plain.events' AND idempotency_key ~ '^[0-9a-f-]{36}$';

-- Batches: ids in input order, existing ids for known keys, duplicates inside a batch collapse.
SELECT wal_enqueue('orders.events', '{"n": 2}'::jsonb, 'b-2') AS id_b2 \gset
SELECT wal_enqueue_batch('orders.events', ARRAY['{"n": 1}', '{"n": 2}', '{"n": 1}']::jsonb[],
                         ARRAY['b-1', 'b-2', 'b-1']) AS ids \gset
SELECT (:'ids'::bigint[])[2] = :id_b2 AS known_key_gives_existing_id,
       (:'ids'::bigint[])[1] = (:'ids'::bigint[])[3] AS duplicate_in_batch_collapses,
       cardinality(:'ids'::bigint[]) AS n;
-- A key twice in one batch with two different records: the second is refused.
SELECT * FROM regress.try($$SELECT wal_enqueue_batch('orders.events', ARRAY['{"n": 5}', '{"n": 6}']::jsonb[], ARRAY['b-5', 'b-5'])$$);
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

-- Idempotency keys: 1 to 200 bytes without control characters, so "<topic>:<key>" (topics
-- are at most 249 bytes in Kafka) always makes a webhook-id a destination can be signed for.
SELECT * FROM regress.try($$SELECT wal_enqueue('orders.events', '{}'::jsonb, repeat('k', 201))$$);
SELECT * FROM regress.try($$SELECT wal_enqueue('orders.events', '{}'::jsonb, E'tab\there')$$);
SELECT * FROM regress.try($$SELECT wal_enqueue('orders.events', '{}'::bytea, E'line\r\nbreak')$$);
SELECT * FROM regress.try($$SELECT wal_enqueue('orders.events', '{}'::text, E'del\x7f')$$);
SELECT * FROM regress.try($$SELECT wal_enqueue('orders.events', '{}'::jsonb, E'unit\x1fsep')$$);
-- Message keys: NULL or 1 to 1024 bytes; an empty one would send every record to one partition.
SELECT * FROM regress.try($$SELECT wal_enqueue('orders.events', '{}'::jsonb, key => '')$$);

-- Headers: names the relay and the workers write are refused in any case, naming the header.
SELECT h AS reserved, (regress.try(format($$SELECT wal_enqueue('orders.events', '{}'::jsonb, headers => %L)$$,
                                         jsonb_build_object('trace-id', 'abc', h, 'x')))).*
  FROM unnest(ARRAY['idempotency-key', 'outbox-id', 'source-topic', 'content-type', 'created-at',
                    'source-partition', 'source-offset', 'destination', 'attempt', 'step-entered-at',
                    'step-jitter-ms', 'not-before', 'last-error', 'dead-reason', 'payload-omitted',
                    'Idempotency-Key', 'CONTENT-TYPE', 'Last-Error']) h;
-- Names are HTTP tokens; values are strings without control characters; at most 64 headers.
SELECT name, (regress.try(format($$SELECT wal_enqueue('orders.events', '{}'::jsonb, headers => %L)$$,
                                 jsonb_build_object(name, 'x')))).*
  FROM unnest(ARRAY['', 'two words', 'colon:', E'new\nline', 'caf' || chr(233), 'a"b', 'a/b']) name;
SELECT sqlstate, hint FROM regress.try(format($$SELECT wal_enqueue('orders.events', '{}'::jsonb, headers => %L)$$,
                                              jsonb_build_object(repeat('n', 257), 'x')));
SELECT value, (regress.try(format($$SELECT wal_enqueue('orders.events', '{}'::jsonb, headers => %L)$$,
                                  jsonb_build_object('h', value)))).*
  FROM unnest(ARRAY[E'crlf\r\ninjected: yes', E'tab\there', E'nul-ish\x01', E'del\x7f']) value;
SELECT * FROM regress.try($$SELECT wal_enqueue('orders.events', '{}'::jsonb, headers => '{"h": null}')$$);
SELECT * FROM regress.try($$SELECT wal_enqueue('orders.events', '{}'::jsonb, headers => '{"h": {"a": "b"}}')$$);
SELECT * FROM regress.try($$SELECT wal_enqueue('orders.events', '{}'::jsonb, headers => '["h", "v"]')$$);
SELECT * FROM regress.try(format($$SELECT wal_enqueue('orders.events', '{}'::jsonb, headers => %L)$$,
                                 (SELECT jsonb_object_agg('h' || i, 'v') FROM generate_series(1, 65) i)));

-- The whole record counts against the topic's limit: payload, idempotency key (a generated
-- one is 36 bytes), message key, header names and values.
SELECT * FROM regress.try($$SELECT wal_enqueue('orders.events', repeat('x', 995)::text, 'k-1234')$$);
SELECT * FROM regress.try($$SELECT wal_enqueue('orders.events', repeat('x', 965)::text)$$);
SELECT * FROM regress.try($$SELECT wal_enqueue('orders.events', repeat('x', 990)::text, 'k-1', key => 'mk', headers => '{"h": "vvvvv"}')$$);

-- Batches: every overload refuses a multi-dimensional array with the same error, and any
-- array of the call that is one; NULL elements and misaligned arrays the same way.
SELECT t AS payload_type, (regress.try(format($$SELECT wal_enqueue_batch('orders.events', ARRAY[['"a"', '"b"'], ['"c"', '"d"']]::%s[])$$, t))).*
  FROM unnest(ARRAY['jsonb', 'text', 'bytea']) t;
SELECT * FROM regress.try($$SELECT wal_enqueue_batch('orders.events', ARRAY['a', 'b', 'c', 'd']::text[], ARRAY[['k1', 'k2'], ['k3', 'k4']])$$);
SELECT * FROM regress.try($$SELECT wal_enqueue_batch('orders.events', ARRAY['a', 'b', 'c', 'd']::text[], keys => ARRAY[['k1', 'k2'], ['k3', 'k4']])$$);
SELECT * FROM regress.try($$SELECT wal_enqueue_batch('orders.events', ARRAY['a', 'b', 'c', 'd']::text[], headers => ARRAY[['{}', '{}'], ['{}', '{}']]::jsonb[])$$);
SELECT t AS payload_type, (regress.try(format($$SELECT wal_enqueue_batch('orders.events', ARRAY['"a"', NULL]::%s[])$$, t))).*
  FROM unnest(ARRAY['jsonb', 'text', 'bytea']) t;
SELECT t AS payload_type, (regress.try(format($$SELECT wal_enqueue_batch('orders.events', NULL::%s[])$$, t))).*
  FROM unnest(ARRAY['jsonb', 'text', 'bytea']) t;
SELECT t AS payload_type, (regress.try(format($$SELECT wal_enqueue_batch('orders.events', ARRAY['"a"']::%s[], ARRAY['k-1', 'k-2'])$$, t))).*
  FROM unnest(ARRAY['jsonb', 'text', 'bytea']) t;
SELECT * FROM regress.try($$SELECT wal_enqueue_batch('orders.events', '{}'::text[], ARRAY['k-1'])$$);
-- A bad record of a batch gets the same SQLSTATE as in wal_enqueue, with its position.
SELECT * FROM regress.try($$SELECT wal_enqueue_batch('orders.events', ARRAY['a', 'b']::text[], ARRAY['ok', repeat('k', 201)])$$);
SELECT * FROM regress.try($$SELECT wal_enqueue_batch('orders.events', ARRAY['a', 'b']::text[], ARRAY['ok', ''])$$);
SELECT * FROM regress.try($$SELECT wal_enqueue_batch('orders.events', ARRAY['a', 'b']::text[], ARRAY['ok', E'a\nb'])$$);
SELECT * FROM regress.try($$SELECT wal_enqueue_batch('orders.events', ARRAY['a', 'b']::text[], keys => ARRAY['ok', repeat('m', 1025)])$$);
SELECT * FROM regress.try($$SELECT wal_enqueue_batch('orders.events', ARRAY['a', 'b']::text[], keys => ARRAY['ok', ''])$$);
SELECT * FROM regress.try($$SELECT wal_enqueue_batch('orders.events', ARRAY['a', 'b']::bytea[], headers => ARRAY['{"ok": "1"}', '{"Outbox-Id": "1"}']::jsonb[])$$);
SELECT * FROM regress.try($$SELECT wal_enqueue_batch('orders.events', ARRAY['a', 'b']::text[], headers => ARRAY['{"ok": "1"}', E'{"h": "a\\r\\nb"}']::jsonb[])$$);
SELECT * FROM regress.try($$SELECT wal_enqueue_batch('orders.events', ARRAY['a', repeat('y', 990)]::text[], ARRAY['k-1', 'k-2345678-1'])$$);
SELECT count(*) - :rows_before AS rows_written_by_bad_input FROM wal_delivery.outbox;
-- The limit is the topic's and counts the whole record: exactly at the limit is accepted.
SELECT wal_enqueue('orders.events', repeat('x', 992)::text, 'at-limit') IS NOT NULL AS at_limit_ok;
SELECT wal_enqueue('orders.events', repeat('x', 964)::text) IS NOT NULL AS at_limit_generated_key_ok;
SELECT wal_enqueue('orders.events', repeat('x', 990)::text, 'k-2', key => 'mk', headers => '{"h": "vvvv"}')
       IS NOT NULL AS at_limit_with_key_and_headers_ok;
SELECT cardinality(wal_enqueue_batch('orders.events', ARRAY['a', repeat('y', 990)]::text[], ARRAY['k-3', 'k-234567-1']))
       AS at_limit_batch;
SELECT wal_enqueue('orders.events', '{}'::jsonb, 'headers-64',
                   headers => (SELECT jsonb_object_agg('h' || i, 'v') FROM generate_series(1, 64) i))
       IS NOT NULL AS sixty_four_headers_ok;
-- Header names are tokens in any case; a value may hold any printable text.
SELECT wal_enqueue('orders.events', '{}'::jsonb, 'token-names',
                   headers => jsonb_build_object('X-Trace_Id.v1!#$%&''*+^`|~', 'caf' || chr(233) || ' "quoted" ; a=b'))
       IS NOT NULL AS token_names_ok;
SELECT wal_enqueue('orders.events', '{}'::jsonb, 'long-name', headers => jsonb_build_object(repeat('n', 256), 'v'))
       IS NOT NULL AS header_name_of_256_bytes_ok;
SELECT wal_enqueue('orders.events', '{}'::jsonb, repeat('k', 200)) IS NOT NULL AS key_of_200_bytes_ok;
SELECT wal_enqueue('orders.events', '{}'::jsonb, 'printable: ' || chr(233) || ' ~!@ "x"') IS NOT NULL AS printable_key_ok;

-- On a topic of the default 1000000 bytes, 16384 bytes stay free under Kafka's message limit
-- for the headers the workers add when they hand a record to a retry step.
SELECT m, wal_delivery.record_limit(m) FROM unnest(ARRAY[1, 1000, 983616, 990000, 1000000, 5000000]) m;
SELECT * FROM regress.try($$SELECT wal_enqueue('plain.events', repeat('x', 983608)::text, 'edge-2', key => 'k', headers => '{"h": "v"}')$$);
SELECT wal_enqueue('plain.events', repeat('x', 983607)::text, 'edge-1', key => 'k', headers => '{"h": "v"}')
       IS NOT NULL AS at_default_limit_ok;

-- Arrays line up by position, whatever their lower bounds; empty arrays write nothing.
SELECT cardinality(wal_enqueue_batch('plain.events', '[0:1]={"b-0","b-1"}'::text[], '[5:6]={lb-0,lb-1}'::text[],
                                     '[2:3]={mk-0,mk-1}'::text[])) AS lower_bounds;
SELECT idempotency_key, message_key, convert_from(payload, 'UTF8') AS payload FROM wal_delivery.outbox
 WHERE idempotency_key LIKE 'lb-%' ORDER BY idempotency_key;
SELECT cardinality(wal_enqueue_batch('plain.events', '[0:0]={"\\x01"}'::bytea[], ARRAY['lb-bytea'])) AS bytea_lower_bound;
SELECT payload FROM wal_delivery.outbox WHERE idempotency_key = 'lb-bytea';
SELECT cardinality(wal_enqueue_batch('plain.events', '{}'::jsonb[], '{}', '{}', '{}')) AS empty_arrays,
       cardinality(wal_enqueue_batch('plain.events', '{}'::bytea[])) AS empty_bytea,
       cardinality(wal_enqueue_batch('plain.events', '{}'::text[], NULL, NULL, NULL)) AS empty_text;

-- The backlog view counts unshipped records by topic and state.
SELECT topic, state, records, oldest_age >= interval '0' AS has_age
  FROM wal_delivery.backlog ORDER BY topic, state;

-- wal_enqueue writes the log with heap and index inserts of its own, which run no
-- trigger: a log that has grown one is refused with a clear error, not written past it.
CREATE FUNCTION regress.no_op() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;
CREATE TRIGGER added_by_hand BEFORE INSERT ON wal_delivery.outbox_log
    FOR EACH ROW EXECUTE FUNCTION regress.no_op();
SELECT * FROM regress.try($$SELECT wal_enqueue('plain.events', '{"after": "trigger"}'::jsonb)$$);
DROP TRIGGER added_by_hand ON wal_delivery.outbox_log;
DROP FUNCTION regress.no_op();
SELECT wal_enqueue('plain.events', '{"after": "trigger"}'::jsonb) IS NOT NULL AS written_once_dropped;

-- Enqueue keeps the topics and the current generation per backend (enqueue_cache.c): the
-- session's next call sees its own change, and forgets one rolled back (the other
-- sessions' view: tests/integration/test_enqueue_cache.py).
INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas, max_payload_bytes)
VALUES ('cache.events', 1, 1, 100);
SELECT wal_enqueue('cache.events', repeat('x', 50)::text) IS NOT NULL AS under_the_limit;
UPDATE wal_delivery.topics SET max_payload_bytes = 10 WHERE name = 'cache.events';
SELECT sqlstate AS lowered_limit FROM regress.try($$SELECT wal_enqueue('cache.events', repeat('x', 50)::text)$$);
CREATE FUNCTION regress.same(p bytea) RETURNS bytea LANGUAGE sql AS 'SELECT p';
UPDATE wal_delivery.topics SET max_payload_bytes = 100, processor_kind = 'sql', processor = 'regress.same'
 WHERE name = 'cache.events';
SELECT wal_enqueue('cache.events', 'to be processed'::text, 'cache-p') AS p \gset
SELECT count(*) AS in_the_row_table FROM wal_delivery.outbox_rows WHERE id = :p;
BEGIN;
INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas) VALUES ('cache.rolled_back', 1, 1);
SELECT wal_enqueue('cache.rolled_back', '{}'::jsonb) IS NOT NULL AS in_its_transaction;
ROLLBACK;
SELECT sqlstate AS after_rollback FROM regress.try($$SELECT wal_enqueue('cache.rolled_back', '{}'::jsonb)$$);
BEGIN;
SAVEPOINT s;
INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas) VALUES ('cache.rolled_back', 1, 1);
SELECT wal_enqueue('cache.rolled_back', '{}'::jsonb) IS NOT NULL AS in_its_savepoint;
ROLLBACK TO s;
SELECT sqlstate AS after_rollback_to_savepoint FROM regress.try($$SELECT wal_enqueue('cache.rolled_back', '{}'::jsonb)$$);
COMMIT;
SET wal_delivery.force_delete = on;
DELETE FROM wal_delivery.topics WHERE name = 'cache.events';
RESET wal_delivery.force_delete;
SELECT sqlstate AS deleted_topic FROM regress.try($$SELECT wal_enqueue('cache.events', '{}'::jsonb)$$);
DROP FUNCTION regress.same(bytea);
-- The generation: a rotation in the transaction moves its next record, a rollback back.
SELECT gen AS old_gen FROM wal_delivery.outbox_generations WHERE sealed_at IS NULL \gset
SELECT wal_enqueue('plain.events', '{}'::jsonb) AS g \gset
SELECT gen = :old_gen AS in_the_current_generation FROM wal_delivery.outbox_log WHERE id = :g;
BEGIN;
UPDATE wal_delivery.outbox_generations SET sealed_at = now() WHERE gen = :old_gen;
UPDATE wal_delivery.outbox_generations SET sealed_at = NULL WHERE gen = (:old_gen + 1) % 3;
SELECT wal_enqueue('plain.events', '{}'::jsonb) AS g \gset
SELECT gen = (:old_gen + 1) % 3 AS in_the_next_generation FROM wal_delivery.outbox_log WHERE id = :g;
ROLLBACK;
SELECT wal_enqueue('plain.events', '{}'::jsonb) AS g \gset
SELECT gen = :old_gen AS back_after_rollback FROM wal_delivery.outbox_log WHERE id = :g;
-- (The rolled-back record left a page in the next generation, which rotation would take
-- for records; retention.sql rotates.)
SELECT format('TRUNCATE wal_delivery.outbox_log_%s', (:old_gen + 1) % 3) \gexec

-- The log's order index is on (log_order(lane, xid), id): one bigint that sorts as (lane,
-- xid) did, a lane's range ending where the next one's starts (lane 8: the end of lane 7),
-- and a clear error for what does not fit.
SELECT wal_delivery.log_order(0::smallint, '5'::xid8) < wal_delivery.log_order(0::smallint, '6'::xid8) AS xids_in_order,
       wal_delivery.log_order(0::smallint, '72057594037927935'::xid8)
       < wal_delivery.log_order(1::smallint, '0'::xid8) AS a_lane_before_the_next,
       wal_delivery.log_order(7::smallint, '4294967296'::xid8)
       < wal_delivery.log_order(8::smallint, '0'::xid8) AS the_end_of_the_last_lane;
SELECT * FROM regress.try($$SELECT wal_delivery.log_order(9::smallint, '1'::xid8)$$);
SELECT * FROM regress.try($$SELECT wal_delivery.log_order(-1::smallint, '1'::xid8)$$);
SELECT * FROM regress.try($$SELECT wal_delivery.log_order(0::smallint, '72057594037927936'::xid8)$$);
