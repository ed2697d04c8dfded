-- Trace context: the session settings wal_delivery.traceparent and .tracestate (checked
-- when set), the records wal_enqueue* take them into (every topic kind, both paths), and
-- the record contract's check of traceparent and tracestate headers.
\pset format unaligned
\pset fieldsep ' | '
INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas, max_payload_bytes)
VALUES ('trace.events', 1, 1, 1000);
CREATE FUNCTION regress.trace_same(p bytea) RETURNS bytea LANGUAGE sql AS 'SELECT p';
INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas, processor_kind, processor)
VALUES ('trace.processed', 1, 1, 'sql', 'regress.trace_same');

-- The settings refuse what the workers could not continue, saying what is wrong.
SET wal_delivery.traceparent = 'bad';
SET wal_delivery.traceparent = '00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01';
SET wal_delivery.traceparent = '00-00000000000000000000000000000000-00f067aa0ba902b7-01';
SET wal_delivery.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01';
SET wal_delivery.traceparent = 'ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
SET wal_delivery.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-010';
SET wal_delivery.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0';
SET wal_delivery.tracestate = E'a=1\tb=2';

SELECT repeat('v', 513) AS long_state \gset
SET wal_delivery.tracestate = :'long_state';
SELECT sqlstate, message FROM regress.try($$SET LOCAL wal_delivery.traceparent = 'bad'$$);
-- A later version may carry more fields; empty is unset.
SET wal_delivery.traceparent = '01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later';
SET wal_delivery.traceparent = '';
SHOW wal_delivery.traceparent;

-- Unset: a record gets no header from the session.
SELECT wal_enqueue('trace.events', '{}'::jsonb, 'untraced') AS id \gset
SELECT headers FROM wal_delivery.outbox WHERE id = :id;

-- Set in the app's transaction (SET LOCAL): every record without a traceparent of its own
-- takes the session's, with its tracestate, on the C path and the SQL path alike.
BEGIN;
SET LOCAL wal_delivery.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
SET LOCAL wal_delivery.tracestate = 'vendor=abc';
SELECT wal_enqueue('trace.events', '{}'::jsonb, 't-json') IS NOT NULL AS json,
       wal_enqueue('trace.events', 'x'::text, 't-text', headers => '{"h": "v"}') IS NOT NULL AS text_with_headers,
       wal_enqueue('trace.events', '\x00'::bytea, 't-bytea') IS NOT NULL AS bytea,
       wal_enqueue('trace.processed', '{}'::jsonb, 't-processed') IS NOT NULL AS processed_topic;
SELECT cardinality(wal_enqueue_batch('trace.events', ARRAY['{"n": 1}', '{"n": 2}']::jsonb[],
                                     ARRAY['t-b1', 't-b2'], headers => ARRAY[NULL, '{"h": "2"}']::jsonb[])) AS batch,
       cardinality(wal_enqueue_batch('trace.events', ARRAY['a']::text[], ARRAY['t-b3'])) AS batch_without_headers,
       cardinality(wal_enqueue_batch('trace.processed', ARRAY['\x01'::bytea], ARRAY['t-b4'])) AS processed_batch;
-- A record's own traceparent (any case) wins, and the session's tracestate stays out of it.
SELECT wal_enqueue('trace.events', '{}'::jsonb, 't-own',
                   headers => '{"TraceParent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}') IS NOT NULL AS own;
-- Over the header limit with the session's two added: refused by count, as any record.
SELECT sqlstate, message FROM regress.try($$SELECT wal_enqueue('trace.events', '{}'::jsonb, 't-full',
         headers => (SELECT jsonb_object_agg('h' || i, 'v') FROM generate_series(1, 63) i))$$);
-- The same record again in another span is a retry, not another record: the trace
-- context is not part of what a key names.
SET LOCAL wal_delivery.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01';
SELECT wal_enqueue('trace.events', '{}'::jsonb, 't-json') = (SELECT id FROM wal_delivery.outbox WHERE idempotency_key = 't-json') AS retry_same_id;
COMMIT;
SELECT idempotency_key, headers FROM wal_delivery.outbox WHERE idempotency_key LIKE 't-%' ORDER BY idempotency_key;
-- After the transaction the session has none again.
SELECT wal_enqueue('trace.events', '{}'::jsonb, 'after') AS id \gset
SELECT headers FROM wal_delivery.outbox WHERE id = :id;
-- Without a setting, a retry of a traced record is the same record too.
SELECT wal_enqueue('trace.events', '{}'::jsonb, 't-json') = (SELECT id FROM wal_delivery.outbox WHERE idempotency_key = 't-json') AS retry_untraced;
SELECT sqlstate FROM regress.try($$SELECT wal_enqueue('trace.events', '{"other": 1}'::jsonb, 't-json')$$);

-- The record contract: a traceparent or tracestate header must be readable, in any case,
-- on both doors (the ingest service's answer is 400 with the same message).
SELECT sqlstate, message, hint FROM regress.try($$SELECT wal_enqueue('trace.events', '{}'::jsonb, headers => '{"traceparent": "bad"}')$$);
SELECT sqlstate, message FROM regress.try($$SELECT wal_enqueue('trace.events', '{}'::jsonb, headers => '{"traceparent": "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"}')$$);
SELECT sqlstate, message FROM regress.try($$SELECT wal_enqueue('trace.events', '{}'::jsonb, headers => '{"TraceParent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"}')$$);
SELECT sqlstate, message FROM regress.try($$SELECT wal_enqueue('trace.events', '{}'::jsonb, headers => '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"}')$$);
SELECT sqlstate, message FROM regress.try($$SELECT wal_enqueue('trace.events', '{}'::jsonb, headers => '{"traceparent": "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}')$$);
SELECT sqlstate, message FROM regress.try($$SELECT wal_enqueue('trace.events', '{}'::jsonb, headers => '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0"}')$$);
SELECT sqlstate, message FROM regress.try($$SELECT wal_enqueue('trace.events', '{}'::jsonb, headers => '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "TRACEPARENT": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}')$$);
SELECT sqlstate, message FROM regress.try($$SELECT wal_enqueue('trace.events', '{}'::jsonb, headers => jsonb_build_object('tracestate', repeat('v', 513)))$$);
SELECT sqlstate, message FROM regress.try($$SELECT wal_enqueue('trace.events', '{}'::jsonb, headers => '{"tracestate": "a=1\u0007"}')$$);
SELECT sqlstate, message FROM regress.try($$SELECT wal_enqueue('trace.events', '{}'::jsonb, headers => '{"tracestate": "a=é"}')$$);
SELECT sqlstate, message FROM regress.try($$SELECT wal_enqueue_batch('trace.events', ARRAY['{}']::jsonb[], headers => ARRAY['{"traceparent": "bad"}']::jsonb[])$$);
SELECT sqlstate, message FROM regress.try($$SELECT wal_enqueue('trace.processed', '{}'::jsonb, headers => '{"traceparent": "bad"}')$$);
SELECT count(*) AS nothing_refused_was_written FROM wal_delivery.outbox WHERE idempotency_key = 't-full' OR headers ? 'tracestate' AND length(headers->>'tracestate') > 512;

SET wal_delivery.force_delete = on;
DELETE FROM wal_delivery.topics WHERE name IN ('trace.events', 'trace.processed');
RESET wal_delivery.force_delete;
DROP FUNCTION regress.trace_same(bytea);
