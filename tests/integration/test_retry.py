"""`wal-worker retry` with real Kafka and real HTTP destinations at time scale 10: each
message walks steps 1 -> 2 -> 3 -> DLQ with its delays counted from entry into each step
and inside their jitter; exactly pause_after_failures consecutive failures pause a
destination everywhere; while paused it gets only the probes; a probe's answer resumes it
with a ramp-up; a healthy destination on the same topic is not slowed down; bad retry
messages go to the DLQ with a reason and never stall their partition."""
import json
import statistics
import time
import uuid

import pytest
from confluent_kafka import Producer

from conftest import Destination, connect
from consumer_helpers import add_destination, reset_destinations, wait_published
from relay_helpers import ensure_extension, make_topic, report, wait_all_stored, wait_until
from retry_helpers import (TIME_SCALE, Fleet, attempt_of, by_key, dead_letters, destination_status,
                           wait_breaker)


@pytest.fixture(autouse=True)
def clean():
    ensure_extension()
    reset_destinations()
    yield
    reset_destinations()


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
    delays = [10, 20, 30]  # seconds at scale 1: 1 s, 2 s, 3 s at scale 10
    try:
        with connect() as conn:
            make_topic(conn, topic)
            add_destination(conn, name, down.url + "/in", [topic],
                            retry_delays="{10 seconds,20 seconds,30 seconds}", retry_jitter=0.2)
            wait_published(conn)
        workers = [fleet.start("consume"), fleet.start("retry"), fleet.start("dlq")]
        for w in workers:
            w.wait_ready()
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
