-- One record per transaction through wal_enqueue: ~500-byte JSON payload stamped with the
-- server's clock (sent_us, epoch microseconds), message key = the record's number.
\set i random(1000000000, 1999999999)
SELECT wal_enqueue('anchor.wal',
                   jsonb_build_object('i', :i::bigint, 'pad', substr(repeat(md5(:i::text), 14), 1, 443),
                                      'sent_us', (extract(epoch FROM clock_timestamp()) * 1000000)::bigint),
                   key => :i::text);
