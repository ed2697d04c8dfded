-- What on-call reads per topic (the console's overview, or psql): the backlog waiting to
-- be shipped, the delivery rates and the dead letters, without the topics table (control
-- plane, which the on-call role may not read). Destinations have destination_status
-- (retries.sql); rates per destination are delivery_rates summed by destination.

-- One row per topic: records waiting to be shipped to Kafka and the oldest one's age;
-- deliveries, failed attempts and dead-lettered copies of the last 5 minutes and hour
-- (delivery_rates, summed over destinations) and deliveries per second over the 5
-- minutes; unresolved dead letters, and dead letters that arrived in the last hour.
CREATE VIEW wal_delivery.topic_status AS
SELECT t.name AS topic,
       coalesce(b.waiting, 0) AS waiting,
       b.oldest_waiting_age,
       coalesce(r.delivered_5m, 0) AS delivered_5m,
       coalesce(r.failed_5m, 0) AS failed_5m,
       coalesce(r.dead_lettered_5m, 0) AS dead_lettered_5m,
       coalesce(round(r.delivered_5m / r.window_seconds, 3), 0) AS delivered_per_second,
       coalesce(r.failed_last_hour, 0) AS failed_last_hour,
       (SELECT count(*) FROM wal_delivery.dead_letters d
         WHERE d.topic = t.name AND d.resolved_at IS NULL) AS unresolved_dead_letters,
       (SELECT count(*) FROM wal_delivery.dead_letters d
         WHERE d.topic = t.name AND d.failed_at > now() - interval '1 hour') AS dead_letters_last_hour
  FROM wal_delivery.topics t
  LEFT JOIN (SELECT topic, sum(records) AS waiting, max(oldest_age) AS oldest_waiting_age
               FROM wal_delivery.backlog GROUP BY topic) b ON b.topic = t.name
  LEFT JOIN (SELECT topic, sum(delivered_5m) AS delivered_5m, sum(failed_5m) AS failed_5m,
                    sum(dead_lettered_5m) AS dead_lettered_5m,
                    sum(failed_last_hour) AS failed_last_hour,
                    max(window_seconds) AS window_seconds
               FROM wal_delivery.delivery_rates GROUP BY topic) r ON r.topic = t.name;
