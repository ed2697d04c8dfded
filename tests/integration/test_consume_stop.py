"""A `consume` worker told to stop keeps its promise of a bounded stop whatever is down:
with copies failing, their hand-offs waiting for a stopped Kafka and Postgres stopped
too, SIGTERM ends the process within the stop allowance (docs/operations.md, `stopping`:
in-flight work gets at most 15 s), and nothing is lost: the copies whose hand-off never
finished were not committed, so the next worker delivers them once Kafka is back."""
import os
import signal
import time

import pytest

from conftest import Destination, connect, env_cmd, record_key
from consumer_helpers import Worker, add_destination, reset_destinations, wait_published
from relay_helpers import make_topic, wait_all_stored, wait_until

STOP_ALLOWANCE_S = 15
# The revoke's own drain (at most 10 s) may come on top when closing the consumer
# brings a last revoke; both fit in the unit's TimeoutStopSec=30s.
MARGIN_S = 12


@pytest.mark.parametrize("behaviour", [
    {"status": 503, "delay_ms": 3000},  # every copy fails, late: hand-offs wait for Kafka
    {"hang": True},                     # no answer at all: the requests stay in flight
], ids=["handoffs-pending", "requests-hanging"])
def test_sigterm_with_kafka_and_postgres_down_exits_in_bounds_and_loses_nothing(
        tmp_path, kafka_bootstrap, unique, behaviour):
    topic = f"c.stop.{unique}"
    keys = [f"s{i}" for i in range(40)]
    brokers = range(1, int(os.environ.get("KAFKA_BROKERS", "1")) + 1)
    dest = Destination(tmp_path)
    dest.behave(**behaviour)
    kafka_down = pg_down = False
    worker = None
    try:
        reset_destinations()
        with connect() as conn:
            make_topic(conn, topic, partitions=3)
            add_destination(conn, f"d-{unique}", dest.url, [topic], max_in_flight=64)
            conn.execute("SELECT wal_enqueue_batch(%s, %s::text[], %s)", (topic, keys, keys))
            wait_all_stored(conn, topic, len(keys))
            wait_published(conn)
        worker = Worker(tmp_path, "consume", kafka_bootstrap=kafka_bootstrap)
        dest.wait_for(len(keys), timeout=60)  # every copy is in flight, answered 503 soon
        for n in brokers:
            env_cmd("kafka-stop", str(n))
        kafka_down = True
        env_cmd("pg-stop")
        pg_down = True
        if "status" in behaviour:
            wait_until(lambda: (worker.metric("wal_handoffs_pending") or 0) >= 1, 30,
                       what="hand-offs waiting for the stopped broker")

        started = time.monotonic()
        worker.proc.send_signal(signal.SIGTERM)
        try:
            worker.proc.wait(STOP_ALLOWANCE_S + MARGIN_S)
        except Exception:
            raise AssertionError("consume did not stop within %d s with Kafka and Postgres"
                                 " down; log tail:\n%s"
                                 % (STOP_ALLOWANCE_S + MARGIN_S, worker.output()[-3000:]))
        took = time.monotonic() - started
        assert worker.proc.returncode == 0, worker.output()[-3000:]
        assert took <= STOP_ALLOWANCE_S + MARGIN_S
        print(f"stopped in {took:.1f} s")

        env_cmd("pg-start")
        pg_down = False
        for n in brokers:
            env_cmd("kafka-start", str(n))
        kafka_down = False
        dest.control("reset", {})
        worker.stop()
        worker = Worker(tmp_path, "consume", kafka_bootstrap=kafka_bootstrap)
        wait_until(lambda: {record_key(r) for r in dest.requests() if r.get("status") == 200}
                   >= set(keys), 90, what="every record delivered by the next worker")
    finally:
        if pg_down:
            env_cmd("pg-start", check=False)
        if kafka_down:
            for n in brokers:
                env_cmd("kafka-start", str(n), check=False)
        if worker:
            worker.stop(signal.SIGKILL if worker.proc.poll() is None else signal.SIGTERM, timeout=5)
        dest.stop()
