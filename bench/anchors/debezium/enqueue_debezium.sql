-- One record per transaction through Debezium's outbox pattern (insert + delete of
-- public.outbox_events): the same payload as enqueue_wal.sql, aggregateid (the key) = the
-- record's number.
\set i random(1000000000, 1999999999)
SELECT public.outbox_emit('anchor', :i::text, 'created',
                          jsonb_build_object('i', :i::bigint, 'pad', substr(repeat(md5(:i::text), 14), 1, 443),
                                             'sent_us', (extract(epoch FROM clock_timestamp()) * 1000000)::bigint));
