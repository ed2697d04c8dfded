"""The reconciler makes the real Kafka match the control plane (topics, partitions,
retention, min.insync.replicas, max.message.bytes; retry steps with a partition per
destination; the DLQ), changes only the settings it owns, shows what it could not do in
wal_delivery.reconcile_status, and publishes the config version once the retry steps and
the DLQ match. A main topic Kafka cannot create holds only its own records."""
import time

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from conftest import connect, env_cmd
from relay_helpers import (ensure_extension, make_topic, read_topic, states, wait_all_stored,
                           wait_until)

HEADROOM = 65536  # wal_delivery.kafka_message_headroom()


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
        # This topic and the system's own (other tests' topics may wait on purpose).
        ready = conn.execute("SELECT bool_and(ready) FROM wal_delivery.reconcile_status"
                             " WHERE topic = %s OR role <> 'main'", (topic,)).fetchone()[0]
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


def test_a_topic_kafka_cannot_create_holds_only_its_own_records(kafka_bootstrap, unique):
    bad, good = f"rec.bad.{unique}", f"rec.good.{unique}"
    with connect() as conn:
        make_topic(conn, bad, replication_factor=3, min_insync_replicas=2)  # one broker here
        conn.execute("SELECT wal_enqueue(%s, '{}'::jsonb, 'waits')", (bad,))
        status = wait_until(lambda: conn.execute(
            "SELECT in_kafka, ready, error FROM wal_delivery.reconcile_status"
            " WHERE topic = %s AND error IS NOT NULL", (bad,)).fetchone(), 30,
            what="the reconciler to report the topic")
        assert status[0] is False and status[1] is False
        assert "replication factor" in status[2].lower()

        # The rest of the fleet goes on: the version is published, other topics ship.
        make_topic(conn, good)
        wait_until(lambda: in_sync(conn), 30, what="publishing despite the bad topic")
        conn.execute("SELECT wal_enqueue(%s, '{}'::jsonb, 'ships')", (good,))
        wait_all_stored(conn, good, 1, timeout=30)

        # The bad topic's record waits in the outbox, with the reason, never dead.
        wait_until(lambda: conn.execute(
            "SELECT records_waiting FROM wal_delivery.reconcile_status WHERE topic = %s",
            (bad,)).fetchone()[0] == 1, 30, what="the record to wait for its topic")
        assert states(conn, bad) == {"pending": 1}
        assert conn.execute("SELECT records FROM wal_delivery.backlog WHERE topic = %s",
                            (bad,)).fetchone()[0] == 1
        reason = conn.execute("SELECT last_error FROM wal_delivery.outbox WHERE topic = %s",
                              (bad,)).fetchone()[0]
        assert reason.startswith(f'waiting for Kafka topic "{bad}"')
        assert conn.execute("SELECT count(*) FROM wal_delivery.dead_letters WHERE topic = %s",
                            (bad,)).fetchone()[0] == 0

        # Fixed: the topic is created and the waiting record ships.
        conn.execute("UPDATE wal_delivery.topics SET replication_factor = 1, min_insync_replicas = 1"
                     " WHERE name = %s", (bad,))
        wait_all_stored(conn, bad, 1, timeout=60)
    assert set(read_topic(kafka_bootstrap, bad, ["waits"])) == {"waits"}


def test_max_message_bytes_follows_max_payload_bytes(kafka_bootstrap, unique):
    topic = f"rec.size.{unique}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    shared = ("wal_delivery.retry.1", "wal_delivery.retry.2", "wal_delivery.retry.3", "wal_delivery.dlq")
    # The shared topics never lower their limit (they may hold records of a larger topic
    # dropped since): an earlier test's larger topic leaves its limit there.
    before = {name: shared_topic_limit(admin, name) for name in shared}
    with connect() as conn:
        make_topic(conn, topic, max_payload_bytes=2_000_000)
        wait_until(lambda: kafka_partitions(admin, topic) == 1, 30, what="the topic")
        wait_until(lambda: kafka_config(admin, topic)["max.message.bytes"] == str(2_000_000 + HEADROOM),
                   30, what="max.message.bytes of the main topic")
        conn.execute("UPDATE wal_delivery.topics SET max_payload_bytes = 3000000 WHERE name = %s", (topic,))
        wait_until(lambda: kafka_config(admin, topic)["max.message.bytes"] == str(3_000_000 + HEADROOM),
                   30, what="max.message.bytes to follow the change")
        wait_until(lambda: in_sync(conn), 30, what="the version to be published")
        largest = conn.execute("SELECT max(max_payload_bytes) FROM wal_delivery.topics").fetchone()[0]
        for name in shared:
            assert kafka_config(admin, name)["max.message.bytes"] == str(max(before[name], largest + HEADROOM)), name


def shared_topic_limit(admin, name):
    """A shared topic's max.message.bytes now; 0 when it does not exist yet."""
    try:
        return int(kafka_config(admin, name)["max.message.bytes"])
    except KafkaException:
        return 0


def foreign_topic(admin, topic, **config):
    """A Kafka topic another application made: never retention-limited, large messages."""
    settings = {"retention.ms": "-1", "max.message.bytes": "5000000", "segment.ms": "3600000",
                **config}
    admin.create_topics([NewTopic(topic, 1, 1, config=settings)])[topic].result(20)


def reconcile_row(conn, topic):
    return conn.execute("SELECT ready, in_kafka, error FROM wal_delivery.reconcile_status"
                        " WHERE topic = %s", (topic,)).fetchone()


def test_a_topic_wal_delivery_did_not_create_is_left_alone_and_gets_nothing(kafka_bootstrap, unique):
    """A topics row named after another application's compacted topic (issue 29): the
    reconciler changes none of its settings, its status says why it is not ready, and the
    row's records wait in the outbox instead of going into it."""
    topic = f"rec.foreign.{unique}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    foreign_topic(admin, topic, **{"cleanup.policy": "compact"})
    before = kafka_config(admin, topic)
    # The row comes from an admin that is not a superuser, as an operator's would.
    dba = f"rec_dba_{unique}"
    with connect() as su:
        su.execute(f"CREATE ROLE {dba} LOGIN IN ROLE wal_delivery_admin")
    try:
        with connect(user=dba) as conn:
            make_topic(conn, topic, retention="3 days")
    finally:
        with connect() as su:
            su.execute(f"DROP ROLE {dba}")
    with connect() as conn:
        wait_until(lambda: (reconcile_row(conn, topic) or (None, None, None))[2] is not None, 60,
                   what="a reconcile round over the topic")
        ready, in_kafka, error = reconcile_row(conn, topic)
        assert (ready, in_kafka) == (False, False)
        assert "did not create it" in error and "adopt" in error and "compacted" in error, error
        conn.execute("SELECT wal_enqueue(%s, '{}'::jsonb, 'must-wait')", (topic,))
        time.sleep(3)  # several relay passes
        assert states(conn, topic) == {"pending": 1}
    after = kafka_config(admin, topic)
    for name in ("retention.ms", "max.message.bytes", "cleanup.policy", "min.insync.replicas",
                 "segment.ms"):
        assert after[name] == before[name], f"{name} was changed: {before[name]} -> {after[name]}"
    assert not read_topic(kafka_bootstrap, topic, [], timeout=3)


def test_an_adopted_topic_takes_the_rows_settings_but_never_a_lower_message_limit(kafka_bootstrap,
                                                                                  unique):
    topic = f"rec.adopted.{unique}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    foreign_topic(admin, topic)
    with connect() as conn:
        make_topic(conn, topic, retention="3 days", adopt=True)
        wait_until(lambda: kafka_config(admin, topic)["retention.ms"] == str(3 * 86400 * 1000), 60,
                   what="the adopted topic's retention")
        wait_until(lambda: reconcile_row(conn, topic)[:2] == (True, True), 30, what="ready")
        config = kafka_config(admin, topic)
        assert config["max.message.bytes"] == "5000000"  # its messages still fit
        assert config["segment.ms"] == "3600000"  # its own settings are kept
        conn.execute("SELECT wal_enqueue(%s, '{}'::jsonb, 'adopted-1')", (topic,))
        wait_all_stored(conn, topic, 1)
    assert "adopted-1" in read_topic(kafka_bootstrap, topic, ["adopted-1"])


def test_a_compacted_topic_gets_nothing_even_when_adopted(kafka_bootstrap, unique):
    topic = f"rec.compacted.{unique}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    foreign_topic(admin, topic, **{"cleanup.policy": "compact"})
    with connect() as conn:
        make_topic(conn, topic, adopt=True)
        wait_until(lambda: (reconcile_row(conn, topic) or (None, None, None))[2] is not None, 60,
                   what="a reconcile round over the topic")
        ready, in_kafka, error = reconcile_row(conn, topic)
        assert (ready, in_kafka) == (False, False) and "cleanup.policy" in error, error
    assert kafka_config(admin, topic)["cleanup.policy"] == "compact"


def test_a_kafka_topic_deleted_behind_its_back_comes_back(kafka_bootstrap, unique):
    topic = f"rec.gone.{unique}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    with connect() as conn:
        make_topic(conn, topic, partitions=2)
        wait_until(lambda: kafka_partitions(admin, topic) == 2, 30, what="the topic")
        admin.delete_topics([topic])[topic].result(20)
        wait_until(lambda: kafka_partitions(admin, topic) == 0, 30, what="the deletion")
        wait_until(lambda: kafka_partitions(admin, topic) == 2, 30, what="the topic to come back")


def test_a_crash_while_a_topic_is_created_leaves_it_wal_deliverys(kafka_bootstrap, unique):
    """The reconciler creates topics outside any transaction and records the round after.
    With that record held up (the table locked) and the server crashing meanwhile, the
    topic Kafka may have created is still wal_delivery's after the restart: not left alone
    as another application's, and its records ship."""
    topic = f"rec.crash.{unique}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    locker = connect()
    try:
        locker.autocommit = False
        # Writes wait, reads do not: the round reads what it wants, then waits to write.
        locker.execute("LOCK TABLE wal_delivery.kafka_topics IN EXCLUSIVE MODE")
        with connect() as conn:
            make_topic(conn, topic)
            conn.execute("SELECT wal_enqueue(%s, '{}'::jsonb, 'before the crash')", (topic,))
            # The round is under way: the reconciler waits for the lock.
            wait_until(lambda: conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'wal_delivery reconciler'"
                " AND wait_event_type = 'Lock'").fetchone()[0] == 1, 30,
                what="the reconciler to wait for kafka_topics")
        time.sleep(2)  # long enough for a create that does not wait for the record
        env_cmd("pg-stop-immediate")
    finally:
        try:
            locker.close()
        except Exception:
            pass
        env_cmd("pg-start")
    with connect() as conn:
        wait_until(lambda: kafka_partitions(admin, topic) == 1, 60, what="the topic in Kafka")
        wait_all_stored(conn, topic, 1, timeout=60)
        assert conn.execute("SELECT created FROM wal_delivery.kafka_topics WHERE topic = %s",
                            (topic,)).fetchone()[0]
    assert set(read_topic(kafka_bootstrap, topic, ["before the crash"])) == {"before the crash"}
