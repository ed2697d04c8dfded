-- 1000 of the same records in one wal_enqueue_batch call (a fast preload for big backlogs).
SELECT wal_enqueue_batch('bench.log',
       ARRAY(SELECT jsonb_build_object('i', i, 'pad', substr(repeat(md5(i::text), 14), 1, 443), 'sent_us', 0)
               FROM generate_series(1, 1000) i),
       keys => ARRAY(SELECT i::text FROM generate_series(1, 1000) i));
