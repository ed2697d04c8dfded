"""Consumer groups while records are being delivered: `wal-worker consume` instances join
and leave one group on a 12-partition topic, and every record still reaches the
destination, at least once. A clean change of membership (a member joining, a member
stopped with SIGTERM) sends nothing twice: a member lets the open records of the
partitions it gives up finish and commits them before they move. Only a kill -9 sends
records again, and only those the killed member had sent and not yet committed.

Duplicates are counted at the destination by idempotency key; those the kill -9 explains
are told apart by their offsets against the group's commit taken right before it."""
import re
import signal
import time
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition

from conftest import Destination, connect, record_key
from consumer_helpers import Worker, add_destination, wait_group_caught_up, wait_published
from relay_helpers import make_topic, report, wait_all_stored, wait_until

pytestmark = pytest.mark.usefixtures("clean_destinations")

GROUP = "wal_delivery.shared"
PARTITIONS = 12
RECORDS = 20000
LATENCY_MS = 20  # the destination answers after this long: copies are in flight
MAX_IN_FLIGHT = 8
COMMIT_INTERVAL_S = 1.0  # consume.c COMMIT_INTERVAL_MS
KILL_GRACE_S = 1.0


def offsets_by_key(bootstrap, topic):
    """{idempotency key: (partition, offset)} of every record in the topic."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "t-" + uuid.uuid4().hex,
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    found, deadline = {}, time.time() + 60
    try:
        while len(found) < RECORDS and time.time() < deadline:
            for m in c.consume(500, 0.5):
                if m.error():
                    continue
                key = dict(m.headers())["idempotency-key"].decode()
                found[key] = (m.partition(), m.offset())
    finally:
        c.close()
    assert len(found) == RECORDS, f"read {len(found)} of {RECORDS} records back from {topic}"
    return found


def committed(bootstrap, topic):
    """The group's committed offset per partition (0 where none yet)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
    finally:
        c.close()
    return {tp.partition: max(tp.offset, 0) for tp in got}


def assignments(worker):
    return worker.output().count("event=assigned")


def test_members_joining_and_leaving_lose_nothing_and_duplicate_only_a_kill9s_uncommitted(
        tmp_path, kafka_bootstrap, unique):
    topic = f"rb.{unique}"
    d = Destination(tmp_path)
    d.behave(delay_ms=LATENCY_MS)
    started = []

    def start():
        w = Worker(tmp_path, "consume", kafka_bootstrap=kafka_bootstrap)
        started.append(w)
        return w

    def delivered():
        return len(d.requests())

    def settled(members, before, more):
        """Every member was assigned again since before, then `more` requests arrived."""
        wait_until(lambda: all(assignments(w) > n for w, n in zip(members, before)), 60,
                   what="the group to rebalance")
        target = delivered() + more
        wait_until(lambda: delivered() >= target, 60, what=f"{more} more requests")

    try:
        with connect() as conn:
            make_topic(conn, topic, partitions=PARTITIONS)
            add_destination(conn, f"rb-{unique}", d.url, [topic], max_in_flight=MAX_IN_FLIGHT)
            keys = [f"k{i}" for i in range(RECORDS)]
            conn.execute("SELECT wal_enqueue_batch(%s, array_agg(jsonb_build_object('i', i)),"
                         " array_agg('k' || i)) FROM generate_series(0, %s - 1) i", (topic, RECORDS))
            wait_all_stored(conn, topic, RECORDS)
            wait_published(conn)
        where = offsets_by_key(kafka_bootstrap, topic)

        steps = []  # (name, time it began)
        a, b = start(), start()
        steps.append(("two members start", time.time()))
        wait_until(lambda: delivered() >= 800, 60, what="the first deliveries")

        before = [assignments(a), assignments(b)]
        steps.append(("a third joins", time.time()))
        c = start()
        settled([a, b, c], [*before, 0], 800)

        before = [assignments(a), assignments(c)]
        at_kill = committed(kafka_bootstrap, topic)
        steps.append(("kill -9 of one", time.time()))
        b.stop(signal.SIGKILL)
        settled([a, c], before, 800)

        steps.append(("SIGTERM of another", time.time()))
        assert len({record_key(r) for r in d.requests()}) < RECORDS, \
            "the backlog ran out before the SIGTERM: nothing was in flight"
        assert c.stop(signal.SIGTERM) == 0, c.output()[-2000:]
        wait_until(lambda: {record_key(r) for r in d.requests()} >= set(keys), 120,
                   what="every record delivered")
        wait_group_caught_up(kafka_bootstrap, GROUP, topic)
        time.sleep(1)  # a late duplicate would arrive here

        requests = sorted(d.requests(), key=lambda r: r["arrived_at"])
        first_seen, dups = {}, []
        for r in requests:
            k = record_key(r)
            if k in first_seen:
                dups.append(k)
            else:
                first_seen[k] = r["arrived_at"]
        assert set(first_seen) == set(keys)
        # A kill -9 may send again what the killed member had sent before it died and not
        # committed yet: what was in flight, and what was done since its last commit (once
        # a second). Its new owner may reach them late (after what it had prefetched), so
        # they are told apart by offset, not by when they arrive.
        # The destination stamps a request when its thread gets to it: one the killed
        # member sent just before it died may be stamped a little after.
        kill_t = dict(steps)["kill -9 of one"] + KILL_GRACE_S
        from_kill = [k for k in dups
                     if first_seen[k] < kill_t and where[k][1] >= at_kill[where[k][0]]]
        other = sorted(set(dups) - set(from_kill))
        report(f"rebalance, {RECORDS} records, {PARTITIONS} partitions, {LATENCY_MS} ms answers, "
               f"max_in_flight {MAX_IN_FLIGHT}, steps {[name for name, _ in steps]}: "
               f"{len(dups)} duplicates, {len(from_kill)} of them uncommitted at the kill -9")
        print(f"duplicates: {len(dups)}; uncommitted at the kill -9: {len(from_kill)}; other: {len(other)}")
        examples = [(k, where[k], at_kill[where[k][0]], round(first_seen[k] - kill_t, 3))
                    for k in other[:5]]
        assert other == [], (f"{len(other)} records were sent twice that the kill -9 does not explain,"
                             " e.g. (key, (partition, offset), committed before the kill,"
                             f" first seen - kill): {examples}")
        # A revoke took back what was not sent and waited only for what was under way.
        for w in started:
            assert "event=revoke_drain_timeout" not in w.output()
        assert any(re.search(r"event=revoke_draining .*withdrawn=[1-9]", w.output()) for w in started)
        per_member = MAX_IN_FLIGHT * 1000 / LATENCY_MS  # records/s one member can deliver
        bound = MAX_IN_FLIGHT + per_member * COMMIT_INTERVAL_S * 2  # x2: a late commit
        assert len(from_kill) <= bound
    finally:
        for w in started:
            w.stop(signal.SIGKILL, timeout=5)
        d.stop()


RETRY_GROUP = "wal_delivery.retry"
RETRY_DESTINATIONS = 6  # each owns one partition of each retry step: 6 to share out
RETRY_RECORDS = 1000
RETRY_LATENCY_MS = 100  # six destinations at once: slower, so the backlog lasts


def test_retry_consumers_joining_and_leaving_lose_nothing_and_duplicate_only_at_a_kill9(
        tmp_path, kafka_bootstrap, unique):
    """Copies parked in retry step 1 for six destinations, then retry consumers join and
    leave while the copies are due. Every copy reaches its destination; a copy is attempted
    twice only across the kill -9 (its first attempt before it, the second after)."""
    topic = f"rbr.{unique}"
    d = Destination(tmp_path)
    d.behave(status=503)
    started = []

    def start(role, *args):
        w = Worker(tmp_path, role, "--time-scale", "10", *args, kafka_bootstrap=kafka_bootstrap)
        started.append(w)
        return w

    try:
        with connect() as conn:
            make_topic(conn, topic, partitions=PARTITIONS)
            for i in range(RETRY_DESTINATIONS):
                # 5 s at scale 1: due half a second after the hand-off; never paused.
                add_destination(conn, f"rbr{i}-{unique}", f"{d.url}/d{i}", [topic],
                                max_in_flight=MAX_IN_FLIGHT, pause_after_failures=1000000,
                                retry_delays="{5 seconds,5 seconds,5 seconds}")
            keys = [f"k{i}" for i in range(RETRY_RECORDS)]
            conn.execute("SELECT wal_enqueue_batch(%s, array_agg(jsonb_build_object('i', i)),"
                         " array_agg('k' || i)) FROM generate_series(0, %s - 1) i",
                         (topic, RETRY_RECORDS))
            wait_all_stored(conn, topic, RETRY_RECORDS)
            wait_published(conn)
        # Every copy fails once at the main consumer and is parked in step 1.
        consume = start("consume")
        wait_group_caught_up(kafka_bootstrap, GROUP, topic, timeout=120)
        assert consume.stop(signal.SIGTERM) == 0
        d.behave(status=200, delay_ms=RETRY_LATENCY_MS)
        healed = time.time()

        def answered():
            return [r for r in d.requests() if r["arrived_at"] >= healed]

        def settled(members, before, more):
            wait_until(lambda: all(assignments(w) > n for w, n in zip(members, before)), 60,
                       what="the group to rebalance")
            target = len(answered()) + more
            wait_until(lambda: len(answered()) >= target, 60, what=f"{more} more attempts")

        steps = []
        a, b = start("retry"), start("retry")
        steps.append(("two members start", time.time()))
        wait_until(lambda: len(answered()) >= 300, 60, what="the first attempts")
        before = [assignments(a), assignments(b)]
        steps.append(("a third joins", time.time()))
        c = start("retry")
        settled([a, b, c], [*before, 0], 300)
        before = [assignments(a), assignments(c)]
        steps.append(("kill -9 of one", time.time()))
        b.stop(signal.SIGKILL)
        settled([a, c], before, 300)
        steps.append(("SIGTERM of another", time.time()))
        total = RETRY_RECORDS * RETRY_DESTINATIONS
        assert len({(r["path"], record_key(r)) for r in answered()}) < total, \
            "every copy was delivered before the SIGTERM: nothing was in flight"
        assert c.stop(signal.SIGTERM) == 0, c.output()[-2000:]
        want = {(f"/d{i}", k) for i in range(RETRY_DESTINATIONS) for k in keys}
        wait_until(lambda: {(r["path"], record_key(r)) for r in answered()} >= want, 120,
                   what="every copy delivered from step 1")
        time.sleep(2)  # a late duplicate would arrive here

        first_seen, from_kill, other = {}, [], []
        kill_t = dict(steps)["kill -9 of one"] + KILL_GRACE_S  # as above
        for r in sorted(answered(), key=lambda r: r["arrived_at"]):
            copy = (r["path"], record_key(r))
            if copy not in first_seen:
                first_seen[copy] = r["arrived_at"]
            elif first_seen[copy] < kill_t <= r["arrived_at"]:
                from_kill.append(copy)
            else:
                other.append(copy)
        report(f"retry rebalance, {total} copies in step 1 for {RETRY_DESTINATIONS} destinations,"
               f" {RETRY_LATENCY_MS} ms answers: {len(from_kill) + len(other)} attempted twice,"
               f" {len(from_kill)} of them across the kill -9")
        print(f"attempted twice: {len(from_kill) + len(other)}; across the kill -9: {len(from_kill)};"
              f" other: {len(other)}")
        assert set(first_seen) == want
        assert other == [], f"{len(other)} copies attempted twice without a kill, e.g. {other[:5]}"
        per_member = MAX_IN_FLIGHT * 1000 / RETRY_LATENCY_MS * RETRY_DESTINATIONS
        assert len(from_kill) <= MAX_IN_FLIGHT * RETRY_DESTINATIONS + per_member * COMMIT_INTERVAL_S * 2
    finally:
        for w in started:
            w.stop(signal.SIGKILL, timeout=5)
        d.stop()
