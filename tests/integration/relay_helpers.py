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


def decoded_headers(msg):
    """A message's headers as text (the first value of each name, as the workers read
    them); bytes that are not UTF-8 are kept as escapes."""
    headers = {}
    for k, v in msg.headers() or []:
        headers.setdefault(k, (v or b"").decode("utf-8", "backslashreplace"))
    return headers


def read_topic(bootstrap, topic, expect_keys, timeout=60):
    """Reads topic from the start until every key in expect_keys was seen; returns
    {idempotency key: [messages]} (duplicates are allowed: delivery is at least once);
    a message's create_time is Kafka's CreateTime in seconds: when the relay produced it."""
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
            headers = decoded_headers(msg)
            if "idempotency-key" in headers:  # other tests' messages may lack it
                seen.setdefault(headers["idempotency-key"], []).append(
                    {"value": msg.value(), "key": msg.key(), "headers": headers,
                     "create_time": msg.timestamp()[1] / 1000.0})
        # Read a little longer so unexpected extra records show up too.
        end = time.time() + 1.0
        while time.time() < end:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                headers = decoded_headers(msg)
                if "idempotency-key" in headers:
                    seen.setdefault(headers["idempotency-key"], []).append(
                        {"value": msg.value(), "key": msg.key(), "headers": headers,
                     "create_time": msg.timestamp()[1] / 1000.0})
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


class EnqueueLoad:
    """Enqueues records one transaction each, in a thread, until stopped; remembers the
    keys whose commit was acknowledged. Errors (the server going away) are counted and
    retried with a new connection: those records were never acknowledged."""

    def __init__(self, topic, connect_fn=connect, pause=0.002):
        import threading
        self.topic, self.connect_fn, self.pause = topic, connect_fn, pause
        self.acked, self.errors = [], 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        import psycopg
        conn, n = None, 0
        payload = "x" * 500
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = self.connect_fn()
                key = f"load-{n}"
                n += 1
                conn.execute("SELECT wal_enqueue(%s, %s::text, %s)", (self.topic, payload, key))
                self.acked.append(key)
            except psycopg.Error:
                self.errors += 1
                conn = None
                time.sleep(0.2)
            time.sleep(self.pause)
        if conn is not None:
            conn.close()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(30)


def wait_load_progress(load, more=100, timeout=60):
    """Waits until load has acknowledged `more` records beyond now: the system takes
    writes (after a restart: it is back), instead of sleeping a fixed time."""
    start = len(load.acked)
    wait_until(lambda: len(load.acked) >= start + more, timeout,
               what=f"{more} more acknowledged enqueues (at {len(load.acked)})")


def connect_when_ready(timeout=60):
    """A connection as soon as Postgres accepts one (it refuses during crash recovery)."""
    import psycopg

    def attempt():
        try:
            return connect()
        except psycopg.OperationalError:
            return None
    return wait_until(attempt, timeout, interval=0.2, what="Postgres to accept connections")


def wait_new_relay(old_pids, timeout=60):
    """Waits until a relay other than old_pids runs (the postmaster restarted it). A
    connection made just before the crash restart is cut by it: that try just fails."""
    import psycopg

    def new_pids():
        try:
            with connect() as conn:
                pids = relay_pids(conn)
        except psycopg.Error:
            return None
        return pids if pids and not set(pids) & set(old_pids) else None
    return wait_until(new_pids, timeout, interval=0.3, what="a new relay after the restart")


def report(line):
    """Appends a measured figure to the run's fault report (tests/run prints it)."""
    out = Path(__file__).resolve().parents[2] / ".cache" / "test-output"
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "fault-report.txt", "a") as f:
        f.write(line + "\n")


def duplicates(seen):
    return sum(len(v) - 1 for v in seen.values())
