-- What on-call reads per topic (the console's overview, or psql): the backlog waiting to
-- be shipped and the dead letters, without the topics table (control plane, which the
-- on-call role may not read). Destinations have destination_status (retries.sql).

-- One row per topic: records waiting to be shipped to Kafka and the oldest one's age,
-- unresolved dead letters, and dead letters that arrived in the last hour.
CREATE VIEW wal_delivery.topic_status AS
SELECT t.name AS topic,
       coalesce(b.waiting, 0) AS waiting,
       b.oldest_waiting_age,
       (SELECT count(*) FROM wal_delivery.dead_letters d
         WHERE d.topic = t.name AND d.resolved_at IS NULL) AS unresolved_dead_letters,
       (SELECT count(*) FROM wal_delivery.dead_letters d
         WHERE d.topic = t.name AND d.failed_at > now() - interval '1 hour') AS dead_letters_last_hour
  FROM wal_delivery.topics t
  LEFT JOIN (SELECT topic, sum(records) AS waiting, max(oldest_age) AS oldest_waiting_age
               FROM wal_delivery.backlog GROUP BY topic) b ON b.topic = t.name;
