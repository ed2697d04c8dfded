-- Pausing and dead letters in SQL: the shared pause state with its probe lease (one
-- holder per interval), the per-step counters, the operator view, and on-call's replay,
-- resolve and inspect with clear errors for what cannot be done.
\pset format unaligned
\pset fieldsep ' | '
INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas) VALUES ('rt.events', 1, 1);
INSERT INTO wal_delivery.destinations (name, endpoint) VALUES ('rt-a', 'https://a.test/'), ('rt-b', 'https://b.test/');

-- Never paused: closed. Pausing twice pauses once; a probe waits for its interval.
SELECT destination, breaker, next_probe_at FROM wal_delivery.destination_status WHERE destination LIKE 'rt-%' ORDER BY 1;
SELECT wal_delivery.pause_destination('rt-a', 1, 'HTTP 503', '1 hour') AS paused,
       wal_delivery.pause_destination('rt-a', 2, 'HTTP 502', '1 hour') AS paused_again,
       wal_delivery.pause_destination('no-such', 1, 'x', '1 hour') AS unknown_paused;
SELECT breaker, paused_step, pause_reason, next_probe_at > now() + interval '59 minutes' AS probe_later
  FROM wal_delivery.destination_status WHERE destination = 'rt-a';
SELECT wal_delivery.claim_probe('rt-a', 'p1', '10 s') AS too_early;
-- Once due, exactly one holder wins the lease.
UPDATE wal_delivery.destination_pauses SET next_probe_at = now() - interval '1 s' WHERE destination = 'rt-a';
SELECT wal_delivery.claim_probe('rt-a', 'p1', '10 s') AS p1, wal_delivery.claim_probe('rt-a', 'p2', '10 s') AS p2;
SELECT breaker, probes FROM wal_delivery.destination_status WHERE destination = 'rt-a';
-- Only the holder's answer counts; transient keeps it paused with the next probe later.
SELECT wal_delivery.finish_probe('rt-a', 'p2', 'success', NULL, '1 hour') AS resumed_by_stranger;
SELECT wal_delivery.finish_probe('rt-a', 'p1', 'transient', 'HTTP 503 again', '1 hour') AS resumed;
SELECT breaker, last_probe_outcome, pause_reason FROM wal_delivery.destination_status WHERE destination = 'rt-a';
SELECT * FROM regress.try($$SELECT wal_delivery.finish_probe('rt-a', 'p1', 'maybe', NULL, '1 s')$$);
-- On-call's override.
SELECT wal_delivery.resume_destination('rt-a') AS resumed, wal_delivery.resume_destination('rt-a') AS again;
SELECT breaker, last_probe_outcome FROM wal_delivery.destination_status WHERE destination = 'rt-a';
SELECT * FROM regress.try($$SELECT wal_delivery.resume_destination('nope')$$);

-- Counters: deltas add up, current values replace, unknown destinations are skipped.
SELECT wal_delivery.report_step_stats('w1', '[{"destination": "rt-b", "step": 2, "consecutive_failures": 4, "delivered": 3, "failed": 4, "backlog": 9, "last_error": "HTTP 500", "last_error_at": "2026-01-01T00:00:00Z"}, {"destination": "ghost", "step": 1}]') AS rows;
SELECT wal_delivery.report_step_stats('w2', '[{"destination": "rt-b", "step": 2, "consecutive_failures": 0, "delivered": 2, "failed": 0, "backlog": 5}]') AS rows;
SELECT consecutive_failures, delivered, failed, backlog, last_error FROM wal_delivery.destination_status WHERE destination = 'rt-b';

-- Dead letters: inspect, replay and resolve.
INSERT INTO wal_delivery.dead_letters (id, origin, topic, idempotency_key, destination, payload, attempts, last_error)
OVERRIDING SYSTEM VALUE
VALUES (9001, 'delivery', 'rt.events', 'k1', 'rt-b', '{"n": 1}', 4, 'HTTP 503'),
       (9002, 'delivery', 'rt.events', 'k2', 'rt-gone', '\xff00', 1, 'HTTP 400'),
       (9003, 'processing', 'rt.events', 'k3', NULL, 'x', 5, 'processor failed');
SELECT wal_delivery.inspect_dead_letter(id) - 'id' - 'failed_at' FROM wal_delivery.dead_letters WHERE idempotency_key IN ('k1', 'k2') ORDER BY id;
SELECT * FROM regress.try('SELECT wal_delivery.inspect_dead_letter(-1)');
SELECT wal_delivery.replay_dead_letter(id) FROM wal_delivery.dead_letters WHERE idempotency_key = 'k1';
SELECT idempotency_key, destination FROM wal_delivery.dead_letters_to_replay(10);
SELECT * FROM regress.try($$SELECT wal_delivery.replay_dead_letter(id) FROM wal_delivery.dead_letters WHERE idempotency_key = 'k2'$$);
SELECT * FROM regress.try($$SELECT wal_delivery.replay_dead_letter(id) FROM wal_delivery.dead_letters WHERE idempotency_key = 'k3'$$);
SELECT * FROM regress.try('SELECT wal_delivery.replay_dead_letter(-1)');
SELECT wal_delivery.complete_replay(id) FROM wal_delivery.dead_letters WHERE idempotency_key = 'k1';
SELECT idempotency_key, resolution, replays FROM wal_delivery.dead_letters WHERE idempotency_key = 'k1';
SELECT sqlstate, hint FROM regress.try($$SELECT wal_delivery.replay_dead_letter(id) FROM wal_delivery.dead_letters WHERE idempotency_key = 'k1'$$);
SELECT * FROM regress.try($$SELECT wal_delivery.resolve_dead_letter(id, '  ') FROM wal_delivery.dead_letters WHERE idempotency_key = 'k2'$$);
SELECT wal_delivery.resolve_dead_letters('destination retired', p_destination => 'rt-gone') AS resolved;
SELECT * FROM regress.try($$SELECT wal_delivery.resolve_dead_letter(id, 'again') FROM wal_delivery.dead_letters WHERE idempotency_key = 'k2'$$);
-- Alerts: every new row waits for its alert until marked.
SELECT idempotency_key FROM wal_delivery.dead_letters_to_alert(10) WHERE topic = 'rt.events' ORDER BY id;
SELECT wal_delivery.mark_dead_letter_alerted(id) FROM wal_delivery.dead_letters WHERE topic = 'rt.events';
SELECT count(*) AS still_to_alert FROM wal_delivery.dead_letters_to_alert(10) WHERE topic = 'rt.events';

-- The writer role may do none of this.
CREATE ROLE regress_rt_app LOGIN IN ROLE wal_delivery_writer;
SET ROLE regress_rt_app;
SELECT * FROM regress.try($$SELECT wal_delivery.pause_destination('rt-a', 1, 'x', '1 s')$$);
SELECT * FROM regress.try('SELECT * FROM wal_delivery.destination_status');
SELECT * FROM regress.try('SELECT wal_delivery.replay_dead_letters()');
RESET ROLE;
DROP ROLE regress_rt_app;
DELETE FROM wal_delivery.dead_letters WHERE topic = 'rt.events';
SET wal_delivery.force_delete = on;
DELETE FROM wal_delivery.destinations WHERE name LIKE 'rt-%';
DELETE FROM wal_delivery.topics WHERE name = 'rt.events';
RESET wal_delivery.force_delete;
SELECT count(*) AS pause_rows_left FROM wal_delivery.destination_pauses;
