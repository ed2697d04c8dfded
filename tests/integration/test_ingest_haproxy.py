"""Two `wal-worker ingest` instances behind a real HAProxy (health checks on /readyz); one
is killed with kill -9 under load. Every record a client got a 2xx for is in Kafka
(counted by reading the topic), duplicates are counted, none is lost."""
import shutil
import signal
import subprocess
import time

import pytest

from conftest import connect
from consumer_helpers import free_port
from ingest_helpers import Ingest, IngestLoad, send_record, setup_ingest, topics_with_token
from relay_helpers import read_topic, report, wait_until

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"


@pytest.fixture
def haproxy(tmp_path):
    if not shutil.which(HAPROXY):
        pytest.fail("haproxy is not installed (tests/setup installs it)")
    started = []

    def start(backends):
        port = free_port()
        servers = "\n".join(
            f"    server ingest{i} 127.0.0.1:{p} check inter 200ms fall 2 rise 2"
            for i, p in enumerate(backends))
        cfg = tmp_path / "haproxy.cfg"
        cfg.write_text(f"""global
    maxconn 2000
defaults
    mode http
    timeout connect 1s
    timeout client 30s
    timeout server 30s
    retries 2
    option redispatch
frontend ingest
    bind 127.0.0.1:{port}
    default_backend ingest
backend ingest
    balance roundrobin
    option httpchk GET /readyz
{servers}
""")
        proc = subprocess.Popen([HAPROXY, "-f", str(cfg), "-db"], stdout=subprocess.DEVNULL,
                                stderr=open(tmp_path / "haproxy.log", "w"))
        started.append(proc)
        return port

    yield start
    for proc in started:
        proc.terminate()
        proc.wait(10)


def test_kill_9_behind_haproxy_loses_no_acknowledged_record(tmp_path, kafka_bootstrap, haproxy,
                                                            unique):
    with connect() as conn:
        setup_ingest(conn)
        (topic,), token = topics_with_token(conn, unique)
    a = Ingest(tmp_path, kafka_bootstrap)
    b = Ingest(tmp_path, kafka_bootstrap)
    try:
        for w in (a, b):
            w.wait_listening()
            wait_until(lambda w=w: send_record(w.port, topic, token)[0] == 201, 30, what="config")
        port = haproxy([a.port, b.port])
        wait_until(lambda: send_record(port, topic, token)[0] == 201, 30, what="haproxy")
        with IngestLoad(port, topic, token, threads=8) as load:
            wait_until(lambda: load.count(201) >= 300, 60, what="load through haproxy")
            a.proc.send_signal(signal.SIGKILL)
            killed_at = time.time()
            wait_until(lambda: sum(1 for x in load.answers if x[0] > killed_at + 2
                                   and x[3] == 201) >= 300, 60, what="load after the kill")
        acked = load.acknowledged()
        failed = [x for x in load.answers if x[3] not in (201, 202)]
        # Only requests in flight on the killed instance may fail (HAProxy answers 502/503).
        assert all(x[0] < killed_at + 2 for x in failed), failed[:5]
        seen = read_topic(kafka_bootstrap, topic, acked, timeout=120)
        missing = set(acked) - set(seen)
        dupes = sum(len(v) - 1 for v in seen.values())
        report(f"ingest haproxy kill -9: {len(acked)} acknowledged, {len(failed)} failed during the "
               f"kill, {len(missing)} missing in Kafka, {dupes} duplicates")
        assert not missing, f"{len(missing)} acknowledged records are not in Kafka"
    finally:
        a.stop()
        b.stop()
