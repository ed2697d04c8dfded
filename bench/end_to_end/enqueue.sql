-- One record per transaction, stamped with the server's clock at the enqueue (sent_us,
-- epoch microseconds; the commit follows in the same transaction); ~500-byte JSON payload
-- as bench/relay_latency's. pgbench -D topic=NAME.
\set i random(1000000000, 1999999999)
SELECT wal_enqueue(CAST(:topic AS text),
                   jsonb_build_object('i', :i::bigint, 'pad', substr(repeat(md5(:i::text), 14), 1, 443),
                                      'sent_us', (extract(epoch FROM clock_timestamp()) * 1000000)::bigint),
                   key => :i::text);
