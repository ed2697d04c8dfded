-- bench/console: the WAL one flush of a worker's delivery counts writes (one call of
-- add_delivery_stats with 200 keys: 10 topics x 20 destinations in one minute), against
-- the baseline of the same 200 rows by a plain INSERT into a table of the same shape.
-- Right after a checkpoint (the first change of each page writes the whole page) and
-- again (pages already written since the checkpoint: the steady state between them).
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only on
CREATE TEMP TABLE wal (name text, bytes numeric, ms numeric);
CREATE TABLE public.bench_plain (LIKE wal_delivery.delivery_stats INCLUDING ALL);
SELECT jsonb_agg(jsonb_build_object('minute', extract(epoch FROM now()) + 120, 'topic', 'bench.t' || t,
                 'destination', 'bench-d' || d, 'delivered', 100, 'failed', 2, 'dead_lettered', 0)) AS counts
  FROM generate_series(0, 9) t, generate_series(0, 19) d \gset

CHECKPOINT;
SELECT pg_current_wal_insert_lsn() AS a, clock_timestamp() AS t \gset
SELECT wal_delivery.add_delivery_stats(:'counts') \g /dev/null
INSERT INTO wal SELECT 'flush, 200 new keys, after a checkpoint', pg_current_wal_insert_lsn() - :'a',
       extract(epoch FROM clock_timestamp() - :'t') * 1000;
SELECT pg_current_wal_insert_lsn() AS a, clock_timestamp() AS t \gset
SELECT wal_delivery.add_delivery_stats(:'counts') \g /dev/null
INSERT INTO wal SELECT 'flush, the same 200 keys again (updates)', pg_current_wal_insert_lsn() - :'a',
       extract(epoch FROM clock_timestamp() - :'t') * 1000;

CHECKPOINT;
SELECT pg_current_wal_insert_lsn() AS a, clock_timestamp() AS t \gset
INSERT INTO public.bench_plain SELECT to_timestamp((c->>'minute')::float8), c->>'topic', c->>'destination', 100, 2, 0
  FROM jsonb_array_elements(:'counts') c;
INSERT INTO wal SELECT 'baseline: plain INSERT of 200 rows, after a checkpoint', pg_current_wal_insert_lsn() - :'a',
       extract(epoch FROM clock_timestamp() - :'t') * 1000;
SELECT pg_current_wal_insert_lsn() AS a, clock_timestamp() AS t \gset
INSERT INTO public.bench_plain SELECT to_timestamp((c->>'minute')::float8) + interval '1 minute', c->>'topic',
       c->>'destination', 100, 2, 0 FROM jsonb_array_elements(:'counts') c;
INSERT INTO wal SELECT 'baseline: plain INSERT of 200 rows again', pg_current_wal_insert_lsn() - :'a',
       extract(epoch FROM clock_timestamp() - :'t') * 1000;
DROP TABLE public.bench_plain;
DELETE FROM wal_delivery.delivery_stats WHERE minute > now();

SELECT format('%-55s %9s %9s %8s', 'WAL of one flush (200 keys)', 'bytes', 'per key', 'ms');
SELECT format('%-55s %9s %9s %8s', name, bytes, round(bytes / 200), round(ms, 2)) FROM wal;
SELECT format('%-55s %9s', 'ratio flush / plain INSERT, after a checkpoint',
              round((SELECT bytes FROM wal WHERE name LIKE 'flush, 200 new%')
                    / (SELECT bytes FROM wal WHERE name LIKE 'baseline%after%'), 2));
SELECT format('%-55s %9s', 'ratio flush / plain INSERT, steady',
              round((SELECT bytes FROM wal WHERE name LIKE 'flush, the same%')
                    / (SELECT bytes FROM wal WHERE name LIKE 'baseline%again'), 2));
