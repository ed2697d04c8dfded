"""`wal-worker ingest` under faults, with a real broker and a real Postgres: all brokers
stopped mid-load (answers turn 202 within the deadline, nothing refused, everything in
Kafka once the brokers are back), Postgres down (the direct path goes on), both down
(503 with Retry-After, never a 2xx; 504 outcome_unknown while a copy may still land in
Kafka). Every record answered 2xx is counted in Kafka, and none answered 503 is there."""
import time
from pathlib import Path

import pytest

from conftest import connect, env_cmd
from ingest_helpers import Ingest, IngestLoad, send_record, setup_ingest, topics_with_token
from relay_helpers import read_topic, report, wait_until

DEADLINE_MS = 1000


@pytest.fixture
def ingest(tmp_path, kafka_bootstrap):
    with connect() as conn:
        setup_ingest(conn)
    worker = Ingest(tmp_path, kafka_bootstrap, deadline_ms=DEADLINE_MS)
    worker.wait_listening()
    yield worker
    worker.stop()


def outbox_unshipped(topic):
    with connect() as conn:
        return conn.execute("SELECT count(*) FROM wal_delivery.outbox WHERE topic = %s"
                            " AND state <> 'stored'", (topic,)).fetchone()[0]


def test_brokers_down_mid_load_fall_back_to_the_outbox_and_ship_later(ingest, kafka_bootstrap,
                                                                       unique):
    with connect() as conn:
        (topic,), token = topics_with_token(conn, unique)
    wait_until(lambda: send_record(ingest.port, topic, token)[0] == 201, 30, what="config")
    brokers = int(__import__("os").environ.get("KAFKA_BROKERS", "1"))
    with IngestLoad(ingest.port, topic, token, threads=4) as load:
        wait_until(lambda: load.count(201) >= 200, 60, what="201s before the outage")
        stopped_at = time.time()
        for n in range(1, brokers + 1):
            env_cmd("kafka-stop", str(n))
        # Broker shutdown takes a few seconds; from then on every answer is a quick 202.
        wait_until(lambda: sum(1 for a in load.answers if a[0] > stopped_at + 8) >= 200, 60,
                   what="answers while the brokers are down")
        during = [a for a in load.answers if a[0] > stopped_at + 8]
        for n in range(1, brokers + 1):
            env_cmd("kafka-start", str(n))
        wait_until(lambda: load.count(201) > 0 and load.answers[-1][3] == 201, 120,
                   what="201s again after the brokers are back")
        back = load.count(201)
        wait_until(lambda: load.count(201) >= back + 50, 60, what="the load going on after the brokers are back")
    statuses = {a[3] for a in load.answers}
    assert statuses <= {201, 202}, f"refused while Postgres was up: {statuses} {load.errors[:3]}"
    # Once Kafka is known down, an answer takes no longer than the deadline (plus the
    # outbox commit); the load never waits for a broker's timeout.
    slow = [a for a in during if a[1] > DEADLINE_MS / 1000 + 1.0]
    assert during and not slow, f"{len(slow)} of {len(during)} answers slower than the deadline"
    assert all(a[3] == 202 for a in during)

    acked = load.acknowledged()
    wait_until(lambda: outbox_unshipped(topic) == 0, 120, what="the relay to ship the outbox")
    seen = read_topic(kafka_bootstrap, topic, acked, timeout=120)
    missing = set(acked) - set(seen)
    dupes = sum(len(v) - 1 for v in seen.values())
    report(f"ingest brokers-down: {load.count(201)} answered 201, {load.count(202)} answered 202, "
           f"{len(missing)} missing in Kafka, {dupes} duplicates, "
           f"{ingest.metric('wal_ingest_late_kafka_acks_total'):.0f} late acks")
    assert not missing, f"{len(missing)} acknowledged records are not in Kafka: " + missing_detail(
        load, missing, topic, ingest)
    assert ingest.metric("wal_ingest_fallbacks_total", reason="kafka_down") > 0


def missing_detail(load, missing, topic, ingest):
    """What a failure needs to tell where a record went: its answer, its outbox row (if
    the outbox took it) and the ingest log lines that name it."""
    with connect() as conn:
        rows = dict(conn.execute("SELECT idempotency_key, state::text FROM wal_delivery.outbox"
                                 " WHERE topic = %s AND idempotency_key = ANY(%s)",
                                 (topic, list(missing))).fetchall())
    answers = {a[2]: a for a in load.answers if a[2] in missing}
    lines = [line for line in ingest.output().splitlines() if any(k in line for k in missing)]
    return "; ".join(f"{k}: answered {answers[k][3]} ({answers[k][4]}) after {answers[k][1]:.2f} s"
                     f" at {answers[k][0]:.3f}, outbox {rows.get(k, 'no row')}" for k in sorted(missing)) + (
        "\n" + "\n".join(lines[-20:]) if lines else "; no ingest log line names them")


def test_postgres_down_keeps_the_direct_path_and_both_down_answer_503(ingest, kafka_bootstrap,
                                                                      unique):
    with connect() as conn:
        (topic, proc), token = topics_with_token(conn, unique, processing=True)
    wait_until(lambda: send_record(ingest.port, topic, token)[0] == 201, 30, what="config")
    brokers = int(__import__("os").environ.get("KAFKA_BROKERS", "1"))
    acked = []
    env_cmd("pg-stop")
    try:
        for i in range(50):
            status, body, _ = send_record(ingest.port, topic, token, ikey=f"pgdown-{i}")
            assert status == 201, body
            acked.append(f"pgdown-{i}")
        # A topic that needs processing has only the outbox.
        status, body, headers = send_record(ingest.port, proc, token)
        assert status == 503 and body["error"] == "outbox_unavailable", body
        assert headers.get("Retry-After")
        assert ingest.get("/readyz")[0] == 200  # Kafka still works

        for n in range(1, brokers + 1):
            env_cmd("kafka-stop", str(n))
        try:
            answers = [send_record(ingest.port, topic, token, ikey=f"both-{i}") for i in range(30)]
            assert not [a for a in answers if a[0] in (201, 202)], "a 2xx with no durable path"
            # 503 when no copy can land; 504 outcome_unknown for a record produced before
            # the brokers were seen down, whose copy's fate librdkafka has not reported.
            assert all(a[0] in (503, 504) and a[2].get("Retry-After") for a in answers), answers[:3]
            assert all(a[1]["error"] == "outcome_unknown" for a in answers if a[0] == 504)
            assert answers[-1][1]["error"] == "kafka_and_outbox_unavailable"
            refused = [f"both-{i}" for i, a in enumerate(answers) if a[0] == 503]
            wait_until(lambda: ingest.get("/readyz")[0] == 503, 30, what="not ready")
        finally:
            for n in range(1, brokers + 1):
                env_cmd("kafka-start", str(n))
    finally:
        env_cmd("pg-start")
    wait_until(lambda: send_record(ingest.port, proc, token)[0] == 202, 60,
               what="the outbox back after Postgres restarts")
    wait_until(lambda: ingest.get("/readyz")[0] == 200, 60, what="ready again")
    seen = read_topic(kafka_bootstrap, topic, acked, timeout=90)
    assert not set(acked) - set(seen)
    assert not set(refused) & set(seen), "a record answered 503 is in Kafka"


def test_a_record_kafka_may_still_store_is_never_answered_refused(tmp_path, kafka_bootstrap, unique):
    """Postgres down and the brokers frozen (SIGSTOP: they hold the produce requests and
    answer them when thawed). A record whose deadline passes cannot go to the outbox, but
    its Kafka copy may still land: it is answered 504 outcome_unknown (with Retry-After),
    never 503. Every record answered 503 is absent from Kafka; every 201 is there."""
    import os
    import signal
    import threading

    with connect() as conn:
        setup_ingest(conn)
        (topic,), token = topics_with_token(conn, unique)
    worker = Ingest(tmp_path, kafka_bootstrap, deadline_ms=300)
    worker.wait_listening()
    try:
        wait_until(lambda: send_record(worker.port, topic, token)[0] == 201, 30, what="config")
        pids = [int((Path(os.environ["WAL_ENV_DIR"]) / "kafka" / f"n{n}.pid").read_text())
                for n in range(1, int(os.environ.get("KAFKA_BROKERS", "1")) + 1)]
        answers = {}

        def send(i):
            key = f"frozen-{i}"
            answers[key] = send_record(worker.port, topic, token, ikey=key)

        env_cmd("pg-stop")
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            threads = [threading.Thread(target=send, args=(i,)) for i in range(20)]
            for t in threads:
                t.start()
                time.sleep(0.05)
            time.sleep(2)
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        for t in threads:
            t.join(60)
        env_cmd("pg-start")
        statuses = {k: a[0] for k, a in answers.items()}
        report(f"answers with the brokers frozen and Postgres down: {sorted(statuses.values())}")
        assert set(statuses.values()) <= {201, 503, 504}, answers
        assert 504 in statuses.values(), "no record was in flight when its deadline passed"
        for key, (status, body, headers) in answers.items():
            if status == 504:
                assert body["error"] == "outcome_unknown" and headers.get("Retry-After"), body
        # Whatever Kafka stored shows up within librdkafka's message timeout (10 s here).
        marker = "after-" + unique
        wait_until(lambda: send_record(worker.port, topic, token, ikey=marker)[0] == 201, 60,
                   what="Kafka back")
        seen = read_topic(kafka_bootstrap, topic, [marker], timeout=60)
        refused_but_stored = [k for k, s in statuses.items() if s == 503 and k in seen]
        assert not refused_but_stored, f"answered 503, yet in Kafka: {refused_but_stored}"
        assert {k for k, s in statuses.items() if s == 201} <= set(seen)
    finally:
        worker.stop()
