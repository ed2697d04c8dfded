"""Kafka's message limits, respected end to end: the largest record enqueue accepts goes
through every hop (relay, main topic, consumer, a retry step hand-off, the retry consumer,
the destination), and a hand-off Kafka refuses as too large goes to the DLQ by reference
(outbox id, source topic, partition and offset, the reason; payload omitted) instead of
being tried again forever while its partition's offset stands still."""

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from conftest import Destination, connect
from consumer_helpers import add_destination, wait_published
from relay_helpers import make_topic, wait_all_stored, wait_until
from retry_helpers import Fleet, attempt_of, by_key

pytestmark = pytest.mark.usefixtures("clean_destinations")


@pytest.fixture
def fleet(tmp_path, kafka_bootstrap):
    f = Fleet(tmp_path, kafka_bootstrap)
    yield f
    f.stop_all()


def kafka_config(admin, topic):
    [future] = admin.describe_configs([ConfigResource("topic", topic)]).values()
    return {k: v.value for k, v in future.result(10).items()}


def body_size(request):
    return len(request["body"]) if "body" in request else len(request["body_base64"]) * 3 // 4


def dlq_entries(topic):
    with connect() as conn:
        return conn.execute("SELECT idempotency_key, origin, destination, outbox_id, octet_length(payload),"
                            " last_error FROM wal_delivery.dead_letters WHERE topic = %s ORDER BY id",
                            (topic,)).fetchall()


def largest_record(conn, max_payload_bytes, key):
    """A payload that makes the record exactly as large as enqueue accepts."""
    limit = conn.execute("SELECT wal_delivery.record_limit(%s)", (max_payload_bytes,)).fetchone()[0]
    return b"x" * (limit - len(key.encode()))


def test_the_largest_record_enqueue_accepts_reaches_its_destination_through_retry_step_1(
        tmp_path, fleet, unique):
    topic, name, key = f"lim.big.{unique}", f"lim-big-{unique}", f"big-{unique}"
    dest = Destination(tmp_path)
    dest.behave(status=503, times=1)  # the first attempt fails: the copy goes to retry step 1
    try:
        with connect() as conn:
            make_topic(conn, topic, max_payload_bytes=3_000_000)
            add_destination(conn, name, dest.url + "/in", [topic],
                            retry_delays="{10 seconds,20 seconds,30 seconds}", retry_jitter=0)
            wait_published(conn)
            payload = largest_record(conn, 3_000_000, key)
            conn.execute("SELECT wal_enqueue(%s, %s::bytea, %s)", (topic, payload, key))
            wait_all_stored(conn, topic, 1, timeout=60)
        fleet.start_ready("consume", "retry", "dlq")
        requests = by_key(dest.wait_for(2, "/in", timeout=90))[key]
        assert [r["status"] for r in requests] == [503, 200]
        assert [attempt_of(r) for r in requests] == [1, 2]
        assert body_size(requests[1]) == len(payload)
        assert dlq_entries(topic) == []
    finally:
        dest.stop()


def refused_hand_off_goes_to_the_dlq_by_reference(fleet, dest, topic, name, worker_args=(),
                                                   before_enqueue=lambda: None):
    """Enqueues a 300 kB record and a small one, lets the destination refuse the first
    attempt, and checks that the big copy's hand-off, which Kafka refuses as too large,
    lands in dead_letters by reference while the small record is delivered behind it."""
    big, small = f"big-{topic}", f"small-{topic}"
    consumer = fleet.start("consume", *worker_args)
    fleet.start("dlq")
    consumer.wait_ready()
    with connect() as conn:
        wait_published(conn)
        before_enqueue()
        conn.execute("SELECT wal_enqueue(%s, %s::bytea, %s)", (topic, b"y" * 300_000, big))
        wait_all_stored(conn, topic, 1, timeout=60)
        outbox_id = conn.execute("SELECT id FROM wal_delivery.outbox WHERE topic = %s"
                                 " AND idempotency_key = %s", (topic, big)).fetchone()[0]
    wait_until(lambda: dlq_entries(topic), 60, what="the refused hand-off in dead_letters")
    [(key, origin, destination, entry_outbox_id, payload_bytes, error)] = dlq_entries(topic)
    assert (key, origin, destination, entry_outbox_id, payload_bytes) == (big, "delivery", name, outbox_id, 0)
    assert "too large" in error.lower()
    assert f"{topic} partition 0 offset 0" in error
    assert consumer.metric("wal_handoff_too_large_total") >= 1
    # Its payload is not stored: a replay through the retry steps would be refused again,
    # so on-call is told where the record is instead of getting an empty delivery.
    with connect() as conn:
        entry = conn.execute("SELECT id FROM wal_delivery.dead_letters WHERE topic = %s", (topic,)).fetchone()[0]
        with pytest.raises(psycopg.Error) as refused:
            conn.execute("SELECT wal_delivery.replay_dead_letter(%s)", (entry,))
        assert refused.value.sqlstate == "55000"
        assert f"outbox row {outbox_id}" in refused.value.diag.message_hint
        assert conn.execute("SELECT wal_delivery.replay_dead_letters(p_topic => %s)", (topic,)).fetchone()[0] == 0
    # The partition moved on: the record behind it is delivered.
    with connect() as conn:
        conn.execute("SELECT wal_enqueue(%s, 'after'::text, %s)", (topic, small))
    wait_until(lambda: small in by_key(dest.requests("/in")), 60, what="the next record delivered")
    assert consumer.output().count("event=handoff_too_large") == 1


def test_a_hand_off_the_broker_refuses_as_too_large_goes_to_the_dlq_by_reference(
        tmp_path, fleet, unique, kafka_bootstrap):
    topic, name = f"lim.ref.{unique}", f"lim-ref-{unique}"
    dest = Destination(tmp_path)
    dest.behave(status=503, times=1)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    step1 = ConfigResource("topic", "wal_delivery.retry.1", incremental_configs=[
        ConfigEntry("max.message.bytes", "100000", incremental_operation=AlterConfigOpType.SET)])
    with connect() as conn:
        make_topic(conn, topic)
        add_destination(conn, name, dest.url + "/in", [topic], retry_jitter=0)
        wait_published(conn)
        # Hold the reconciler's periodic round, which would set the limit back (a config
        # change would too: the limit is lowered once the workers are up).
        conn.execute("ALTER SYSTEM SET wal_delivery.reconcile_interval = '1h'")
        reloaded_at = conn.execute("SELECT clock_timestamp()").fetchone()[0]
        conn.execute("SELECT pg_reload_conf()")

    def lower_the_limit():
        # The reload makes the reconciler run a round at once; it is over once it has
        # recorded step 1 after the reload.
        with connect() as conn:
            wait_until(lambda: conn.execute("SELECT reconciled_at > %s FROM wal_delivery.kafka_topics"
                                            " WHERE topic = 'wal_delivery.retry.1'",
                                            (reloaded_at,)).fetchone()[0], 60,
                       what="the reconciler's round after the reload")
        [future] = admin.incremental_alter_configs([step1]).values()
        future.result(20)
        wait_until(lambda: kafka_config(admin, "wal_delivery.retry.1")["max.message.bytes"] == "100000",
                   30, what="retry step 1's lowered limit")

    try:
        refused_hand_off_goes_to_the_dlq_by_reference(fleet, dest, topic, name,
                                                      before_enqueue=lower_the_limit)
    finally:
        with connect() as conn:
            conn.execute("ALTER SYSTEM RESET wal_delivery.reconcile_interval")
            conn.execute("SELECT pg_reload_conf()")
        dest.stop()


def test_a_hand_off_librdkafka_refuses_as_too_large_goes_to_the_dlq_by_reference(
        tmp_path, fleet, unique):
    topic, name = f"lim.local.{unique}", f"lim-local-{unique}"
    dest = Destination(tmp_path)
    dest.behave(status=503, times=1)
    try:
        with connect() as conn:
            make_topic(conn, topic)
            add_destination(conn, name, dest.url + "/in", [topic], retry_jitter=0)
            wait_published(conn)
        # An operator's -X wins over the worker's own message.max.bytes.
        refused_hand_off_goes_to_the_dlq_by_reference(fleet, dest, topic, name,
                                                      ("-X", "message.max.bytes=100000"))
    finally:
        dest.stop()
