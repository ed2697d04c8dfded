-- bench/relay sustained case: one wal_enqueue per transaction, a ~500-byte JSON payload
-- with random values and a unique idempotency key.
\set r random(1, 2000000000)
SELECT wal_enqueue('bench.relay',
                   jsonb_build_object('id', :r::bigint, 'client', :client_id::int,
                                      'amount', round(random()::numeric * 1000, 2),
                                      'pad', substr(repeat(md5(random()::text), 14), 1, 441)),
                   gen_random_uuid()::text);
