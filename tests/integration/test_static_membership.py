"""`--instance NAME`: static consumer group membership. A consumer killed with kill -9
and started again under the same name takes its partitions back at once, without a
rebalance: the other members keep theirs (and what they have in flight), and the
restarted one is ready in seconds instead of after the dead member's session timeout.
Each test uses a dedicated consumer group (`--destination`): a static member that goes
away for good keeps its partitions until session.timeout.ms, which must not reach the
shared group other tests use."""
import re
import signal
import threading
import time

import pytest

from conftest import Destination, connect, record_key
from consumer_helpers import Worker, add_destination, wait_published
from relay_helpers import make_topic, report, wait_until

pytestmark = pytest.mark.usefixtures("clean_destinations")


def revocations(worker):
    return len(re.findall(r"event=revoked", worker.output()))


def test_a_restarted_static_member_takes_its_partitions_back_without_a_rebalance(
        tmp_path, kafka_bootstrap, unique):
    topic, name = f"c.static.{unique}", f"static-{unique}"
    d = Destination(tmp_path)
    started, stop, keys = [], threading.Event(), []

    def consumer(instance):
        w = Worker(tmp_path, "consume", "--destination", name, "--instance", instance,
                   kafka_bootstrap=kafka_bootstrap)
        started.append(w)
        return w

    def write():
        with connect() as conn:
            i = 0
            while not stop.is_set():
                key = f"k{i}"
                conn.execute("SELECT wal_enqueue(%s, %s::text, %s)", (topic, key, key))
                keys.append(key)
                i += 1
                time.sleep(0.02)

    writer = threading.Thread(target=write, daemon=True)
    try:
        with connect() as conn:
            make_topic(conn, topic, partitions=4)
            add_destination(conn, name, d.url, [topic], dedicated=True)
            wait_published(conn)
        a, b = consumer("a"), consumer("b")
        for w in (a, b):
            w.wait_ready()
        wait_until(lambda: all("event=assigned partitions=2" in w.output() for w in (a, b)), 60,
                   what="the four partitions split between the two members")
        writer.start()
        wait_until(lambda: len(d.requests()) >= 50, 60, what="records flowing")

        b_revoked = revocations(b)
        a.stop(signal.SIGKILL)
        killed_at = time.time()
        a = consumer("a")
        a.wait_ready(timeout=30)
        back_in = time.time() - killed_at
        assert back_in < 20, f"the restarted member was ready after {back_in:.1f}s"
        wait_until(lambda: len(d.requests()) >= len(keys) // 2 + 50, 60,
                   what="records flowing after the restart")
        assert revocations(b) == b_revoked, "the other member was made to give up its partitions"

        stop.set()
        writer.join(10)
        wait_until(lambda: {record_key(r) for r in d.requests()} >= set(keys), 120,
                   what="every record delivered")
        got = [record_key(r) for r in d.requests()]
        report(f"static membership: kill -9 and restart of one of two members: ready again in"
               f" {back_in:.1f}s, the other kept its partitions; {len(keys)} records delivered,"
               f" {len(got) - len(set(got))} duplicates")
    finally:
        stop.set()
        for w in started:
            w.stop(signal.SIGKILL if w.proc.poll() is None else signal.SIGTERM, timeout=5)
        d.stop()
