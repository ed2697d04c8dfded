"""Running `wal-worker consume` against the test environment, and setting up destinations."""
import base64
import hashlib
import hmac
import json
import os
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path

import psycopg

from conftest import connect
from relay_helpers import wait_until

# WAL_WORKER_BIN runs the tests against another build (e.g. to see a new test fail on an old one).
WORKER = os.environ.get("WAL_WORKER_BIN") or str(Path(__file__).resolve().parents[2] / "bin" / "wal-worker")


PEER_TOKEN = "test-peer-token-7f3a"
# The login the delivery workers use: a member of wal_delivery_worker, never a superuser.
WORKER_LOGIN = "wal_worker"
WORKER_ROLES = ("consume", "retry", "dlq", "process")


_worker_login_ensured = False


def ensure_worker_login():
    """The workers' login role (cluster-wide, so created once and kept). Once it exists,
    a worker can be started while Postgres is down (fault tests do)."""
    global _worker_login_ensured
    from relay_helpers import ensure_extension
    try:
        ensure_extension()
        with connect() as conn:
            conn.execute(f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{WORKER_LOGIN}')"
                         f" THEN CREATE ROLE {WORKER_LOGIN} LOGIN; END IF; END $$")
            conn.execute(f"GRANT wal_delivery_worker TO {WORKER_LOGIN}")
    except psycopg.OperationalError:
        if not _worker_login_ensured:
            raise
    _worker_login_ensured = True


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Worker:
    """A wal-worker process with an admin port; its log goes to a file under tmp_path."""

    def __init__(self, tmp_path, role, *args, kafka_bootstrap=None, conninfo=None, env=None,
                 wrapper=()):
        self.admin_port = free_port()
        self.log_path = tmp_path / f"{role}-{self.admin_port}.log"
        cmd = [*wrapper, WORKER, role, "--admin-port", str(self.admin_port), *args,
               "-X", "session.timeout.ms=6000", "-X", "heartbeat.interval.ms=1000"]
        if kafka_bootstrap:
            cmd += ["-X", f"bootstrap.servers={kafka_bootstrap}"]
        if conninfo:
            cmd += ["--db", conninfo]
        self.log = open(self.log_path, "w")
        # Every worker of a test shares the peer token, as a fleet does, and logs in with
        # the workers' least rights unless the test says otherwise (PGUSER, user= in --db).
        login = {}
        if role in WORKER_ROLES:
            ensure_worker_login()
            login = {"PGUSER": WORKER_LOGIN}
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "WAL_PEER_TOKEN": PEER_TOKEN, **login,
                                          **(env or {})})

    def url(self, path):
        return f"http://127.0.0.1:{self.admin_port}{path}"

    def get(self, path, token=PEER_TOKEN):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            with urllib.request.urlopen(urllib.request.Request(self.url(path), headers=headers),
                                        timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError:
            return None, ""

    def wait_ready(self, timeout=60):
        wait_until(lambda: self.get("/readyz")[0] == 200, timeout, what="the worker to be ready")

    def metric(self, name, **labels):
        status, text = self.get("/metrics")
        want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
        for line in text.splitlines():
            if line.startswith(want + " "):
                return float(line.split()[-1])
        return 0.0

    def output(self):
        return self.log_path.read_text()

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def reset_destinations():
    """Each consumer test starts with no destinations, so no earlier test's are served."""
    with connect() as conn:
        conn.execute("SET wal_delivery.force_delete = on")
        conn.execute("DELETE FROM wal_delivery.destinations")


def add_destination(conn, name, url, topics, secret=None, **settings):
    cols = {"name": name, "endpoint": url, **settings}
    conn.execute(f"INSERT INTO wal_delivery.destinations ({', '.join(cols)})"
                 f" VALUES ({', '.join(['%s'] * len(cols))})",
                 [json.dumps(v) if isinstance(v, dict) else v for v in cols.values()])
    if secret:
        conn.execute("INSERT INTO wal_delivery.destination_secrets VALUES (%s, %s)", (name, secret))
    for t in topics:
        conn.execute("INSERT INTO wal_delivery.subscriptions (topic, destination) VALUES (%s, %s)",
                     (t, name))


def wait_published(conn, timeout=30):
    wait_until(lambda: conn.execute("SELECT version = published_version FROM"
                                    " wal_delivery.config_version").fetchone()[0],
               timeout, what="the config version to be published")


def standard_webhooks_signature(secret, msg_id, timestamp, body):
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def wait_group_caught_up(bootstrap, group, topic, timeout=60):
    """Waits until consumer group has committed every record topic holds now. The
    workers commit a record's offset only once it is done (a consumer's copies delivered
    or handed off, a DLQ message in dead_letters), so this is the observed event after
    which nothing more can come of those records: where an absence check starts."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        parts = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in parts}

        def behind():
            try:
                committed = c.committed([TopicPartition(topic, p) for p in parts], timeout=10)
            except KafkaException:
                return None
            return {tp.partition: (low, high) for tp in committed
                    for low, high in [ends[tp.partition]] if max(tp.offset, low) < high}

        wait_until(lambda: behind() == {}, timeout,
                   what=f"{group} to commit {topic} up to {ends} (behind: {behind()})")
    finally:
        c.close()
