-- The control plane: defaults from the design, bad rows refused with a clear error,
-- and a new config version for every committed change.
\pset format unaligned
\pset fieldsep ' | '

INSERT INTO wal_delivery.topics (name) VALUES ('defaults.topic');
SELECT acks, partitions, replication_factor, min_insync_replicas, retention, max_payload_bytes,
       idempotency_window, processor_kind, processing_lease, processing_max_attempts
  FROM wal_delivery.topics WHERE name = 'defaults.topic';
INSERT INTO wal_delivery.destinations (name, endpoint) VALUES ('defaults-dest', 'https://example.test/hook');
SELECT transport, method, headers, timeout, max_in_flight, dedicated, transient_statuses,
       retry_delays, retry_jitter, pause_after_failures, probe_interval, verify_tls
  FROM wal_delivery.destinations WHERE name = 'defaults-dest';
SELECT kafka_bootstrap_servers, retry_topic_prefix, dlq_topic, retry_dlq_retention,
       dead_letter_archive_after, consumer_dedupe_ttl FROM wal_delivery.settings;

-- Bad topics.
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, acks) VALUES ('t.acks0', 0)$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, acks) VALUES ('t.acks2', 2)$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, partitions) VALUES ('t.p0', 0)$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas) VALUES ('t.rf0', 0, 1)$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas) VALUES ('t.isr', 1, 2)$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name) VALUES ('bad name!')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name) VALUES (NULL)$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, max_payload_bytes) VALUES ('t.big', 0)$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, retention) VALUES ('t.ret', '0 days')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, processor_kind) VALUES ('t.proc', 'sql')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, processor_kind, processor) VALUES ('t.proc', 'sql', 'no_such_function')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, processor_kind, processor) VALUES ('t.proc', 'http', 'ftp://x')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, processing_max_attempts) VALUES ('t.att', 0)$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.topics SET acks = 0 WHERE name = 'defaults.topic'$$);
-- A SQL processor that exists is accepted.
CREATE FUNCTION regress.upper_payload(payload bytea) RETURNS bytea LANGUAGE sql
    AS $$ SELECT convert_to(upper(convert_from(payload, 'UTF8')), 'UTF8') $$;
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, processor_kind, processor) VALUES ('t.proc', 'sql', 'regress.upper_payload')$$);

-- Bad destinations.
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint) VALUES ('d1', 'ftp://example.test')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint) VALUES ('d1', 'example.test/hook')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint, method) VALUES ('d1', 'http://x', 'GET')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint, headers) VALUES ('d1', 'http://x', '{"X-N": 1}')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint, headers) VALUES ('d1', 'http://x', '["a"]')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint, timeout) VALUES ('d1', 'http://x', '1 hour')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint, transient_statuses) VALUES ('d1', 'http://x', '{429,6xx}')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint, retry_delays) VALUES ('d1', 'http://x', '{10 seconds}')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint, pause_after_failures) VALUES ('d1', 'http://x', 0)$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destination_secrets VALUES ('defaults-dest', 'short')$$);

-- Bad subscriptions.
SELECT * FROM regress.try($$INSERT INTO wal_delivery.subscriptions VALUES ('no.such.topic', 'defaults-dest')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.subscriptions VALUES ('defaults.topic', 'no-such-dest')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.subscriptions VALUES ('defaults.topic', 'defaults-dest')$$);

-- Bad settings.
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET dead_letter_archive_after = '20 days'$$);

-- Nothing refused above was written.
SELECT name FROM wal_delivery.topics ORDER BY name;
SELECT name FROM wal_delivery.destinations ORDER BY name;

-- Each committed change bumps the version; a rolled-back one does not.
SELECT version AS v0 FROM wal_delivery.config_version \gset
UPDATE wal_delivery.topics SET partitions = 6 WHERE name = 'defaults.topic';
SELECT version - :v0 AS bumped_by FROM wal_delivery.config_version;
BEGIN;
UPDATE wal_delivery.destinations SET max_in_flight = 4 WHERE name = 'defaults-dest';
ROLLBACK;
SELECT version - :v0 AS bumped_by, in_sync FROM wal_delivery.config_status;

-- Deleting a topic or destination with undelivered records is refused unless forced.
SELECT wal_enqueue('defaults.topic', '{"n": 1}'::jsonb) IS NOT NULL AS enqueued;
SELECT * FROM regress.try($$DELETE FROM wal_delivery.topics WHERE name = 'defaults.topic'$$);
SELECT * FROM regress.try($$DELETE FROM wal_delivery.destinations WHERE name = 'defaults-dest'$$);
BEGIN;
SET LOCAL wal_delivery.force_delete = on;
DELETE FROM wal_delivery.destinations WHERE name = 'defaults-dest';
DELETE FROM wal_delivery.topics WHERE name = 'defaults.topic';
COMMIT;
SELECT count(*) AS rows_left FROM wal_delivery.outbox WHERE topic = 'defaults.topic';
SELECT count(*) AS subscriptions_left FROM wal_delivery.subscriptions;
DELETE FROM wal_delivery.topics;

-- What keeps one bad row from stopping the fleet, as a DBA runs it: a non-superuser login
-- member of wal_delivery_admin (docs/operations.md, "Checks on the config tables").
CREATE FUNCTION regress.proc_text(payload bytea) RETURNS text LANGUAGE sql AS $$ SELECT 'x' $$;
CREATE FUNCTION regress.proc_set(payload bytea) RETURNS SETOF bytea LANGUAGE sql AS $$ SELECT payload $$;
CREATE PROCEDURE regress.proc_proc(payload bytea) LANGUAGE sql AS $$ SELECT 1 $$;
CREATE ROLE regress_config_admin LOGIN IN ROLE wal_delivery_admin;
GRANT USAGE ON SCHEMA regress TO regress_config_admin;
GRANT EXECUTE ON FUNCTION regress.try(text) TO regress_config_admin;
SET SESSION AUTHORIZATION regress_config_admin;
-- Topic names Kafka refuses, Kafka's own, and names of the system's own topics.
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name) VALUES ('.')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name) VALUES ('..')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name) VALUES ('__consumer_offsets')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name) VALUES (repeat('a', 250))$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name) VALUES ('')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name) VALUES ('wal_delivery.dlq')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name) VALUES ('wal_delivery.retry.2')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name) VALUES ('wal_delivery_retry_3')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name) VALUES (repeat('a', 249))$$);
-- "." and "_" are the same to Kafka; a topic may rename itself across them.
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name) VALUES ('k.a.b')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name) VALUES ('k_a_b')$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.topics SET name = 'k.a_b' WHERE name = 'k.a.b'$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name) VALUES ('k.r.1')$$);
-- Settings against the topics, and against themselves.
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET dlq_topic = 'k_a.b'$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET retry_topic_prefix = 'k.r.'$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET dlq_topic = 'wal_delivery.retry.1'$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET dlq_topic = 'wal_delivery_retry.pauses'$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET retry_topic_prefix = '__wd.'$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET dlq_topic = '..'$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET retry_topic_prefix = repeat('r', 244)$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET retry_dlq_retention = '101 years'$$);
SELECT retry_topic_prefix, dlq_topic FROM wal_delivery.settings;
-- Bounds: partitions can only grow in Kafka; counters and timestamps must not overflow.
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, partitions) VALUES ('k.p', 1001)$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, processing_max_attempts) VALUES ('k.p', 1001)$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, processing_backoff) VALUES ('k.p', '6 minutes')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, processing_lease) VALUES ('k.p', '2 days')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, retention) VALUES ('k.p', '101 years')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, idempotency_window) VALUES ('k.p', '101 years')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, partitions, processing_max_attempts) VALUES ('k.p', 1000, 1000)$$);
-- SQL processors: a plain function from bytea to bytea, outside a temporary schema.
CREATE FUNCTION pg_temp.proc_tmp(payload bytea) RETURNS bytea LANGUAGE sql AS $$ SELECT payload $$;
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, processor_kind, processor) VALUES ('k.proc', 'sql', 'pg_temp.proc_tmp')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, processor_kind, processor) VALUES ('k.proc', 'sql', 'regress.proc_text')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, processor_kind, processor) VALUES ('k.proc', 'sql', 'regress.proc_set')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, processor_kind, processor) VALUES ('k.proc', 'sql', 'regress.proc_proc')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.topics (name, processor_kind, processor) VALUES ('k.proc', 'http', E'http://transform.test/x\r\nHost: evil')$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.topics SET processor_kind = 'sql', processor = 'regress.proc_text' WHERE name = 'k.p'$$);
-- Destination headers: no framing, hop-by-hop or system headers, tokens only, no CR/LF.
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint, headers) VALUES ('k-d', 'http://x/', '{"Content-Length": "0"}')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint, headers) VALUES ('k-d', 'http://x/', '{"transfer-encoding": "chunked"}')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint, headers) VALUES ('k-d', 'http://x/', '{"Host": "other.test"}')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint, headers) VALUES ('k-d', 'http://x/', '{"Connection": "close"}')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint, headers) VALUES ('k-d', 'http://x/', '{"Proxy-Authorization": "Basic x"}')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint, headers) VALUES ('k-d', 'http://x/', '{"Idempotency-Key": "k"}')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint, headers) VALUES ('k-d', 'http://x/', '{"X-Wal-Topic": "t"}')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint, headers) VALUES ('k-d', 'http://x/', '{"webhook-signature": "v1,x"}')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint, headers) VALUES ('k-d', 'http://x/', '{"Content-Type": "text/plain"}')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint, headers) VALUES ('k-d', 'http://x/', '{"Bad Name": "x"}')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint, headers) VALUES ('k-d', 'http://x/', '{"X-Ok": "a\r\nInjected: 1"}')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint, headers) VALUES ('k-d', 'http://x/', '{"X-Ok": "a\u0000b"}')$$);
-- Endpoints: whole http(s) URLs.
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint) VALUES ('k-d', 'http://x/a b')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint) VALUES ('k-d', E'http://x/\r\nHost: evil')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint) VALUES ('k-d', 'http://user:pw@x/')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint) VALUES ('k-d', 'http://x:0/')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint) VALUES ('k-d', 'http://x:70000/')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint) VALUES ('k-d', 'http://x/#frag')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint) VALUES ('k-d', 'http://x/%zz')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint) VALUES ('k-d', 'http://x/"q"')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint) VALUES ('k-d', 'http:///path')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint) VALUES ('k-d', 'http://x/' || repeat('a', 2048))$$);
-- Retry delays against the retry topics' retention, both ways; the probe interval.
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint, retry_delays) VALUES ('k-d', 'http://x/', '{1 day,2 days,12 days}')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint, probe_interval) VALUES ('k-d', 'http://x/', '500 milliseconds')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint, probe_interval) VALUES ('k-d', 'http://x/', '2 days')$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint, pause_after_failures) VALUES ('k-d', 'http://x/', 1000001)$$);
SELECT * FROM regress.try($$INSERT INTO wal_delivery.destinations (name, endpoint, headers, retry_delays, retry_jitter)
                            VALUES ('k-d', 'https://[::1]:8443/hooks?x=%20', '{"Authorization": "Bearer x", "X-Team": "b"}', '{1 day,2 days,12 days}', 0)$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET retry_dlq_retention = '12 days'$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.destinations SET retry_jitter = 0.2 WHERE name = 'k-d'$$);
-- The DLQ alert URL.
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET dlq_alert_url = E'https://alerts.test/x\r\nHost: evil'$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET dlq_alert_url = 'https://ops:secret@alerts.test/x'$$);
SELECT * FROM regress.try($$UPDATE wal_delivery.settings SET dlq_alert_url = 'https://alerts.test/x'$$);
UPDATE wal_delivery.settings SET dlq_alert_url = NULL;
RESET SESSION AUTHORIZATION;
SELECT name FROM wal_delivery.topics WHERE name LIKE 'k%' ORDER BY name;
SELECT name, endpoint FROM wal_delivery.destinations WHERE name LIKE 'k%' ORDER BY name;
DELETE FROM wal_delivery.destinations WHERE name = 'k-d';
DELETE FROM wal_delivery.topics;
DROP OWNED BY regress_config_admin;
DROP ROLE regress_config_admin;

-- A topic may allow 1000 processing attempts: the attempts counter (a smallint) stays far
-- from its limit, and the backoff it doubles stops growing at its 5-minute cap instead of
-- overflowing (an interval of 2^44 seconds was out of range: the 45th failure raised).
INSERT INTO wal_delivery.topics (name, processor_kind, processor, processing_max_attempts)
VALUES ('k.many', 'sql', 'regress.upper_payload', 1000);
SELECT wal_enqueue('k.many', '{}'::jsonb, 'many') IS NOT NULL AS enqueued;
CREATE TEMP TABLE many AS SELECT id, lease_token FROM wal_delivery.claim_ready_to_process(1);
UPDATE wal_delivery.outbox_rows SET attempts = 999 WHERE id = (SELECT id FROM many);
SELECT wal_delivery.fail_processing((SELECT id FROM many), (SELECT lease_token FROM many), 'failed again') AS after_999;
SELECT attempts, available_at - now() BETWEEN interval '4 minutes 59 seconds' AND interval '5 minutes' AS backoff_at_cap
  FROM wal_delivery.outbox WHERE id = (SELECT id FROM many);
UPDATE wal_delivery.outbox_rows SET available_at = now() WHERE id = (SELECT id FROM many);
CREATE TEMP TABLE last AS SELECT id, lease_token, attempts FROM wal_delivery.claim_ready_to_process(1);
SELECT attempts, wal_delivery.fail_processing(id, lease_token, 'failed for good') AS after_1000 FROM last;
SELECT origin, attempts, last_error FROM wal_delivery.dead_letters WHERE topic = 'k.many';
DELETE FROM wal_delivery.dead_letters WHERE topic = 'k.many';
DELETE FROM wal_delivery.outbox WHERE topic = 'k.many';
DELETE FROM wal_delivery.topics WHERE name = 'k.many';
