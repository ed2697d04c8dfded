"""A pause reaches every worker while Postgres is down. The retry worker that decides a
pause announces it on the pause topic in Kafka, so the main consumers stop sending first
attempts to the destination at once, not only once they can read the database again (the
chaos run's finding: 326 first attempts to a paused destination during a Postgres
restart). Records come in through `wal-worker ingest`, whose direct path to Kafka works
with Postgres down; every record it acknowledged is counted at the destination."""
import time

import pytest

from conftest import Destination, connect, env_cmd, record_key
from consumer_helpers import add_destination, wait_published
from ingest_helpers import Ingest, IngestLoad, send_record, setup_ingest, topics_with_token
from relay_helpers import report, wait_until
from retry_helpers import TIME_SCALE, Fleet, attempt_of, destination_status, wait_breaker

pytestmark = pytest.mark.usefixtures("clean_destinations")

PAUSE_AFTER = 5
GRACE = 1.0  # s for attempts already started when the pause was announced


@pytest.fixture
def fleet(tmp_path, kafka_bootstrap):
    f = Fleet(tmp_path, kafka_bootstrap)
    yield f
    f.stop_all()


def db_paused(name):
    with connect() as conn:
        row = conn.execute("SELECT paused FROM wal_delivery.destination_pauses"
                           " WHERE destination = %s", (name,)).fetchone()
    return bool(row and row[0])


def first_attempts_after(dest, t):
    return [r for r in dest.requests("/x") if attempt_of(r) == 1 and r["arrived_at"] > t]


def test_a_pause_decided_while_postgres_is_down_stops_the_main_consumers(tmp_path, fleet,
                                                                         kafka_bootstrap, unique):
    x = Destination(tmp_path)
    name = f"x-{unique}"
    with connect() as conn:
        setup_ingest(conn)
        (topic,), token = topics_with_token(conn, unique)
        add_destination(conn, name, x.url + "/x", [topic], pause_after_failures=PAUSE_AFTER)
        wait_published(conn)
    ingest = Ingest(tmp_path, kafka_bootstrap)
    consumers = fleet.start_ready("consume", "consume")
    retry, = fleet.start_ready("retry")
    try:
        ingest.wait_listening()
        for w in consumers + [retry]:
            wait_until(lambda: "event=pause_channel_listening" in w.output(), 30,
                       what="every consumer and retry worker to listen on the pause topic")
        status, body, _ = send_record(ingest.port, topic, token, ikey="warm-up")
        assert status in (201, 202), body
        x.wait_for(1, "/x")

        x.behave(status=503)
        env_cmd("pg-stop-immediate")
        pg_down = True
        try:
            with IngestLoad(ingest.port, topic, token, threads=2, pause=0.05) as load:
                # The main consumers fail each record into step 1; the retry worker's
                # PAUSE_AFTER-th consecutive failure there decides the pause, which it
                # cannot write to the database: it announces it on the pause topic.
                wait_until(lambda: "event=pause_announced" in retry.output(), 60,
                           what="the retry worker to announce the pause")
                announced = time.time()
                for c in consumers:
                    wait_until(lambda: f"event=pause_heard destination={name}" in c.output(), 10,
                               what="each main consumer to hear the pause")
                sent_before = load.count(201)
                wait_until(lambda: load.count(201) >= sent_before + 60, 60,
                           what="records flowing while paused and Postgres is down")
                leaked = first_attempts_after(x, announced + GRACE)
                assert not leaked, (f"{len(leaked)} first attempts reached the paused destination"
                                    f" while Postgres was down")
                assert sum(c.metric("wal_breaker_open_handoffs_total", destination=name) or 0
                           for c in consumers) >= 60

                # Postgres back: the retry worker writes its pause; the consumers go on
                # from the database without a gap.
                env_cmd("pg-start")
                pg_down = False
                wait_until(lambda: db_paused(name), 60, what="the pause written once Postgres is back")
                sent_before = load.count(201)
                wait_until(lambda: load.count(201) >= sent_before + 40, 60,
                           what="records flowing after Postgres returned")
                leaked = first_attempts_after(x, announced + GRACE)
                assert not leaked, f"{len(leaked)} first attempts reached the paused destination"
        finally:
            if pg_down:
                env_cmd("pg-start")
        acked = set(load.acknowledged())
        assert load.count() == len(acked), f"every request answered 201/202: {load.errors[:3]}"

        # Recovery: the next probe succeeds, the queued copies are delivered.
        x.behave(status=200)
        wait_breaker(name, "closed", timeout=120 / TIME_SCALE + 30)
        wait_until(lambda: acked <= {record_key(r) for r in x.requests("/x")
                                     if r["status"] == 200}, 120,
                   what="every acknowledged record delivered after the resume")
        got = [record_key(r) for r in x.requests("/x") if r["status"] == 200]
        report(f"pause spread with Postgres down: {len(acked)} records acknowledged by ingest,"
               f" all delivered after the resume, {len(got) - len(set(got))} duplicates;"
               f" 0 first attempts after the announcement"
               f" (status {destination_status(name)['breaker']})")
    finally:
        ingest.stop()
        x.stop()


def test_a_consumer_started_while_postgres_is_down_learns_of_an_earlier_pause(
        tmp_path, fleet, kafka_bootstrap, unique):
    x = Destination(tmp_path)
    name = f"x-{unique}"
    x.behave(status=503)
    with connect() as conn:
        setup_ingest(conn)
        (topic,), token = topics_with_token(conn, unique)
        add_destination(conn, name, x.url + "/x", [topic], pause_after_failures=PAUSE_AFTER)
        wait_published(conn)
    ingest = Ingest(tmp_path, kafka_bootstrap)
    first, retry = fleet.start_ready("consume", "retry")
    pg_down = False
    try:
        ingest.wait_listening()
        with IngestLoad(ingest.port, topic, token, threads=1, pause=0.05):
            wait_until(lambda: db_paused(name), 60, what="the pause, written while Postgres is up")
        # The first announcement leaves the window a starting listener reads (a minute,
        # 6 s at this time scale); only the repeats can tell a newcomer.
        wait_until(lambda: (retry.metric("wal_pause_announcements_total", destination=name) or 0) >= 5,
                   30, what="the retry worker to repeat the pause in force")

        env_cmd("pg-stop-immediate")
        pg_down = True
        first.stop(__import__("signal").SIGKILL)
        newcomer = fleet.start("consume", "--peer", retry.url(""))
        started = time.time()
        wait_until(lambda: "event=config_from_peer" in newcomer.output(), 30,
                   what="the newcomer's config from its peer")
        wait_until(lambda: f"event=pause_heard destination={name}" in newcomer.output(), 30,
                   what="the newcomer to hear the pause in force")
        with IngestLoad(ingest.port, topic, token, threads=1, pause=0.05) as load:
            wait_until(lambda: (newcomer.metric("wal_breaker_open_handoffs_total", destination=name)
                                or 0) >= 40, 60,
                       what="records consumed by the newcomer while Postgres is down")
        leaked = first_attempts_after(x, started)
        assert not leaked, f"{len(leaked)} first attempts from a consumer started during the outage"
        report(f"pause spread to a consumer started with Postgres down: {load.count(201)} records,"
               f" 0 first attempts to the paused destination")
    finally:
        if pg_down:
            env_cmd("pg-start")
        ingest.stop()
        x.stop()
