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
