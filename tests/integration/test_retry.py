"""`wal-worker retry` with real Kafka and real HTTP destinations at time scale 10: each
message walks steps 1 -> 2 -> 3 -> DLQ with its delays counted from entry into each step
and inside their jitter; exactly pause_after_failures consecutive failures pause a
destination everywhere; while paused it gets only the probes; a probe's answer resumes it
with a ramp-up; a healthy destination on the same topic is not slowed down; bad retry
messages go to the DLQ with a reason and never stall their partition."""
import json
import signal
import statistics
import threading
import time

import pytest
from confluent_kafka import Producer

from conftest import Destination, connect, record_key
from consumer_helpers import add_destination, wait_group_caught_up, wait_published
from relay_helpers import make_topic, report, wait_all_stored, wait_until
from retry_helpers import (TIME_SCALE, Fleet, attempt_of, by_key, dead_letters, destination_status,
                           wait_breaker)


pytestmark = pytest.mark.usefixtures("clean_destinations")


@pytest.fixture
def fleet(tmp_path, kafka_bootstrap):
    f = Fleet(tmp_path, kafka_bootstrap)
    yield f
    f.stop_all()


def enqueue(conn, topic, keys):
    conn.execute("SELECT wal_enqueue_batch(%s, %s::jsonb[], %s)",
                 (topic, [json.dumps({"k": k}) for k in keys], keys))


def test_a_down_destination_walks_every_step_then_the_dlq_on_time(tmp_path, fleet, unique):
    topic, name = f"r.steps.{unique}", f"down-{unique}"
    down = Destination(tmp_path)
    down.behave(status=503)
    # Seconds at scale 1: 3, 4 and 5 s at scale 10. Longer than a loaded machine's fetch
    # latency (a retry message reached its lane 1.3 s after its hand-off at a load of 25):
    # with 1 s, every message was already overdue on arrival and went out at once, so the
    # gaps showed the fetch latency, not the schedule and its jitter.
    delays = [30, 40, 50]
    try:
        with connect() as conn:
            make_topic(conn, topic)
            add_destination(conn, name, down.url + "/in", [topic],
                            retry_delays="{30 seconds,40 seconds,50 seconds}", retry_jitter=0.2)
            wait_published(conn)
        workers = fleet.start_ready("consume", "retry", "dlq")
        dlq = workers[2]
        keys = [f"s{i}-{unique}" for i in range(10)]
        with connect() as conn:
            enqueue(conn, topic, keys)
            wait_all_stored(conn, topic, len(keys))
        wait_until(lambda: len(dead_letters(name)) == len(keys), 60,
                   what="every record in dead_letters after step 3")

        seen = by_key(down.requests("/in"))
        gaps = {1: [], 2: [], 3: []}
        for key in keys:
            attempts = seen[key]
            assert [attempt_of(r) for r in attempts] == [1, 2, 3, 4], \
                f"{key}: one attempt from the main consumer and one per step, got {attempts}"
            for step in (1, 2, 3):
                gap = attempts[step]["arrived_at"] - attempts[step - 1]["arrived_at"]
                gaps[step].append(gap)
                low, high = delays[step - 1] / TIME_SCALE, delays[step - 1] * 1.2 / TIME_SCALE
                # Entry into a step follows the failed attempt by the hand-off's ack; allow
                # that and the worker's scheduling granularity above the jitter bound.
                assert low - 0.05 <= gap <= high + 0.3, \
                    f"{key} step {step}: {gap:.3f}s, want {low:.2f}..{high:.2f}s + hand-off"
        for step in (1, 2, 3):
            # The jitter is drawn per message: they do not all wake at the same moment.
            assert statistics.pstdev(gaps[step]) > 0.01, f"step {step} gaps {gaps[step]}"
        for key, error, attempts, _, _ in dead_letters(name):
            assert error == "HTTP 503" and attempts == 4
        report(f"retry steps at scale {TIME_SCALE}: gaps step1 {min(gaps[1]):.2f}-{max(gaps[1]):.2f}s"
               f" step2 {min(gaps[2]):.2f}-{max(gaps[2]):.2f}s step3 {min(gaps[3]):.2f}-{max(gaps[3]):.2f}s")
        assert dlq.metric("wal_dead_letters_ingested_total") >= len(keys)
    finally:
        down.stop()


def enqueue_one_by_one(topic, keys, pause=0.05):
    """Commits each record on its own; returns {key: commit time}."""
    committed = {}
    with connect() as conn:
        conn.autocommit = True
        for k in keys:
            conn.execute("SELECT wal_enqueue(%s, %s::jsonb, %s)", (topic, json.dumps({"k": k}), k))
            committed[k] = time.time()
            time.sleep(pause)
    return committed


def latencies(dest, committed):
    first = {}
    for r in dest.requests():
        k = record_key(r)
        if k in committed:
            first[k] = min(first.get(k, r["arrived_at"]), r["arrived_at"])
    assert set(first) == set(committed), "every record reached the healthy destination"
    return sorted(first[k] - committed[k] for k in committed)


def p95(values):
    return values[int(len(values) * 0.95) - 1]


def test_twenty_failures_pause_everywhere_probes_only_then_ramped_recovery(tmp_path, fleet, unique):
    topic, x, h = f"r.pause.{unique}", f"x-{unique}", f"h-{unique}"
    down, healthy = Destination(tmp_path), Destination(tmp_path)
    down.behave(status=503)
    probe_every = 120 / TIME_SCALE
    try:
        with connect() as conn:
            make_topic(conn, topic, partitions=2)
            add_destination(conn, x, down.url + "/x", [topic])  # defaults: 20 failures, 2 min probe
            add_destination(conn, h, healthy.url + "/h", [topic])
            wait_published(conn)
        started = fleet.start_ready("consume", "consume", "retry", "retry", "dlq")
        consumers = started[:2]

        # Before the pause: 30 records; the main consumers fail them all into step 1.
        before = enqueue_one_by_one(topic, [f"a{i}-{unique}" for i in range(30)])
        status = wait_breaker(x, "open", timeout=30)
        paused_at = status["since"].timestamp()
        time.sleep(1)  # absence window from the pause: a request in flight at it would land now
        step1_attempts = [r for r in down.requests("/x") if attempt_of(r) == 2]
        assert len(step1_attempts) == 20, \
            f"exactly 20 consecutive failures at step 1 open the pause, saw {len(step1_attempts)}"
        assert status["paused_step"] == 1
        wait_until(lambda: destination_status(x)["consecutive_failures"][0] == 20, 10,
                   what="the operator view to show the 20 consecutive failures at step 1")

        # While paused: new records flow to the healthy destination; X gets only probes.
        during = enqueue_one_by_one(topic, [f"b{i}-{unique}" for i in range(60)])
        wait_until(lambda: destination_status(x)["probes"] >= 2, 3 * probe_every,
                   what="two probes while X is down")
        after_pause = [r for r in down.requests("/x") if r["arrived_at"] > paused_at + 0.5]
        probes = destination_status(x)["probes"]
        assert len(after_pause) == probes, \
            f"only the probes reach a paused destination: {len(after_pause)} requests, {probes} probes"
        times = sorted(r["arrived_at"] for r in after_pause)
        assert times[0] - paused_at >= probe_every * 0.95
        assert all(b - a >= probe_every * 0.95 for a, b in zip(times, times[1:])), times
        assert not [r for r in after_pause if attempt_of(r) == 1], "no main-consumer attempt"
        assert sum(c.metric("wal_breaker_open_handoffs_total", destination=x) for c in consumers) >= 50
        base, paused = latencies(healthy, before), latencies(healthy, during)
        assert p95(paused) <= max(2 * p95(base), p95(base) + 0.25), (p95(base), p95(paused))
        report(f"pause: 20 step-1 failures opened it; {probes} probes {probe_every:.0f}s apart while"
               f" down; healthy p95 {p95(base)*1000:.0f} ms before, {p95(paused)*1000:.0f} ms during")

        # Recovery: the next probe succeeds, everything resumes, the backlog ramps up.
        down.behave(status=200, delay_ms=100)
        wait_breaker(x, "closed", timeout=probe_every + 10)
        keys = set(before) | set(during)
        wait_until(lambda: keys <= {record_key(r) for r in down.requests("/x")
                                    if r["arrived_at"] > paused_at and attempt_of(r) > 1
                                    and r["arrived_at"] >= times[-1]}, 60,
                   what="every queued copy delivered after the recovery")
        ok = sorted(r["arrived_at"] for r in down.requests("/x") if r["arrived_at"] > times[-1] + 0.01)
        start = ok[0]
        buckets = [sum(1 for t in ok if start + i * 0.5 <= t < start + (i + 1) * 0.5) for i in range(6)]
        assert buckets[0] <= 2 * 5 + 2, f"starts at one request in flight per process: {buckets}"
        assert max(buckets[1:]) >= 2 * buckets[0], f"the rate ramps up: {buckets}"
        report(f"recovery: arrivals per 0.5 s after the probe succeeded {buckets}")
        assert destination_status(x)["breaker"] == "closed"
        assert dead_letters(x) == [], "no copy went to the DLQ"
    finally:
        down.stop()
        healthy.stop()


def test_a_permanent_probe_answer_sends_that_message_to_the_dlq_and_resumes(tmp_path, fleet, unique):
    topic, x = f"r.perm.{unique}", f"p-{unique}"
    down = Destination(tmp_path)
    down.behave(status=503)
    try:
        with connect() as conn:
            make_topic(conn, topic)
            add_destination(conn, x, down.url + "/p", [topic], pause_after_failures=3,
                            probe_interval="20 seconds")
            wait_published(conn)
        fleet.start_ready("consume", "retry", "dlq")
        keys = [f"p{i}-{unique}" for i in range(8)]
        with connect() as conn:
            enqueue(conn, topic, keys)
        wait_breaker(x, "open", timeout=30)
        down.behave(status=200)
        down.behave(status=400, times=1)  # the probe's answer; everything after it is 200
        wait_breaker(x, "closed", timeout=30)
        wait_until(lambda: len(dead_letters(x)) == 1, 30, what="the probed message in dead_letters")
        (dead_key, error, _, _, _), = dead_letters(x)
        assert error == "HTTP 400"
        wait_until(lambda: set(keys) - {dead_key} <= {
            record_key(r) for r in down.requests("/p") if attempt_of(r) > 1}, 30,
            what="every other message delivered after the resume")
        assert destination_status(x)["last_probe_outcome"] == "permanent"
    finally:
        down.stop()


def test_dead_letters_alert_once_replay_to_their_destination_and_resolve(tmp_path, fleet, unique):
    topic, x = f"r.replay.{unique}", f"rp-{unique}"
    dest, alerts = Destination(tmp_path), Destination(tmp_path)
    dest.behave(status=422)
    try:
        with connect() as conn:
            make_topic(conn, topic)
            add_destination(conn, x, dest.url + "/d", [topic])
            conn.execute("UPDATE wal_delivery.settings SET dlq_alert_url = %s", (alerts.url + "/alert",))
            wait_published(conn)
        workers = fleet.start_ready("consume", "retry", "dlq")
        keys = [f"d{i}-{unique}" for i in range(5)]
        with connect() as conn:
            enqueue(conn, topic, keys)
        wait_until(lambda: len(dead_letters(x)) == 5, 30, what="five permanent failures dead")
        # A dead letter the database wrote itself (a processing row out of attempts).
        with connect() as conn:
            conn.execute("INSERT INTO wal_delivery.dead_letters (origin, topic, idempotency_key,"
                         " payload, attempts, last_error) VALUES ('processing', %s, %s, 'x', 5,"
                         " 'processor failed')", (topic, f"proc-{unique}"))

        def mine():
            alerted = [json.loads(r["body"]) for r in alerts.requests("/alert")]
            return sorted(a["idempotency_key"] for a in alerted
                          if a.get("idempotency_key", "").endswith(unique))

        wait_until(lambda: len(mine()) >= 6, 30, what="six alerts")
        assert mine() == sorted(keys + [f"proc-{unique}"]), "one alert per dead letter"

        # dlq worker restart: nothing alerted or ingested twice.
        workers[2].stop()
        dlq = fleet.start("dlq")
        dlq.wait_ready()
        # The new worker is done with everything it could take again: it has committed the
        # whole DLQ topic, and no entry waits for its alert.
        with connect() as conn:
            dlq_topic = conn.execute("SELECT dlq_topic FROM wal_delivery.settings").fetchone()[0]
            wait_group_caught_up(fleet.bootstrap, "wal_delivery.dlq", dlq_topic)
            wait_until(lambda: conn.execute("SELECT count(*) FROM wal_delivery.dead_letters"
                                            " WHERE idempotency_key LIKE %s AND alerted_at IS NULL",
                                            (f"%{unique}",)).fetchone()[0] == 0, 30,
                       what="no dead letter waiting for its alert")
        assert len(mine()) == 6, "a restart alerts nothing twice"
        assert len(dead_letters(x)) == 5

        # Replay one and a filtered set to the destination, now healthy.
        dest.behave(status=200)
        first = dead_letters(x)[0]
        with connect() as conn:
            assert "retry step 1" in conn.execute("SELECT wal_delivery.replay_dead_letter(%s)",
                                                  (first[3],)).fetchone()[0]
            assert conn.execute("SELECT wal_delivery.replay_dead_letters(p_destination => %s)",
                                (x,)).fetchone()[0] == 4
        wait_until(lambda: all(r[4] is not None for r in dead_letters(x)), 30,
                   what="every replayed entry resolved after its write to step 1")
        wait_until(lambda: set(keys) <= {record_key(r) for r in dest.requests("/d")
                                         if attempt_of(r) >= 2}, 30,
                   what="every replayed entry delivered through retry step 1")
        with connect() as conn:
            resolutions = {r[0] for r in conn.execute(
                "SELECT resolution FROM wal_delivery.dead_letters WHERE destination = %s", (x,))}
            assert resolutions == {"replayed through retry step 1"}
            conn.execute("SELECT wal_delivery.resolve_dead_letter(id, 'fixed the processor')"
                         " FROM wal_delivery.dead_letters WHERE idempotency_key = %s", (f"proc-{unique}",))
            row = conn.execute("SELECT resolution FROM wal_delivery.dead_letters"
                               " WHERE idempotency_key = %s", (f"proc-{unique}",)).fetchone()
            assert row == ("fixed the processor",)
        assert dlq.metric("wal_dead_letters_replayed_total") == 5
    finally:
        with connect() as conn:
            conn.execute("UPDATE wal_delivery.settings SET dlq_alert_url = NULL")
        dest.stop()
        alerts.stop()


def test_bad_retry_messages_go_to_the_dlq_with_a_reason_and_never_stall(tmp_path, fleet, unique,
                                                                       kafka_bootstrap):
    topic, x = f"r.bad.{unique}", f"bad-{unique}"
    dest = Destination(tmp_path)
    try:
        with connect() as conn:
            make_topic(conn, topic)
            add_destination(conn, x, dest.url + "/b", [topic])
            wait_published(conn)
            partition = conn.execute("SELECT retry_partition FROM wal_delivery.destinations"
                                     " WHERE name = %s", (x,)).fetchone()[0]
        fleet.start_ready("retry", "dlq")
        now_ms = int(time.time() * 1000)
        good = [("idempotency-key", f"good-{unique}"), ("destination", x),
                ("source-topic", topic), ("step-entered-at", str(now_ms - 60000))]
        cases = {
            f"noheaders-{unique}": None,
            f"garbled-{unique}": [("destination", x), ("step-entered-at", "yesterday")],
            f"unknown-{unique}": [("destination", f"nobody-{unique}"), ("step-entered-at", str(now_ms))],
            f"future-{unique}": [("destination", x), ("step-entered-at", str(now_ms + 10 ** 9))],
        }
        p = Producer({"bootstrap.servers": kafka_bootstrap})
        for key, headers in cases.items():
            hs = None if headers is None else [("idempotency-key", key), ("source-topic", topic), *headers]
            p.produce("wal_delivery.retry.1", key=key, value=b'{"bad": true}', partition=partition,
                      headers=hs)
        p.produce("wal_delivery.retry.1", key="good", value=b'{"good": true}', partition=partition,
                  headers=good)
        p.flush(10)
        got = dest.wait_for(2, "/b", timeout=30)
        arrived = {record_key(r) for r in got}
        assert {f"good-{unique}", f"future-{unique}"} <= arrived, \
            "a message behind bad ones is delivered; a clock jump does not strand one"
        def errors():
            with connect() as conn:
                return {r[0]: r[1] for r in conn.execute(
                    "SELECT idempotency_key, last_error FROM wal_delivery.dead_letters"
                    " WHERE idempotency_key LIKE %s OR (last_error = 'missing header destination'"
                    " AND failed_at >= to_timestamp(%s))", (f"%{unique}", now_ms / 1000 - 1))}

        wait_until(lambda: len(errors()) >= 3, 30, what="the three bad messages in dead_letters")
        errors = errors()
        assert "missing header destination" in errors.values()
        assert errors[f"garbled-{unique}"] == "missing or garbled header step-entered-at"
        assert errors[f"unknown-{unique}"] == f'destination "nobody-{unique}" no longer exists'
        retry = fleet.workers[0]
        assert retry.metric("wal_retry_bad_messages_total") >= 3
        assert "event=clock_jump" in retry.output()
        assert retry.proc.poll() is None
    finally:
        dest.stop()


def test_tally_mixed_outage_permanent_errors_and_worker_kills(tmp_path, fleet, unique):
    """Every record reaches every destination at least once or is in dead_letters with a
    reason, through a flaky destination, an outage with a pause and recovery, permanent
    errors and kill -9 of a retry worker and a main consumer."""
    topic = f"r.tally.{unique}"
    flaky, outage, steady = Destination(tmp_path), Destination(tmp_path), Destination(tmp_path)
    names = {f"flaky-{unique}": flaky, f"outage-{unique}": outage, f"steady-{unique}": steady}
    flaky.behave(status=503, ratio=0.3)
    flaky.behave(status=400, ratio=0.05)
    outage.behave(status=503)
    fast = {"retry_delays": "{10 seconds,30 seconds,60 seconds}", "probe_interval": "30 seconds"}
    try:
        with connect() as conn:
            make_topic(conn, topic, partitions=2)
            for name, dest in names.items():
                add_destination(conn, name, dest.url + "/t", [topic], **fast)
            wait_published(conn)
        started = fleet.start_ready("consume", "consume", "retry", "retry", "dlq")
        consumers, retries = started[:2], started[2:4]

        keys = [f"t{i}-{unique}" for i in range(300)]
        load = threading.Thread(
            target=enqueue_one_by_one, args=(topic, keys), kwargs={"pause": 0.02})
        load.start()
        # kill -9 a retry worker once the retry steps are at work on this topic,
        wait_until(lambda: any(attempt_of(r) >= 2 for d in (flaky, outage) for r in d.requests("/t")),
                   60, what="retry attempts under way")
        retries[0].stop(signal.SIGKILL)
        retries.append(fleet.start("retry"))
        # and a main consumer halfway through the load.
        wait_until(lambda: len(steady.requests("/t")) >= len(keys) // 2, 60,
                   what="half the records at the steady destination")
        consumers[0].stop(signal.SIGKILL)
        consumers.append(fleet.start("consume"))
        load.join()
        wait_breaker(f"outage-{unique}", "open", timeout=30)
        time.sleep(3)  # the fault window: the outage goes on 3 s into the pause
        outage.behave(status=200)  # the outage ends; the next probe resumes it

        def missing():
            with connect() as conn:
                dead = {(r[0], r[1]): r[2] for r in conn.execute(
                    "SELECT idempotency_key, destination, last_error FROM wal_delivery.dead_letters"
                    " WHERE destination = ANY(%s)", (list(names),))}
            gone = []
            for name, dest in names.items():
                ok = {record_key(r) for r in dest.requests("/t")
                      if 200 <= r.get("status", 0) < 300}
                gone += [(k, name) for k in keys if k not in ok and (k, name) not in dead]
            return gone, dead

        wait_until(lambda: not missing()[0], 150,
                   what=f"every copy delivered or dead (missing {len(missing()[0])})")
        _, dead = missing()
        assert all(reason for reason in dead.values()), "every dead letter has a reason"
        dups = {}
        for name, dest in names.items():
            seen = {}
            for r in dest.requests("/t"):
                if 200 <= r.get("status", 0) < 300:
                    k = record_key(r)
                    seen[k] = seen.get(k, 0) + 1
            dups[name.split("-")[0]] = sum(v - 1 for v in seen.values())
        report(f"retry tally: 300 records x 3 destinations, kill -9 of a retry worker and a consumer:"
               f" 0 lost, {len(dead)} in dead_letters with a reason, duplicates {dups}")
    finally:
        for d in names.values():
            d.stop()


def test_a_destination_deleted_with_queued_retries_sends_them_to_the_dlq(tmp_path, fleet, unique):
    topic, x = f"r.del.{unique}", f"del-{unique}"
    down = Destination(tmp_path)
    down.behave(status=503)
    try:
        with connect() as conn:
            make_topic(conn, topic)
            add_destination(conn, x, down.url + "/x", [topic],
                            retry_delays="{40 seconds,1 minute,5 minutes}")
            wait_published(conn)
        fleet.start_ready("consume", "retry", "dlq")
        keys = [f"q{i}-{unique}" for i in range(5)]
        with connect() as conn:
            enqueue(conn, topic, keys)
        down.wait_for(5, "/x")  # the main consumer's attempts: all five now wait in step 1
        with connect() as conn:
            conn.execute("SET wal_delivery.force_delete = on")
            conn.execute("DELETE FROM wal_delivery.destinations WHERE name = %s", (x,))
            wait_published(conn)
        wait_until(lambda: len(dead_letters(x)) == 5, 30, what="the queued retries in dead_letters")
        assert {r[1] for r in dead_letters(x)} == {f'destination "{x}" no longer exists'}
        assert sorted(r[0] for r in dead_letters(x)) == sorted(keys)
        assert len(down.requests("/x")) == 5, "no attempt after the deletion"
    finally:
        down.stop()


def test_a_retry_message_that_cannot_be_signed_is_a_dead_letter_never_sent_unsigned(
        tmp_path, fleet, unique, kafka_bootstrap):
    topic, x = f"r.unsigned.{unique}", f"signed-{unique}"
    dest = Destination(tmp_path)
    try:
        with connect() as conn:
            make_topic(conn, topic)
            add_destination(conn, x, dest.url + "/s", [topic])
            conn.execute("INSERT INTO wal_delivery.destination_secrets VALUES (%s, %s)",
                         (x, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"))
            wait_published(conn)
            partition = conn.execute("SELECT retry_partition FROM wal_delivery.destinations"
                                     " WHERE name = %s", (x,)).fetchone()[0]
        fleet.start_ready("retry", "dlq")
        entered = str(int(time.time() * 1000) - 60000)
        p = Producer({"bootstrap.servers": kafka_bootstrap})
        for key in (f"line\nbreak-{unique}", f"ok-{unique}"):
            p.produce("wal_delivery.retry.1", value=b"{}", partition=partition,
                      headers=[("idempotency-key", key), ("source-topic", topic), ("destination", x),
                               ("step-entered-at", entered)])
        p.flush(10)
        [ok] = dest.wait_for(1, "/s", timeout=30)
        assert record_key(ok) == f"ok-{unique}" and "webhook-signature" in ok["headers"]

        def reason():
            with connect() as conn:
                row = conn.execute("SELECT last_error FROM wal_delivery.dead_letters WHERE idempotency_key = %s",
                                   (f"line\nbreak-{unique}",)).fetchone()
            return row and row[0]
        wait_until(reason, 30, what="the unsignable message in dead_letters")
        assert "cannot sign" in reason()
        assert len(dest.requests("/s")) == 1, "an unsigned copy reached the destination"
    finally:
        dest.stop()
