"""The relay ships committed outbox rows to the real Kafka broker: exactly the committed
records arrive, with their headers; a row is stored only after Kafka acknowledged it;
outages, oversized records, crashes and reloads lose nothing."""
import json
import os
import signal
import time

import pytest

from conftest import connect, env_cmd
from relay_helpers import (cpu_ticks, ensure_extension, make_topic, read_topic, relay_pids,
                           server_log, states, wait_all_stored, wait_until)


@pytest.fixture(autouse=True)
def extension():
    ensure_extension()


def test_exactly_the_committed_records_reach_kafka_with_headers(db, kafka_bootstrap, unique):
    topic = f"relay.mix.{unique}"
    make_topic(db, topic)
    committed = []
    for i in range(20):
        with db.transaction():
            db.execute("SELECT wal_enqueue(%s, %s::jsonb, %s, %s, %s::jsonb)",
                       (topic, json.dumps({"n": i}), f"single-{i}", f"key-{i}", '{"trace-id": "t"}'))
        committed.append(f"single-{i}")
    for b in range(3):
        keys = [f"batch-{b}-{j}" for j in range(25)]
        with db.transaction():
            db.execute("SELECT wal_enqueue_batch(%s, %s::jsonb[], %s)",
                       (topic, [json.dumps({"b": b, "j": j}) for j in range(25)], keys))
        committed += keys
    for i in range(5):  # rolled back: must never reach Kafka
        try:
            with db.transaction():
                db.execute("SELECT wal_enqueue(%s, '{}'::jsonb, %s)", (topic, f"rolled-back-{i}"))
                raise RuntimeError("roll back")
        except RuntimeError:
            pass

    wait_all_stored(db, topic, len(committed))
    assert db.execute("SELECT count(*) FROM wal_delivery.outbox WHERE topic = %s"
                      " AND finished_at IS NULL", (topic,)).fetchone()[0] == 0
    seen = read_topic(kafka_bootstrap, topic, committed)
    assert set(seen) == set(committed)
    ids = dict(db.execute("SELECT idempotency_key, id FROM wal_delivery.outbox WHERE topic = %s",
                          (topic,)).fetchall())
    for key, messages in seen.items():
        h = messages[0]["headers"]
        assert h["source-topic"] == topic
        assert h["outbox-id"] == str(ids[key])
        assert h["content-type"] == "application/json"
        assert h["created-at"].endswith("Z")
    first = seen["single-3"][0]
    assert json.loads(first["value"]) == {"n": 3}
    assert first["key"] == b"key-3"
    assert first["headers"]["trace-id"] == "t"


def test_commit_wakes_the_relay_without_waiting_for_its_idle_interval(db, unique):
    topic = f"relay.wake.{unique}"
    make_topic(db, topic)
    db.execute("ALTER SYSTEM SET wal_delivery.relay_idle_interval = '60s'")
    db.execute("SELECT pg_reload_conf()")
    try:
        time.sleep(1.5)  # the relay is now asleep for up to 60 s unless woken
        start = time.time()
        db.execute("SELECT wal_enqueue(%s, '{}'::jsonb, 'wake-me')", (topic,))
        wait_all_stored(db, topic, 1, timeout=20)
        assert time.time() - start < 5, "the relay waited for its idle interval"
    finally:
        db.execute("ALTER SYSTEM RESET wal_delivery.relay_idle_interval")
        db.execute("SELECT pg_reload_conf()")


def test_a_record_too_large_for_the_broker_becomes_dead_without_blocking_others(db, kafka_bootstrap, unique):
    topic = f"relay.big.{unique}"
    make_topic(db, topic, max_payload_bytes=5_000_000)  # allowed here, refused by Kafka
    with db.transaction():
        db.execute("SELECT wal_enqueue(%s, %s::text, 'small-1')", (topic, "x"))
        db.execute("SELECT wal_enqueue(%s, %s::text, 'huge')", (topic, "y" * 2_000_000))
        db.execute("SELECT wal_enqueue(%s, %s::text, 'small-2')", (topic, "z"))
    wait_until(lambda: states(db, topic) == {"stored": 2, "dead": 1}, 60,
               what=f"2 stored and 1 dead (now {states(db, topic)})")
    origin, error = db.execute("SELECT origin, last_error FROM wal_delivery.dead_letters"
                               " WHERE topic = %s AND idempotency_key = 'huge'", (topic,)).fetchone()
    assert origin == "relay"
    assert "too large" in error.lower()
    assert set(read_topic(kafka_bootstrap, topic, ["small-1", "small-2"])) == {"small-1", "small-2"}


def test_kafka_down_enqueue_keeps_working_relay_backs_off_then_drains(db, kafka_bootstrap, unique):
    topic = f"relay.outage.{unique}"
    make_topic(db, topic)
    db.execute("SELECT wal_enqueue(%s, '{}'::jsonb, 'before')", (topic,))
    wait_all_stored(db, topic, 1)
    log_before = len(server_log())

    env_cmd("kafka-stop", "1")
    try:
        keys = [f"during-{i}" for i in range(50)]
        for k in keys:  # the outbox is the buffer: enqueue does not depend on Kafka
            db.execute("SELECT wal_enqueue(%s, '{}'::jsonb, %s)", (topic, k))
        # First pass waits out the delivery timeout (10 s here), then the relay backs off.
        wait_until(lambda: "Kafka unreachable" in server_log()[log_before:], 60,
                   what="the relay to notice the outage")
        [pid] = relay_pids(db)
        ticks = cpu_ticks(pid)
        time.sleep(5)
        used = (cpu_ticks(pid) - ticks) / os.sysconf("SC_CLK_TCK")
        assert used < 0.5, f"the relay burnt {used:.2f} s of CPU in 5 s while Kafka was down"
        assert states(db, topic).get("pending") == 50
    finally:
        env_cmd("kafka-start", "1")

    wait_all_stored(db, topic, 51, timeout=120)
    outage_log = server_log()[log_before:]
    assert outage_log.count("wal_delivery relay: Kafka unreachable") == 1
    assert "wal_delivery relay: shipping" in outage_log
    assert set(keys) <= set(read_topic(kafka_bootstrap, topic, keys))


def test_kill9_of_the_relay_loses_nothing(db, kafka_bootstrap, unique):
    topic = f"relay.kill.{unique}"
    make_topic(db, topic)
    keys = [f"k-{i}" for i in range(3000)]
    for start in range(0, len(keys), 500):
        db.execute("SELECT wal_enqueue_batch(%s, %s::text[], %s)",
                   (topic, keys[start:start + 500], keys[start:start + 500]))
    wait_until(lambda: states(db, topic).get("stored", 0) > 0, 30, interval=0.02,
               what="the relay to start shipping")
    [pid] = relay_pids(db)
    os.kill(pid, signal.SIGKILL)  # the postmaster restarts every backend after this
    time.sleep(2)

    with connect() as conn:
        wait_all_stored(conn, topic, len(keys), timeout=120)
    assert set(read_topic(kafka_bootstrap, topic, keys)) == set(keys)


def test_kill9_of_postgres_loses_no_committed_record(kafka_bootstrap, unique):
    topic = f"relay.pgkill.{unique}"
    with connect() as conn:
        make_topic(conn, topic)
        keys = [f"p-{i}" for i in range(2000)]
        conn.execute("SELECT wal_enqueue_batch(%s, %s::text[], %s)", (topic, keys, keys))
    env_cmd("pg-kill9")
    env_cmd("pg-start")
    with connect() as conn:
        wait_until(lambda: relay_pids(conn), 30, what="the relay to come back")
        wait_all_stored(conn, topic, len(keys), timeout=120)
    assert set(read_topic(kafka_bootstrap, topic, keys)) == set(keys)


def test_reload_applies_new_kafka_properties(db, kafka_bootstrap, unique):
    topic = f"relay.reload.{unique}"
    make_topic(db, topic)
    db.execute("ALTER SYSTEM SET wal_delivery.kafka_properties = 'compression.type=lz4;linger.ms=5'")
    db.execute("SELECT pg_reload_conf()")
    try:
        db.execute("SELECT wal_enqueue(%s, 'after reload'::text, 'r1')", (topic,))
        wait_all_stored(db, topic, 1)
        assert read_topic(kafka_bootstrap, topic, ["r1"])["r1"][0]["value"] == b"after reload"
        db.execute("ALTER SYSTEM SET wal_delivery.kafka_properties = 'no.such.property=1'")
        db.execute("SELECT pg_reload_conf()")
        wait_until(lambda: "No such configuration property" in server_log(), 20,
                   what="the relay to report the bad property")
        db.execute("SELECT wal_enqueue(%s, 'held'::text, 'r2')", (topic,))
        time.sleep(2)
        assert states(db, topic).get("pending") == 1, "shipped with a broken configuration"
    finally:
        db.execute("ALTER SYSTEM RESET wal_delivery.kafka_properties")
        db.execute("SELECT pg_reload_conf()")
    wait_all_stored(db, topic, 2)


def test_drop_extension_does_not_hang_and_the_relay_picks_it_up_again(unique):
    with connect() as conn:
        topic = f"relay.drop.{unique}"
        make_topic(conn, topic)
        conn.execute("SELECT wal_enqueue(%s, '{}'::jsonb, 'x')", (topic,))
        conn.execute("SET statement_timeout = '30s'")
        conn.execute("DROP EXTENSION wal_delivery CASCADE")
        conn.execute("CREATE EXTENSION wal_delivery")
        ensure_extension()
        make_topic(conn, topic)
        conn.execute("SELECT wal_enqueue(%s, '{}'::jsonb, 'y')", (topic,))
        wait_all_stored(conn, topic, 1, timeout=30)
