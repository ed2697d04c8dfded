-- One ~500-byte JSON record per transaction (the payload of bench/anchors' enqueue_wal.sql).
\set i random(1000000000, 1999999999)
SELECT wal_enqueue('bench.log',
                   jsonb_build_object('i', :i::bigint, 'pad', substr(repeat(md5(:i::text), 14), 1, 443),
                                      'sent_us', (extract(epoch FROM clock_timestamp()) * 1000000)::bigint),
                   key => :i::text);
