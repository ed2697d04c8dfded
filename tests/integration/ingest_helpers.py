"""Running `wal-worker ingest` against the test environment: its login role, tokens,
topics, and an HTTP client that sends records and remembers every answer."""
import contextlib
import http.client
import json
import os
import threading
import time
import uuid

from confluent_kafka import Consumer, KafkaException, TopicPartition

from conftest import connect
from consumer_helpers import Worker, free_port, wait_published
from relay_helpers import ensure_extension, make_topic, wait_until

INGEST_LOGIN = "wal_ingest_test"


def setup_ingest(conn):
    """The ingest login role (a non-superuser member of wal_delivery_ingest only)."""
    ensure_extension()
    if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (INGEST_LOGIN,)).fetchone():
        conn.execute(f"CREATE ROLE {INGEST_LOGIN} LOGIN IN ROLE wal_delivery_ingest")


def ingest_conninfo():
    return (f"host={os.environ['PGHOST']} port={os.environ['PGPORT']} "
            f"dbname={os.environ['PGDATABASE']} user={INGEST_LOGIN}")


def new_token(conn, topics, name=None):
    name = name or "t-" + uuid.uuid4().hex[:10]
    return conn.execute("SELECT wal_delivery.create_ingest_token(%s, %s)", (name, topics)).fetchone()[0]


def topics_with_token(conn, unique, processing=False, **settings):
    """A plain topic (and a processing one when asked) and a token for them, published."""
    plain = f"ingest.{unique}"
    make_topic(conn, plain, **settings)
    names = [plain]
    if processing:
        conn.execute("CREATE OR REPLACE FUNCTION public.ingest_identity(b bytea) RETURNS bytea"
                     " LANGUAGE sql AS 'SELECT b'")
        make_topic(conn, f"ingest.proc.{unique}", processor_kind="sql",
                   processor="public.ingest_identity")
        names.append(f"ingest.proc.{unique}")
    token = new_token(conn, names)
    wait_published(conn)
    return names, token


class Ingest(Worker):
    """A `wal-worker ingest` listening on a free port."""

    def __init__(self, tmp_path, kafka_bootstrap, *args, deadline_ms=1000, env=None, port=None,
                 wrapper=()):
        self.port = port or free_port()
        super().__init__(tmp_path, "ingest", "--listen", f"127.0.0.1:{self.port}",
                         "--kafka-deadline", str(deadline_ms), *args,
                         kafka_bootstrap=kafka_bootstrap, conninfo=ingest_conninfo(), env=env,
                         wrapper=wrapper)

    def wait_listening(self, timeout=60):
        wait_until(lambda: post(self.port, "/healthz", method="GET")[0] == 200, timeout,
                   what="the ingest server to listen")


def post(port, path, body=b"", headers=None, method="POST", timeout=30, conn=None):
    """(status, parsed JSON or text, headers); (None, error, {}) when the connection fails."""
    own = conn is None
    c = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        try:
            parsed = json.loads(data)
        except ValueError:
            parsed = data.decode(errors="replace")
        return r.status, parsed, dict(r.getheaders())
    except (OSError, http.client.HTTPException) as e:
        if not own:
            c.close()
        return None, str(e), {}
    finally:
        if own:
            c.close()


def send_record(port, topic, token, payload=b"{}", key=None, headers=None, ikey=None,
                content_type="application/json", conn=None):
    h = {"Authorization": f"Bearer {token}", "Content-Type": content_type}
    if ikey:
        h["Idempotency-Key"] = ikey
    if key:
        h["X-Wal-Key"] = key
    for name, value in (headers or {}).items():
        h[f"X-Wal-Header-{name}"] = value
    return post(port, f"/v1/topics/{topic}/records", payload, h, conn=conn)


class IngestLoad:
    """Threads that send records one request each (keep-alive) until stopped, and record
    each answer: (time, idempotency key, status)."""

    def __init__(self, port, topic, token, threads=4, pause=0.0):
        self.port, self.topic, self.token, self.pause = port, topic, token, pause
        self.answers = []
        self.errors = []  # why a request got no answer
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                        for i in range(threads)]

    def _run(self, n):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        i = 0
        while not self.stopping.is_set():
            key = f"{n}-{i}-{uuid.uuid4().hex[:8]}"
            i += 1
            started = time.time()
            status, body, _ = send_record(self.port, self.topic, self.token,
                                          json.dumps({"n": i}).encode(), ikey=key, conn=conn)
            if status is None:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                time.sleep(0.05)
            with self.lock:
                self.answers.append((started, time.time() - started, key, status,
                                     body.get("path") if isinstance(body, dict) else None))
                if status is None:
                    self.errors.append(body)
            if self.pause:
                time.sleep(self.pause)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        for t in self.threads:
            t.join(60)

    def count(self, status=None, path=None):
        with self.lock:
            return sum(1 for a in self.answers
                       if (status is None or a[3] == status) and (path is None or a[4] == path))

    def acknowledged(self):
        with self.lock:
            return [a[2] for a in self.answers if a[3] in (201, 202)]


@contextlib.contextmanager
def running_ingest(tmp_path, kafka_bootstrap, **kw):
    """A `wal-worker ingest` as the ingest login, listening, stopped afterwards."""
    with connect() as conn:
        setup_ingest(conn)
    worker = Ingest(tmp_path, kafka_bootstrap, **kw)
    try:
        worker.wait_listening()
        yield worker
    finally:
        worker.stop()


def kafka_records(bootstrap, topic):
    """How many messages topic has had (its high watermark), None while it does not exist."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ingest-" + uuid.uuid4().hex})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    except KafkaException:
        return None
    finally:
        consumer.close()


def outbox_rows(topic):
    """How many rows of topic the outbox holds."""
    with connect() as conn:
        return conn.execute("SELECT count(*) FROM wal_delivery.outbox WHERE topic = %s",
                            (topic,)).fetchone()[0]


def stored_records(ingest, topic):
    """What topic holds: (messages in Kafka, rows in the outbox)."""
    return kafka_records(ingest.bootstrap, topic), outbox_rows(topic)
