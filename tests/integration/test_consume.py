"""`wal-worker consume` against the real broker and real HTTP destinations: every
committed record reaches every subscribed destination (signed, with its headers);
transient failures go to retry step 1 and permanent ones to the DLQ, durably, before the
offset is committed; kill -9 loses nothing; dedicated consumers serve only their
destination; config changes arrive by NOTIFY; a worker started while the database is
down takes its config from a peer."""
import json
import os
import re
import signal
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from conftest import Destination, connect, env_cmd, record_key
from consumer_helpers import (Worker, add_destination, standard_webhooks_signature, wait_group_caught_up,
                              wait_published)
from relay_helpers import duplicates, make_topic, read_topic, report, wait_all_stored, wait_until
from tcp_relay import TcpRelay

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


pytestmark = pytest.mark.usefixtures("clean_destinations")


@pytest.fixture
def workers(tmp_path, kafka_bootstrap):
    started = []

    def start(*args, **kw):
        kw.setdefault("kafka_bootstrap", kafka_bootstrap)
        w = Worker(tmp_path, "consume", *args, **kw)
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop(signal.SIGKILL if w.proc.poll() is None else signal.SIGTERM, timeout=5)


def read_partition(bootstrap, topic, partition, count, timeout=30, destination=None):
    """The first count messages of a partition, or of those for destination: a retry
    partition is shared by destinations, and by earlier tests in a long-lived environment."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "t-" + uuid.uuid4().hex,
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, partition, 0)])
    got, deadline = [], time.time() + timeout
    try:
        while len(got) < count and time.time() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error() and (
                    destination is None or dict(m.headers() or []).get("destination") == destination.encode()):
                got.append(m)
    finally:
        c.close()
    return got


def test_every_record_reaches_every_subscribed_destination_signed(tmp_path, workers, unique):
    topic = f"c.all.{unique}"
    a, b = Destination(tmp_path), Destination(tmp_path)
    try:
        with connect() as conn:
            make_topic(conn, topic, partitions=2)
            add_destination(conn, f"a-{unique}", a.url + "/hook", [topic], secret=SECRET,
                            headers={"X-Team": "billing"})
            add_destination(conn, f"b-{unique}", b.url + "/other", [topic], method="PUT")
            keys = [f"k{i}" for i in range(30)]
            conn.execute("SELECT wal_enqueue_batch(%s, %s::jsonb[], %s)",
                         (topic, [json.dumps({"n": i}) for i in range(30)], keys))
            wait_all_stored(conn, topic, 30)
            wait_published(conn)
        w = workers()
        got_a, got_b = a.wait_for(30), b.wait_for(30)
        assert {record_key(r) for r in got_a} == set(keys)
        assert {record_key(r) for r in got_b} == set(keys)
        for r in got_a:
            h = r["headers"]
            assert r["method"] == "POST" and r["path"] == "/hook"
            assert h["content-type"] == "application/json"
            assert h["x-wal-topic"] == topic and h["x-wal-outbox-id"].isdigit()
            assert h["x-team"] == "billing"
            assert h["webhook-id"] == h["idempotency-key"]
            assert h["webhook-signature"] == standard_webhooks_signature(
                SECRET, h["webhook-id"], h["webhook-timestamp"], r["body"].encode())
            assert json.loads(r["body"]) == {"n": int(record_key(r)[1:])}
        assert all(r["method"] == "PUT" and "webhook-signature" not in r["headers"] for r in got_b)
        wait_until(lambda: w.metric("wal_delivered_total", destination=f"a-{unique}") == 30, 10,
                   what="the delivered metric")
        wait_until(lambda: "wal_consumer_lag{topic=" in w.get("/metrics")[1], 10, what="lag gauges")
        assert w.metric("wal_consumer_lag", topic=topic, partition="0") == 0
        status, cfg = w.get("/config")
        assert status == 200 and SECRET not in cfg and "redacted" in cfg
        # Destination credentials travel in /config: never without the peer token.
        assert w.get("/config", token=None)[0] == 401
        assert w.get("/config", token="not-the-token")[0] == 401
        assert w.stop() == 0
        assert "event=stopped" in w.output()
    finally:
        a.stop()
        b.stop()


def test_failures_are_handed_off_durably_then_the_offset_commits(tmp_path, workers, kafka_bootstrap, unique):
    topic = f"c.fail.{unique}"
    ok, flaky, strict = Destination(tmp_path), Destination(tmp_path), Destination(tmp_path)
    flaky.behave(status=503)
    strict.behave(status=400)
    try:
        with connect() as conn:
            make_topic(conn, topic)
            add_destination(conn, f"ok-{unique}", ok.url, [topic])
            add_destination(conn, f"flaky-{unique}", flaky.url, [topic])
            add_destination(conn, f"strict-{unique}", strict.url, [topic])
            keys = [f"f{i}" for i in range(5)]
            conn.execute("SELECT wal_enqueue_batch(%s, %s::text[], %s)", (topic, keys, keys))
            wait_all_stored(conn, topic, 5)
            wait_published(conn)
            flaky_partition = conn.execute("SELECT retry_partition FROM wal_delivery.destinations"
                                           " WHERE name = %s", (f"flaky-{unique}",)).fetchone()[0]
        w = workers()
        ok.wait_for(5)
        mine = read_partition(kafka_bootstrap, "wal_delivery.retry.1", flaky_partition, 5,
                              destination=f"flaky-{unique}")
        assert {m.key().decode() for m in mine} == set(keys)
        h = {k: v.decode() for k, v in mine[0].headers()}
        assert h["source-topic"] == topic and h["last-error"] == "HTTP 503" and h["attempt"] == "1"
        assert h["source-partition"] == "0" and h["source-offset"].isdigit()
        assert int(h["step-entered-at"]) > 0 and "step-jitter-ms" in h
        assert mine[0].value().decode() == mine[0].key().decode()  # payload unchanged

        dlq = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "t-" + uuid.uuid4().hex,
                        "auto.offset.reset": "earliest"})
        dlq.subscribe(["wal_delivery.dlq"])
        dead = []
        deadline = time.time() + 30
        while time.time() < deadline and len(dead) < 5:
            m = dlq.poll(0.5)
            if m is not None and not m.error() and \
                    dict(m.headers() or []).get("destination") == f"strict-{unique}".encode():
                dead.append(m)
        dlq.close()
        assert {m.key().decode() for m in dead} == set(keys)
        assert dict(dead[0].headers() or [])["last-error"] == b"HTTP 400"

        # Every copy is done, so the group's offset reaches the end of the partition.
        def committed():
            c = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "wal_delivery.shared"})
            try:
                [tp] = c.committed([TopicPartition(topic, 0)], timeout=10)
                return tp.offset
            finally:
                c.close()
        wait_until(lambda: committed() == 5, 20, what="the offset to be committed")
        assert w.metric("wal_handed_off_total", destination=f"flaky-{unique}", to="retry.1") == 5
        assert w.metric("wal_handed_off_total", destination=f"strict-{unique}", to="dlq") == 5
    finally:
        for d in (ok, flaky, strict):
            d.stop()


def test_retry_after_of_a_429_travels_with_the_retry(tmp_path, workers, kafka_bootstrap, unique):
    topic = f"c.429.{unique}"
    d = Destination(tmp_path)
    d.behave(status=429, headers={"Retry-After": "7"})
    try:
        with connect() as conn:
            make_topic(conn, topic)
            add_destination(conn, f"busy-{unique}", d.url, [topic])
            conn.execute("SELECT wal_enqueue(%s, 'x'::text, 'ra-1')", (topic,))
            wait_all_stored(conn, topic, 1)
            wait_published(conn)
            part = conn.execute("SELECT retry_partition FROM wal_delivery.destinations"
                                " WHERE name = %s", (f"busy-{unique}",)).fetchone()[0]
        workers()
        [m] = read_partition(kafka_bootstrap, "wal_delivery.retry.1", part, 1, destination=f"busy-{unique}")
        h = {k: v.decode() for k, v in m.headers()}
        assert int(h["not-before"]) - int(h["step-entered-at"]) == 7000
    finally:
        d.stop()


def test_kill9_of_a_consumer_mid_flight_repeated_loses_nothing(tmp_path, workers, unique):
    topic = f"c.kill.{unique}"
    d = Destination(tmp_path)
    d.behave(delay_ms=100)
    n = 300
    try:
        with connect() as conn:
            make_topic(conn, topic, partitions=2)
            add_destination(conn, f"slow-{unique}", d.url, [topic], max_in_flight=8)
            keys = [f"x{i}" for i in range(n)]
            conn.execute("SELECT wal_enqueue_batch(%s, %s::text[], %s)", (topic, keys, keys))
            wait_all_stored(conn, topic, n)
            wait_published(conn)
        for target in (40, 120):  # kill -9 twice, each time with copies in flight
            w = workers()
            wait_until(lambda: len(d.requests()) >= target, 90, what=f"{target} deliveries")
            w.stop(signal.SIGKILL)
        workers()
        wait_until(lambda: {record_key(r) for r in d.requests()} >= set(keys),
                   120, what="every record delivered after the restarts")
        seen = {}
        for r in d.requests():
            seen.setdefault(record_key(r), []).append(r)
        report(f"consumer kill -9 x2 mid-flight: {n} records, all delivered, "
               f"{duplicates(seen)} duplicates")
    finally:
        d.stop()


def test_a_dedicated_consumer_serves_only_its_destination(tmp_path, workers, kafka_bootstrap, unique):
    topic = f"c.ded.{unique}"
    busy, quiet = Destination(tmp_path), Destination(tmp_path)
    try:
        with connect() as conn:
            make_topic(conn, topic)
            add_destination(conn, f"busy-{unique}", busy.url, [topic], dedicated=True)
            add_destination(conn, f"quiet-{unique}", quiet.url, [topic])
            conn.execute("SELECT wal_enqueue_batch(%s, %s::text[], %s)",
                         (topic, ["a", "b", "c"], ["d1", "d2", "d3"]))
            wait_all_stored(conn, topic, 3)
            wait_published(conn)
        workers()
        quiet.wait_for(3)
        # Every copy the shared consumer made of the three records is done: one for busy
        # would have reached it by now.
        wait_group_caught_up(kafka_bootstrap, "wal_delivery.shared", topic)
        assert busy.requests() == [], "the shared consumer served a dedicated destination"
        workers("--destination", f"busy-{unique}")
        busy.wait_for(3)
        wait_group_caught_up(kafka_bootstrap, f"wal_delivery.dedicated.busy-{unique}", topic)
        assert len(quiet.requests()) == 3, "the dedicated consumer served another destination"
    finally:
        busy.stop()
        quiet.stop()


@pytest.mark.parametrize("name, message", [
    ("no-such-destination", "no such destination"),
    ("shared-one", "not marked dedicated"),
])
def test_dedicated_consumer_bad_destination_is_refused(tmp_path, workers, name, message):
    with connect() as conn:
        add_destination(conn, "shared-one", "http://127.0.0.1:9/", [])
    w = workers("--destination", name)
    assert w.proc.wait(30) == 2
    assert message in w.output()


def test_config_changes_arrive_by_notify(tmp_path, workers, unique):
    t1, t2 = f"c.cfg1.{unique}", f"c.cfg2.{unique}"
    d = Destination(tmp_path)
    try:
        with connect() as conn:
            make_topic(conn, t1)
            make_topic(conn, t2)
            add_destination(conn, f"cfg-{unique}", d.url, [t1])
            wait_published(conn)
        w = workers()
        w.wait_ready()
        with connect() as conn:
            conn.execute("INSERT INTO wal_delivery.subscriptions VALUES (%s, %s)", (t2, f"cfg-{unique}"))
            conn.execute("SELECT wal_enqueue(%s, 'new topic'::text, 'n1')", (t2,))
            wait_all_stored(conn, t2, 1)
        d.wait_for(1, timeout=30)
        assert "event=config_changed" in w.output()
    finally:
        d.stop()


def test_a_changed_endpoint_and_method_apply_to_the_next_deliveries(tmp_path, workers, unique):
    """Idle connections and request set-ups are reused per destination; an edit to the
    destination must still take effect for what is sent after it is published."""
    topic, name = f"c.edit.{unique}", f"edit-{unique}"
    d = Destination(tmp_path)
    try:
        with connect() as conn:
            make_topic(conn, topic)
            add_destination(conn, name, d.url + "/before", [topic], max_in_flight=4)
            wait_published(conn)
        w = workers()
        w.wait_ready()
        with connect() as conn:
            conn.execute("SELECT wal_enqueue_batch(%s, ARRAY(SELECT jsonb_build_object('n', i)"
                         " FROM generate_series(1, 20) i), ARRAY(SELECT 'b' || i FROM generate_series(1, 20) i))",
                         (topic,))
            wait_all_stored(conn, topic, 20)
        d.wait_for(20, path="/before")
        changes = w.output().count("event=config_changed")
        with connect() as conn:
            conn.execute("UPDATE wal_delivery.destinations SET endpoint = %s, method = 'PUT'"
                         " WHERE name = %s", (d.url + "/after", name))
            wait_published(conn)
        wait_until(lambda: w.output().count("event=config_changed") > changes, 30,
                   what="the worker to take the change")
        with connect() as conn:
            conn.execute("SELECT wal_enqueue_batch(%s, ARRAY(SELECT jsonb_build_object('n', i)"
                         " FROM generate_series(1, 20) i), ARRAY(SELECT 'a' || i FROM generate_series(1, 20) i))",
                         (topic,))
            wait_all_stored(conn, topic, 40)
        after = d.wait_for(20, path="/after")
        assert {r["method"] for r in after} == {"PUT"}
        assert sorted(record_key(r) for r in after) == sorted(f"a{i}" for i in range(1, 21))
        assert len(d.requests("/before")) == 20
    finally:
        d.stop()


def test_a_worker_started_while_the_database_is_down_uses_a_peer(tmp_path, workers, unique):
    topic = f"c.peer.{unique}"
    with connect() as conn:
        make_topic(conn, topic)
        add_destination(conn, f"peer-{unique}", "http://127.0.0.1:9/", [topic], secret=SECRET)
        wait_published(conn)
    peer = workers()
    peer.wait_ready()
    lonely = workers(conninfo="host=127.0.0.1 port=1 connect_timeout=1")
    # It tried, found no config, and tried again: it waits, it does not exit.
    wait_until(lambda: lonely.output().count("event=no_config") >= 2 or lonely.proc.poll() is not None,
               60, what="the worker to try for its config twice")
    assert lonely.proc.poll() is None, "a worker without config must wait, not exit"
    assert lonely.output().count("event=no_config") >= 2
    assert lonely.stop() == 0
    # A worker that does not hold the fleet's token gets nothing from the peer.
    outsider = workers("--peer", peer.url(""), conninfo="host=127.0.0.1 port=1 connect_timeout=1",
                       env={"WAL_PEER_TOKEN": "a-guess"})
    wait_until(lambda: "answered HTTP 401" in outsider.output(), 30, what="the peer's 401")
    assert "event=config_from_peer" not in outsider.output()
    assert outsider.stop() == 0
    helped = workers("--peer", peer.url(""), conninfo="host=127.0.0.1 port=1 connect_timeout=1")
    wait_until(lambda: "event=config_from_peer" in helped.output(), 30, what="config from the peer")
    helped.wait_ready()


def test_unresolvable_and_silent_destinations_go_to_retry_with_the_reason(tmp_path, workers, kafka_bootstrap, unique):
    topic = f"c.bad.{unique}"
    silent = Destination(tmp_path)
    silent.behave(hang=True)
    try:
        with connect() as conn:
            make_topic(conn, topic)
            add_destination(conn, f"nxdomain-{unique}", "http://no-such-host.invalid/hook", [topic])
            add_destination(conn, f"silent-{unique}", silent.url, [topic], timeout="1 second")
            conn.execute("SELECT wal_enqueue(%s, 'x'::text, 'bad-1')", (topic,))
            wait_all_stored(conn, topic, 1)
            wait_published(conn)
            parts = dict(conn.execute("SELECT name, retry_partition FROM wal_delivery.destinations").fetchall())
        w = workers()
        for name, needle in ((f"nxdomain-{unique}", "resolve"), (f"silent-{unique}", "timed out")):
            [m] = read_partition(kafka_bootstrap, "wal_delivery.retry.1", parts[name], 1, destination=name)
            assert needle in dict(m.headers() or [])["last-error"].decode().lower()
            assert w.metric("wal_handed_off_total", destination=name, to="retry.1") == 1
        assert "event=hand_off" in w.output()
    finally:
        silent.stop()


def peak_rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def test_answers_of_half_a_gigabyte_are_read_and_dropped_in_bounded_memory(tmp_path, workers, unique):
    topic, name = f"c.huge.{unique}", f"huge-{unique}"
    dest = Destination(tmp_path)
    dest.behave(status=200, body_bytes=512 << 20)
    try:
        with connect() as conn:
            make_topic(conn, topic)
            add_destination(conn, name, dest.url + "/big", [topic], timeout="60 seconds")
            conn.execute("SELECT wal_enqueue_batch(%s, ARRAY['{}','{}','{}']::jsonb[],"
                         " ARRAY['h1','h2','h3'])", (topic,))
            wait_all_stored(conn, topic, 3)
            wait_published(conn)
        w = workers()
        wait_until(lambda: w.metric("wal_delivered_total", destination=name) == 3, 120,
                   what="three copies answered with 512 MiB each, delivered")
        peak = peak_rss_mb(w.proc.pid)
        assert peak < 120, f"peak RSS {peak:.0f} MB for 1.5 GiB of answers"
        report(f"consumer: 3 answers of 512 MiB each read and dropped, peak RSS {peak:.0f} MB")
    finally:
        dest.stop()


def test_a_record_without_the_relays_headers_is_still_delivered(tmp_path, workers, kafka_bootstrap, unique):
    from confluent_kafka import Producer
    topic = f"c.raw.{unique}"
    d = Destination(tmp_path)
    try:
        with connect() as conn:
            make_topic(conn, topic)
            add_destination(conn, f"raw-{unique}", d.url, [topic])
            wait_published(conn)
        p = Producer({"bootstrap.servers": kafka_bootstrap})
        p.produce(topic, b"no headers at all")
        p.flush(10)
        workers()
        [r] = d.wait_for(1)
        assert r["body"] == "no headers at all"
        assert record_key(r) == f"{topic}-0-0"
        assert r["headers"]["content-type"] == "application/octet-stream"
    finally:
        d.stop()


def test_a_slow_dedicated_destination_does_not_slow_the_shared_ones(tmp_path, workers, unique):
    """Latency of a fast shared destination, alone and next to a destination that takes
    2 s per request served by its own dedicated consumer."""
    def fast_latencies(fast, keys_created):
        got = fast.wait_for(len(keys_created), timeout=60)
        return sorted(r["arrived_at"] - keys_created[record_key(r)] for r in got)

    def enqueue(conn, topic, prefix, n):
        created = {}
        for i in range(n):
            key = f"{prefix}{i}"
            conn.execute("SELECT wal_enqueue(%s, 'x'::text, %s)", (topic, key))
            created[key] = time.time()
            time.sleep(0.02)
        return created

    topic = f"c.noisy.{unique}"
    fast, slow = Destination(tmp_path), Destination(tmp_path)
    slow.behave(delay_ms=2000)
    try:
        with connect() as conn:
            make_topic(conn, topic)
            add_destination(conn, f"fast-{unique}", fast.url, [topic])
            wait_published(conn)
        workers().wait_ready()
        with connect() as conn:
            fast_latencies(fast, enqueue(conn, topic, "warm", 5))  # first-use costs out of the way
            fast.control("reset", {})
            alone = fast_latencies(fast, enqueue(conn, topic, "a", 40))
            add_destination(conn, f"slow-{unique}", slow.url, [topic], dedicated=True, max_in_flight=2)
            wait_published(conn)
        workers("--destination", f"slow-{unique}").wait_ready()
        fast.control("reset", {})
        with connect() as conn:
            beside = fast_latencies(fast, enqueue(conn, topic, "b", 40))
        def p95(xs):
            return xs[int(len(xs) * 0.95) - 1]
        report(f"noisy neighbour: fast destination p95 latency {p95(alone) * 1000:.0f} ms alone, "
               f"{p95(beside) * 1000:.0f} ms beside a 2 s/request dedicated destination")
        assert p95(beside) < p95(alone) + 1.0, (p95(alone), p95(beside))
        assert len(slow.requests()) > 0
    finally:
        fast.stop()
        slow.stop()


def test_a_missed_push_is_caught_up(tmp_path, workers, unique):
    t1, t2 = f"c.miss1.{unique}", f"c.miss2.{unique}"
    d = Destination(tmp_path)
    try:
        with connect() as conn:
            make_topic(conn, t1)
            make_topic(conn, t2)
            add_destination(conn, f"miss-{unique}", d.url, [t1])
            wait_published(conn)
        w = workers("--time-scale", "10")
        w.wait_ready()
        with connect() as conn:
            # Cut the worker's LISTEN connection, so the NOTIFY of the next change is lost.
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                         " WHERE query = 'LISTEN wal_delivery_published'")
            conn.execute("INSERT INTO wal_delivery.subscriptions VALUES (%s, %s)", (t2, f"miss-{unique}"))
            wait_published(conn)
            conn.execute("SELECT wal_enqueue(%s, 'late'::text, 'm1')", (t2,))
        d.wait_for(1, timeout=30)
    finally:
        d.stop()


def test_without_a_push_the_poll_finds_the_change(tmp_path, workers, unique):
    t1, t2 = f"c.poll1.{unique}", f"c.poll2.{unique}"
    d = Destination(tmp_path)
    try:
        with connect() as conn:
            make_topic(conn, t1)
            make_topic(conn, t2)
            add_destination(conn, f"poll-{unique}", d.url, [t1])
            wait_published(conn)
        w = workers("--time-scale", "10")  # polls every 3 s
        w.wait_ready()
        with connect() as conn:
            # Publish the change ourselves in its own transaction: the reconciler then has
            # nothing to do, so no NOTIFY wal_delivery_published is ever sent.
            with conn.transaction():
                conn.execute("INSERT INTO wal_delivery.subscriptions VALUES (%s, %s)", (t2, f"poll-{unique}"))
                conn.execute("UPDATE wal_delivery.config_version SET published_version = version")
            changed_at = time.time()
            conn.execute("SELECT wal_enqueue(%s, 'polled'::text, 'p1')", (t2,))
        d.wait_for(1, timeout=30)
        assert time.time() - changed_at < 15
        assert "event=config_changed" in w.output()
    finally:
        d.stop()


def test_a_lock_on_the_control_plane_holds_up_the_config_not_the_deliveries(tmp_path, workers, unique):
    """A DBA's long transaction on the control plane (here an ACCESS EXCLUSIVE lock on
    destination_secrets) holds up the worker's next reload; the deliveries go on meanwhile
    with the configuration the worker has, and the change arrives once the lock goes."""
    t1, t2 = f"c.lock1.{unique}", f"c.lock2.{unique}"
    d = Destination(tmp_path)
    try:
        with connect() as conn:
            make_topic(conn, t1)
            make_topic(conn, t2)
            add_destination(conn, f"lock-{unique}", d.url, [t1])
            wait_published(conn)
        w = workers()
        w.wait_ready()
        with connect() as conn, connect() as dba:
            dba.execute("BEGIN")
            dba.execute("LOCK TABLE wal_delivery.destination_secrets IN ACCESS EXCLUSIVE MODE")
            try:
                conn.execute("NOTIFY wal_delivery_published")
                wait_until(lambda: conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'wal-worker consume'"
                    " AND wait_event_type = 'Lock'").fetchone()[0] > 0,
                    timeout=15, what="the worker's reload waiting for the lock")
                for i in range(5):
                    conn.execute("SELECT wal_enqueue(%s, %s::text, %s)", (t1, f"locked {i}", f"l{i}"))
                d.wait_for(5, timeout=30)  # delivered while the reload still waits
                assert conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'wal-worker consume'"
                    " AND wait_event_type = 'Lock'").fetchone()[0] > 0
            finally:
                dba.execute("ROLLBACK")
            conn.execute("INSERT INTO wal_delivery.subscriptions VALUES (%s, %s)", (t2, f"lock-{unique}"))
            wait_published(conn)
            conn.execute("SELECT wal_enqueue(%s, 'after the lock'::text, 'a1')", (t2,))
        d.wait_for(6, timeout=30)
        assert "event=config_changed" in w.output()
    finally:
        d.stop()


def test_a_database_that_stops_answering_does_not_stop_the_deliveries(tmp_path, workers, unique):
    """The worker's connections to the database go through a relay that then freezes: no
    byte passes, no connection is refused or closed (a link that drops packets). The
    worker's pause state and config watch wait for answers that never come; records
    already in Kafka are delivered meanwhile, and it settles again once the link is back."""
    topic = f"c.frozen.{unique}"
    d = Destination(tmp_path)
    relay = TcpRelay("127.0.0.1", (os.environ["PGHOST"], int(os.environ["PGPORT"])))
    try:
        with connect() as conn:
            make_topic(conn, topic)
            add_destination(conn, f"frozen-{unique}", d.url, [topic])
            wait_published(conn)
        # Time scale 10: the pause state re-reads the database every 0.5 s.
        w = workers("--time-scale", "10", env={"PGHOST": "127.0.0.1", "PGPORT": str(relay.port)})
        w.wait_ready()
        with connect() as conn:
            conn.execute("SELECT wal_enqueue(%s, 'before'::text, 'f0')", (topic,))
            d.wait_for(1, timeout=30)
            relay.freeze()
            time.sleep(1)  # the worker's next statements are now waiting for an answer
            for i in range(1, 6):
                conn.execute("SELECT wal_enqueue(%s, %s::text, %s)", (topic, f"frozen {i}", f"f{i}"))
            d.wait_for(6, timeout=30)
        # The pause state's statement did wait (and gave up) while the copies went out.
        wait_until(lambda: "no answer within" in w.output(), timeout=15, what="the pause state's timeout")
        relay.thaw()
        with connect() as conn:
            conn.execute("SELECT wal_enqueue(%s, 'after'::text, 'f6')", (topic,))
        d.wait_for(7, timeout=60)
        # The pause state connects again (step by step, on the loop) once the link is back.
        wait_until(lambda: "event=pause_state_db_back" in w.output(), timeout=60, what="the pause state back")
        assert w.proc.poll() is None
    finally:
        relay.close()
        d.stop()


def test_the_same_key_on_two_topics_is_two_records_for_a_destination(tmp_path, workers, kafka_bootstrap,
                                                                     unique):
    """Keys are unique per topic: a destination subscribed to both topics gets both
    records, each identified as <topic>:<key> (Idempotency-Key and webhook-id)."""
    first, second = f"c.twin1.{unique}", f"c.twin2.{unique}"
    d = Destination(tmp_path)
    try:
        with connect() as conn:
            make_topic(conn, first)
            make_topic(conn, second)
            add_destination(conn, f"twin-{unique}", d.url, [first, second], secret=SECRET)
            for topic in (first, second):
                conn.execute("SELECT wal_enqueue(%s, %s::jsonb, 'order-42')", (topic, json.dumps({"t": topic})))
                wait_all_stored(conn, topic, 1)
            wait_published(conn)
        workers()
        d.wait_for(2)
        # Both records done: an extra copy would have arrived (a wrongly deduped one never does).
        for topic in (first, second):
            wait_group_caught_up(kafka_bootstrap, "wal_delivery.shared", topic)
        got = d.requests()
        assert sorted(r["headers"]["idempotency-key"] for r in got) == [f"{first}:order-42", f"{second}:order-42"]
        for r in got:
            h = r["headers"]
            assert record_key(r) == "order-42" and json.loads(r["body"]) == {"t": h["x-wal-topic"]}
            assert h["webhook-id"] == h["idempotency-key"]
            assert h["webhook-signature"] == standard_webhooks_signature(
                SECRET, h["webhook-id"], h["webhook-timestamp"], r["body"].encode())
    finally:
        d.stop()


def test_a_copy_that_cannot_be_signed_is_a_dead_letter_and_never_sent_unsigned(
        tmp_path, workers, kafka_bootstrap, unique):
    """A record written to Kafka by someone else with a key holding a line break (the
    outbox refuses such keys) cannot be signed: a destination with a secret never gets it
    unsigned; it lands in the DLQ topic with the reason, and the records after it flow."""
    topic = f"c.unsignable.{unique}"
    d = Destination(tmp_path)
    bad_key, long_key = f"bad\nkey-{unique}", "k" * 600
    try:
        with connect() as conn:
            make_topic(conn, topic)
            add_destination(conn, f"signed-{unique}", d.url, [topic], secret=SECRET)
            wait_published(conn)
            dlq = conn.execute("SELECT dlq_topic FROM wal_delivery.settings").fetchone()[0]
        p = Producer({"bootstrap.servers": kafka_bootstrap})
        for key in (bad_key, long_key, f"good-{unique}"):
            p.produce(topic, b"{}", headers=[("idempotency-key", key.encode()), ("source-topic", topic.encode()),
                                             ("content-type", b"application/json")])
        p.flush(10)
        workers()
        [good] = d.wait_for(1)
        assert record_key(good) == f"good-{unique}" and "webhook-signature" in good["headers"]
        dead = read_topic(kafka_bootstrap, dlq, [bad_key, long_key], timeout=30)
        for key in (bad_key, long_key):
            assert key in dead, f"{key[:20]!r} is not in the DLQ topic"
            assert "cannot sign" in dead[key][0]["headers"]["last-error"]
        wait_group_caught_up(kafka_bootstrap, "wal_delivery.shared", topic)  # all three done
        assert len(d.requests()) == 1, "an unsignable copy reached the destination"
    finally:
        d.stop()


def test_copies_queued_before_a_pause_never_reach_the_paused_destination(tmp_path, workers, kafka_bootstrap,
                                                                         unique):
    """The breaker is checked when a request starts, not only when it is queued: a slow
    destination with one request in flight and the rest queued in the engine is paused;
    from then on it gets nothing (its probe is the retry consumers' job), and the queued
    copies go to retry step 1."""
    topic = f"c.breaker.{unique}"
    d = Destination(tmp_path)
    d.behave(delay_ms=1500)
    name = f"slow-{unique}"
    try:
        with connect() as conn:
            make_topic(conn, topic)
            add_destination(conn, name, d.url, [topic], max_in_flight=1)
            wait_published(conn)
        w = workers()
        w.wait_ready()
        with connect() as conn:
            conn.execute("SELECT wal_enqueue_batch(%s, ARRAY(SELECT '{}'::jsonb FROM generate_series(1, 30)))", (topic,))
            wait_all_stored(conn, topic, 30)
            d.wait_for(1, timeout=30)
            wait_until(lambda: w.metric("wal_in_flight") is not None, 10, what="the in-flight gauge")
            conn.execute("SELECT wal_delivery.pause_destination(%s, 1, 'test pause', interval '1 hour')", (name,))
            paused_at = time.time()
        wait_until(lambda: (w.metric("wal_breaker_open_handoffs_total", destination=name) or 0) >= 28, 30,
                   what="the queued copies handed to step 1")
        # All 30 done (the one in flight at the pause answered, the rest handed off): a
        # request to the paused destination would have arrived by now.
        wait_group_caught_up(kafka_bootstrap, "wal_delivery.shared", topic)
        late = [r for r in d.requests() if r["arrived_at"] > paused_at + 0.5]
        assert late == [], f"{len(late)} requests reached the paused destination"
        assert len(d.requests()) <= 2
    finally:
        with connect() as conn:
            conn.execute("SELECT wal_delivery.resume_destination(%s)", (name,))
        d.stop()


def test_a_fatal_kafka_error_replaces_the_handoff_producer_and_loses_nothing(tmp_path, workers,
                                                                            kafka_bootstrap, unique):
    """A fatal error of the hand-off producer (librdkafka refuses every produce from then
    on; librdkafka 2.0 raises one after a broker restart, which is how a chaos run's retry
    worker died; injected here with rd_kafka_test_fatal_error through the test-only hook
    WAL_TEST_FATAL_FILE) while five hand-offs wait for a stopped broker: the worker stays
    up, replaces the producer, and the new one hands every copy to step 1 once the broker
    is back. Once more with nothing in flight, so a replacement can be replaced too."""
    topic = f"c.fatal.{unique}"
    trigger = tmp_path / "fatal"
    ok, flaky = Destination(tmp_path), Destination(tmp_path)
    flaky.behave(status=503, delay_ms=6000)
    flaky_name = f"flaky-{unique}"
    keys = [f"z{i}" for i in range(5)]
    later = [f"y{i}" for i in range(5)]
    brokers = range(1, int(os.environ.get("KAFKA_BROKERS", "1")) + 1)
    stopped = False
    try:
        with connect() as conn:
            make_topic(conn, topic)
            add_destination(conn, f"ok-{unique}", ok.url, [topic])
            add_destination(conn, flaky_name, flaky.url, [topic])
            conn.execute("SELECT wal_enqueue_batch(%s, %s::text[], %s)", (topic, keys, keys))
            wait_all_stored(conn, topic, 5)
            wait_published(conn)
            flaky_partition = conn.execute("SELECT retry_partition FROM wal_delivery.destinations"
                                           " WHERE name = %s", (flaky_name,)).fetchone()[0]
        w = workers(env={"WAL_TEST_FATAL_FILE": str(trigger)})
        flaky.wait_for(5)  # each answered 503 six seconds from now
        stopped = True
        for n in brokers:
            env_cmd("kafka-stop", str(n))
        wait_until(lambda: w.metric("wal_in_flight", destination=flaky_name) == 0
                   and (w.metric("wal_handoffs_pending") or 0) >= 5, 60,
                   what="five hand-offs waiting for the stopped broker")
        trigger.touch()
        wait_until(lambda: (w.metric("wal_handoff_producer_replaced_total") or 0) >= 1, 30,
                   what="the hand-off producer replaced")
        assert not trigger.exists()
        replaced = re.findall(r"event=handoff_producer_replaced \S+ pending=(\d+)", w.output())
        assert replaced and int(replaced[0]) >= 5, w.output()[-3000:]
        for n in brokers:
            env_cmd("kafka-start", str(n))
        stopped = False
        wait_until(lambda: handed_to_step_1(kafka_bootstrap, flaky_partition, flaky_name) >= set(keys),
                   90, what="every copy handed to step 1 by the new producer")
        wait_until(lambda: w.metric("wal_handoffs_pending") == 0, 30, what="no hand-off pending")

        trigger.touch()  # the replacement fails too, with nothing in flight
        wait_until(lambda: (w.metric("wal_handoff_producer_replaced_total") or 0) >= 2, 30,
                   what="the replacement replaced")
        with connect() as conn:
            conn.execute("SELECT wal_enqueue_batch(%s, %s::text[], %s)", (topic, later, later))
        wait_until(lambda: handed_to_step_1(kafka_bootstrap, flaky_partition, flaky_name)
                   >= set(keys + later), 60, what="later copies handed off by the third producer")

        assert w.proc.poll() is None, "the worker exited: " + w.output()[-2000:]
        log = w.output()
        assert log.count("event=test_fatal_error_injected") == 2
        assert log.count("event=kafka_fatal_error") == 2
        wait_until(lambda: {record_key(r) for r in ok.requests()} == set(keys + later), 30,
                   what="every record delivered to the healthy destination")
    finally:
        if stopped:
            for n in brokers:
                env_cmd("kafka-start", str(n), check=False)
        ok.stop()
        flaky.stop()


def handed_to_step_1(kafka_bootstrap, partition, destination):
    """The keys of the copies of destination in step 1's partition."""
    c = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "t-" + uuid.uuid4().hex,
                  "enable.auto.commit": False})
    c.assign([TopicPartition("wal_delivery.retry.1", partition, 0)])
    mine, idle = set(), 0
    try:
        while idle < 4:
            m = c.poll(0.5)
            if m is None:
                idle += 1
            elif not m.error() and dict(m.headers() or []).get("destination") == destination.encode():
                mine.add(m.key().decode())
    finally:
        c.close()
    return mine
