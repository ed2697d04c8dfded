-- bench/enqueue/setup.sql: the schema for bench/enqueue/run (a fresh database).
CREATE EXTENSION wal_delivery;
INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas, partitions)
VALUES ('bench.events', 1, 1, 1);

-- The log as it is in steady state: one generation current, one sealed that still holds
-- the last idempotency window's keys (every enqueue of a caller's key looks in it), one
-- truncated and empty. A fresh install has two empty ones, which enqueue does not look in.
SELECT count(wal_enqueue('bench.events', jsonb_build_object('n', i), 'window-' || i))
  FROM generate_series(1, 10000) i;
UPDATE wal_delivery.outbox_generations SET sealed_at = now() WHERE gen = 0;
UPDATE wal_delivery.outbox_generations SET started_at = now(), sealed_at = NULL WHERE gen = 1;

-- The application's own table, written in the same transaction as the record.
CREATE TABLE orders (
    id bigserial PRIMARY KEY,
    customer int NOT NULL,
    amount numeric NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The baseline: the shape of what wal_enqueue writes for a topic without a processor, one
-- generation of the log (outbox_log_0): same columns and defaults, the same indexes
-- (the relay's (log_order(lane, xid), id) and the partial unique dedupe index of caller's keys),
-- the same storage parameters (autovacuum off). A plain table: the log's partitioning is
-- the extension's business, the application would insert into one table. Its ids come
-- from a sequence of its own, as the log's do.
CREATE TABLE bench_baseline_outbox (LIKE wal_delivery.outbox_log_0 INCLUDING ALL);
DO $$
DECLARE opts text[] := (SELECT reloptions FROM pg_class WHERE oid = 'wal_delivery.outbox_log_0'::regclass);
BEGIN
    IF opts IS NOT NULL THEN
        EXECUTE format('ALTER TABLE bench_baseline_outbox SET (%s)', array_to_string(opts, ', '));
    END IF;
END $$;
CREATE SEQUENCE bench_baseline_ids;

-- A ~500-byte order event, varied by its arguments; the same function feeds every
-- workload, so the outbox and the baseline receive the same bytes.
CREATE FUNCTION bench_payload(order_id bigint, customer int, amount int, r bigint) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'event', 'order.created', 'order_id', order_id, 'customer_id', customer,
        'amount', amount / 100.0, 'currency', 'EUR', 'channel', 'web',
        'items', jsonb_build_array(
            jsonb_build_object('sku', 'SKU-' || r % 100000, 'qty', 1 + r % 5, 'price', (r % 10000) / 100.0),
            jsonb_build_object('sku', 'SKU-' || r % 99991, 'qty', 1 + r % 3, 'price', (r % 7919) / 100.0)),
        'shipping', jsonb_build_object('name', md5(r::text), 'street', md5((r + 1)::text),
                                       'city', left(md5((r + 2)::text), 12), 'zip', (r % 90000 + 10000)::text),
        'trace_id', md5((r + 3)::text), 'note', md5((r + 4)::text))
$$;

-- The same index definitions (less the names) and storage parameters on both tables.
CREATE FUNCTION bench_table_shape(t regclass) RETURNS text LANGUAGE sql AS $$
    SELECT coalesce((SELECT array_to_string(reloptions, ',') FROM pg_class WHERE oid = t), '') || ' | ' ||
           (SELECT string_agg(d, '; ' ORDER BY d)
              FROM (SELECT regexp_replace(pg_get_indexdef(indexrelid), ' INDEX \S+ ON \S+', ' INDEX ON') AS d
                      FROM pg_index WHERE indrelid = t) s)
$$;
DO $$
BEGIN
    IF bench_table_shape('wal_delivery.outbox_log_0') IS DISTINCT FROM bench_table_shape('bench_baseline_outbox') THEN
        RAISE EXCEPTION 'bench_baseline_outbox differs from wal_delivery.outbox_log_0: % vs %',
            bench_table_shape('bench_baseline_outbox'), bench_table_shape('wal_delivery.outbox_log_0');
    END IF;
END $$;
