-- bench/console: 1,000,000 dead letters as the dlq worker leaves them: 10 topics, 20
-- destinations, ~300-byte JSON payloads, failures spread over the last 48 hours, one in
-- ten resolved. Written straight into the table (what a year of ingest_dead_letter
-- would have left), then vacuumed and analyzed, as autovacuum leaves a table that old;
-- and 6 hours of per-minute delivery counts (below).
INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas)
SELECT 'bench.t' || t, 1, 1 FROM generate_series(0, 9) t;
INSERT INTO wal_delivery.destinations (name, endpoint)
SELECT 'bench-d' || d, 'http://127.0.0.1:9/d' || d FROM generate_series(0, 19) d;
INSERT INTO wal_delivery.dead_letters (origin, topic, idempotency_key, destination, headers,
                                       content_type, payload, attempts, last_error, failed_at,
                                       resolved_at, resolution, kafka_topic, kafka_partition,
                                       kafka_offset, alerted_at)
SELECT 'delivery', 'bench.t' || (i % 10), 'key-' || i, 'bench-d' || (i % 20),
       jsonb_build_object('attempt', '5', 'destination', 'bench-d' || (i % 20)),
       'application/json',
       convert_to(json_build_object('order_id', i, 'note', repeat('x', 240))::text, 'UTF8'),
       5, CASE WHEN i % 7 = 0 THEN 'HTTP 422 unprocessable' ELSE 'HTTP 400' END,
       now() - (1000000 - i) * interval '172 milliseconds',
       CASE WHEN i % 10 = 0 THEN now() END, CASE WHEN i % 10 = 0 THEN 'bench' END,
       'wal_delivery.dlq', 0, i, now()
  FROM generate_series(1, 1000000) i;
VACUUM ANALYZE wal_delivery.dead_letters;
-- 6 hours of delivery_stats, every minute for every topic and destination (10 x 20):
-- 72,000 rows, what the workers' flushes leave when every pair is busy.
INSERT INTO wal_delivery.delivery_stats (minute, topic, destination, delivered, failed, dead_lettered)
SELECT date_trunc('minute', now()) - m * interval '1 minute', 'bench.t' || t, 'bench-d' || d,
       100 + (m * 7 + t + d) % 50, (m + t * d) % 5, CASE WHEN (m + t + d) % 60 = 0 THEN 1 ELSE 0 END
  FROM generate_series(0, 359) m, generate_series(0, 9) t, generate_series(0, 19) d;
VACUUM ANALYZE wal_delivery.delivery_stats;
