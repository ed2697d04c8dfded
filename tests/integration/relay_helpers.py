"""Helpers for tests that follow records from the outbox into Kafka."""
import os
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer

from conftest import connect


def wait_until(predicate, timeout=60, interval=0.2, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def make_topic(conn, name, **settings):
    cols = {"partitions": 1, "replication_factor": 1, "min_insync_replicas": 1, **settings}
    names = ", ".join(["name", *cols])
    marks = ", ".join(["%s"] * (len(cols) + 1))
    conn.execute(f"INSERT INTO wal_delivery.topics ({names}) VALUES ({marks})", [name, *cols.values()])


def states(conn, topic):
    rows = conn.execute("SELECT state::text, count(*) FROM wal_delivery.outbox WHERE topic = %s"
                        " GROUP BY 1", (topic,)).fetchall()
    return dict(rows)


def wait_all_stored(conn, topic, count, timeout=90):
    return wait_until(lambda: states(conn, topic) == {"stored": count}, timeout,
                      what=f"{count} stored rows of {topic} (now {states(conn, topic)})")


def read_topic(bootstrap, topic, expect_keys, timeout=60):
    """Reads topic from the start until every key in expect_keys was seen; returns
    {idempotency key: [messages]} (duplicates are allowed: delivery is at least once)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "test-" + uuid.uuid4().hex,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    seen = {}
    deadline = time.time() + timeout
    try:
        while time.time() < deadline and not set(expect_keys) <= set(seen):
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            headers = {k: v.decode() for k, v in msg.headers() or []}
            seen.setdefault(headers["idempotency-key"], []).append(
                {"value": msg.value(), "key": msg.key(), "headers": headers})
        # Read a little longer so unexpected extra records show up too.
        end = time.time() + 1.0
        while time.time() < end:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                headers = {k: v.decode() for k, v in msg.headers() or []}
                seen.setdefault(headers["idempotency-key"], []).append(
                    {"value": msg.value(), "key": msg.key(), "headers": headers})
    finally:
        consumer.close()
    return seen


def relay_pids(conn):
    return [r[0] for r in conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'wal_delivery relay' ORDER BY pid")]


def cpu_ticks(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def server_log():
    return Path(os.environ["WAL_ENV_DIR"], "pglog", "postgres.log").read_text(errors="replace")


def ensure_extension():
    """The extension, with retry and DLQ topics sized for the test cluster's brokers."""
    replicas, min_isr = (3, 2) if os.environ.get("KAFKA_BROKERS") == "3" else (1, 1)
    with connect() as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS wal_delivery")
        conn.execute("UPDATE wal_delivery.settings SET internal_topic_replication_factor = %s,"
                     " internal_topic_min_insync_replicas = %s"
                     " WHERE internal_topic_replication_factor <> %s", (replicas, min_isr, replicas))
