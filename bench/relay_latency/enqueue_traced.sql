-- enqueue.sql's record with a sampled W3C traceparent header, for runs with span export on
-- (OTLP_ENDPOINT): every record gets the relay's span. A fresh trace id per record, as an
-- application's requests would have.
\set i random(1000000000, 1999999999)
SELECT wal_enqueue('lat.wal',
                   jsonb_build_object('i', :i::bigint, 'pad', substr(repeat(md5(:i::text), 14), 1, 443),
                                      'sent_us', (extract(epoch FROM clock_timestamp()) * 1000000)::bigint),
                   key => :i::text,
                   headers => jsonb_build_object('traceparent',
                                                 '00-' || md5(:i::text || clock_timestamp()::text) || '-00f067aa0ba902b7-01'));
