"""The reconciler makes the real Kafka match the control plane (topics, partitions,
retention, min.insync.replicas; retry steps with a partition per destination; the DLQ),
shows what it could not do in wal_delivery.reconcile_status, and publishes the config
version only when Kafka matches."""
import time

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from conftest import connect
from relay_helpers import ensure_extension, make_topic, states, wait_until


@pytest.fixture(autouse=True)
def extension():
    ensure_extension()


def in_sync(conn):
    version, published = conn.execute(
        "SELECT version, published_version FROM wal_delivery.config_version").fetchone()
    return version == published


def kafka_partitions(admin, topic):
    meta = admin.list_topics(topic, timeout=10).topics.get(topic)
    return len(meta.partitions) if meta and not meta.error else 0


def kafka_config(admin, topic):
    [future] = admin.describe_configs([ConfigResource("topic", topic)]).values()
    return {k: v.value for k, v in future.result(10).items()}


def test_topics_are_created_as_configured_and_then_the_version_is_published(kafka_bootstrap, unique):
    topic = f"rec.main.{unique}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    with connect() as listener, connect() as conn:
        listener.execute("LISTEN wal_delivery_published")
        make_topic(conn, topic, partitions=3, retention="2 days")
        conn.execute("INSERT INTO wal_delivery.destinations (name, endpoint) VALUES (%s, 'http://127.0.0.1:9/')",
                     (f"rec-dest-{unique}",))
        wait_until(lambda: in_sync(conn), 30, what="the config version to be published")
        version = conn.execute("SELECT version FROM wal_delivery.config_version").fetchone()[0]
        published = [int(n.payload) for n in listener.notifies(timeout=2, stop_after=None)]
        assert version in published

        assert kafka_partitions(admin, topic) == 3
        config = kafka_config(admin, topic)
        assert config["retention.ms"] == str(2 * 86400 * 1000)
        assert config["min.insync.replicas"] == "1"

        retry_partitions = conn.execute(
            "SELECT max(retry_partition) + 1 FROM wal_delivery.destinations").fetchone()[0]
        for step in (1, 2, 3):
            name = f"wal_delivery.retry.{step}"
            assert kafka_partitions(admin, name) == retry_partitions
            assert kafka_config(admin, name)["retention.ms"] == str(14 * 86400 * 1000)
        assert kafka_config(admin, "wal_delivery.dlq")["retention.ms"] == str(14 * 86400 * 1000)
        ready = conn.execute("SELECT bool_and(ready) FROM wal_delivery.reconcile_status").fetchone()[0]
        assert ready


def test_partitions_grow_with_the_config_and_destinations(kafka_bootstrap, unique):
    topic = f"rec.grow.{unique}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    with connect() as conn:
        make_topic(conn, topic, partitions=1)
        wait_until(lambda: kafka_partitions(admin, topic) == 1, 30, what="the topic")
        conn.execute("UPDATE wal_delivery.topics SET partitions = 4 WHERE name = %s", (topic,))
        wait_until(lambda: kafka_partitions(admin, topic) == 4, 30, what="4 partitions")

        before = kafka_partitions(admin, "wal_delivery.retry.1")
        conn.execute("INSERT INTO wal_delivery.destinations (name, endpoint) VALUES (%s, 'http://127.0.0.1:9/'),"
                     " (%s, 'http://127.0.0.1:9/')", (f"g1-{unique}", f"g2-{unique}"))
        wait_until(lambda: all(kafka_partitions(admin, f"wal_delivery.retry.{s}") >= before + 2
                               for s in (1, 2, 3)), 30, what="retry partitions for new destinations")
        wait_until(lambda: in_sync(conn), 30, what="the version to be published")


def test_a_topic_kafka_cannot_create_is_reported_and_its_records_die(unique):
    topic = f"rec.bad.{unique}"
    with connect() as conn:
        make_topic(conn, topic, replication_factor=3, min_insync_replicas=2)  # one broker here
        conn.execute("SELECT wal_enqueue(%s, '{}'::jsonb, 'doomed')", (topic,))
        status = wait_until(lambda: conn.execute(
            "SELECT ready, error, error_is_permanent FROM wal_delivery.reconcile_status"
            " WHERE topic = %s AND error IS NOT NULL", (topic,)).fetchone(), 30,
            what="the reconciler to report the topic")
        assert status[0] is False and status[2] is True
        assert "replication factor" in status[1].lower() or "replicat" in status[1].lower()
        wait_until(lambda: states(conn, topic) == {"dead": 1}, 30, what="the record to die")
        error = conn.execute("SELECT last_error FROM wal_delivery.dead_letters WHERE topic = %s",
                             (topic,)).fetchone()[0]
        assert error == status[1]
        time.sleep(1)
        assert not in_sync(conn), "published a version Kafka does not match"

        conn.execute("DELETE FROM wal_delivery.topics WHERE name = %s", (topic,))
        wait_until(lambda: in_sync(conn), 30, what="publishing once the bad topic is gone")


def test_a_kafka_topic_deleted_behind_its_back_comes_back(kafka_bootstrap, unique):
    topic = f"rec.gone.{unique}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    with connect() as conn:
        make_topic(conn, topic, partitions=2)
        wait_until(lambda: kafka_partitions(admin, topic) == 2, 30, what="the topic")
        admin.delete_topics([topic])[topic].result(20)
        wait_until(lambda: kafka_partitions(admin, topic) == 0, 30, what="the deletion")
        wait_until(lambda: kafka_partitions(admin, topic) == 2, 30, what="the topic to come back")
