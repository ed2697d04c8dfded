"""`wal-worker dlq`: every DLQ message lands in wal_delivery.dead_letters exactly once,
with what on-call needs to replay it, raising one alert (webhook and metric) per new
entry; a kill -9 and restart neither loses nor duplicates; bad messages and a failing
alert webhook do not stop it."""
import json
import signal
import time

import pytest
from confluent_kafka import Producer

from conftest import Destination, connect
from consumer_helpers import Worker, add_destination, wait_group_caught_up, wait_published
from relay_helpers import make_topic, wait_all_stored, wait_until
from test_log import parse_logfmt


@pytest.fixture(autouse=True)
def clean(clean_destinations):
    yield
    with connect() as conn:
        conn.execute("UPDATE wal_delivery.settings SET dlq_alert_url = NULL")


def rows_for(conn, destination):
    return conn.execute("SELECT idempotency_key, origin, topic, convert_from(payload, 'UTF8'),"
                        " last_error, attempts, outbox_id IS NOT NULL FROM wal_delivery.dead_letters"
                        " WHERE destination = %s ORDER BY idempotency_key", (destination,)).fetchall()


@pytest.fixture
def alerts(tmp_path):
    """An alert webhook (a test destination) that settings.dlq_alert_url names, published."""
    webhook = Destination(tmp_path)
    try:
        with connect() as conn:
            conn.execute("UPDATE wal_delivery.settings SET dlq_alert_url = %s", (webhook.url + "/alert",))
            wait_published(conn)
        yield webhook
    finally:
        webhook.stop()


@pytest.fixture
def dlq_worker(tmp_path, kafka_bootstrap):
    """Starts `wal-worker dlq` when called; one the test did not stop is killed after it."""
    started = []

    def start():
        started.append(Worker(tmp_path, "dlq", kafka_bootstrap=kafka_bootstrap))
        return started[-1]

    yield start
    for w in started:
        if w.proc.poll() is None:
            w.stop(signal.SIGKILL)


def test_dead_letters_are_ingested_once_with_one_alert_each(tmp_path, kafka_bootstrap, unique):
    topic = f"dlq.src.{unique}"
    strict, alerts = Destination(tmp_path), Destination(tmp_path)
    strict.behave(status=400)
    name = f"strict-{unique}"
    workers = []
    try:
        with connect() as conn:
            conn.execute("UPDATE wal_delivery.settings SET dlq_alert_url = %s", (alerts.url + "/alert",))
            make_topic(conn, topic)
            add_destination(conn, name, strict.url, [topic])
            keys = [f"d{i:03}" for i in range(40)]
            conn.execute("SELECT wal_enqueue_batch(%s, %s::jsonb[], %s)",
                         (topic, [json.dumps({"i": i}) for i in range(40)], keys))
            wait_all_stored(conn, topic, 40)
            wait_published(conn)
        workers.append(Worker(tmp_path, "consume", kafka_bootstrap=kafka_bootstrap))
        dlq = Worker(tmp_path, "dlq", kafka_bootstrap=kafka_bootstrap)
        workers.append(dlq)
        with connect() as conn:
            wait_until(lambda: len(rows_for(conn, name)) >= 10, 60, what="some dead letters")
            dlq.stop(signal.SIGKILL)  # mid-stream
            again = Worker(tmp_path, "dlq", kafka_bootstrap=kafka_bootstrap)
            workers.append(again)
            wait_until(lambda: len(rows_for(conn, name)) == 40, 60, what="all 40 dead letters")
            # Nothing left to come: the new worker has committed the whole DLQ topic (after
            # each insert) and every entry's alert went out (sent, then marked).
            dlq_topic = conn.execute("SELECT dlq_topic FROM wal_delivery.settings").fetchone()[0]
            wait_group_caught_up(kafka_bootstrap, "wal_delivery.dlq", dlq_topic)
            wait_until(lambda: conn.execute("SELECT count(*) FROM wal_delivery.dead_letters WHERE"
                                            " destination = %s AND alerted_at IS NULL",
                                            (name,)).fetchone()[0] == 0, 60, what="every alert sent")
            rows = rows_for(conn, name)
        assert [r[0] for r in rows] == keys, "each DLQ message exactly once"
        key, origin, src, payload, error, attempts, has_outbox = rows[7]
        assert (origin, src, error, attempts, has_outbox) == ("delivery", topic, "HTTP 400", 1, True)
        assert json.loads(payload) == {"i": 7}
        alerted = [json.loads(r["body"]) for r in alerts.requests("/alert")]
        mine = [a for a in alerted if a.get("destination") == name]
        assert {a["idempotency_key"] for a in mine} == set(keys)
        assert len(mine) <= 40 + 1, "at most the one in flight at the kill is alerted twice"
    finally:
        for w in workers:
            if w.proc.poll() is None:
                w.stop(signal.SIGKILL, timeout=5)
        strict.stop()
        alerts.stop()


def test_a_bad_message_and_a_failing_alert_webhook_do_not_stop_ingestion(alerts, dlq_worker, kafka_bootstrap,
                                                                         unique):
    alerts.behave(status=500)
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    p.produce("wal_delivery.dlq", f"no headers {unique}".encode())
    p.produce("wal_delivery.dlq", f"with some {unique}".encode(), headers={"destination": f"odd-{unique}",
                                                        "attempt": "not a number"})
    p.flush(10)
    dlq = dlq_worker()
    with connect() as conn:
        wait_until(lambda: conn.execute(
            "SELECT count(*) FROM wal_delivery.dead_letters WHERE payload IN (%s, %s)",
            (f"no headers {unique}".encode(), f"with some {unique}".encode())).fetchone()[0] == 2, 60,
            what="both bad messages ingested")
        row = conn.execute("SELECT topic, idempotency_key, last_error, attempts FROM"
                           " wal_delivery.dead_letters WHERE destination = %s",
                           (f"odd-{unique}",)).fetchone()
    assert row == ("wal_delivery.dlq", "", "no reason given", 0)
    wait_until(lambda: dlq.metric("wal_dead_letter_alerts_failed_total") >= 2, 30,
               what="the failed alerts counted")
    assert "event=dlq_message_without_headers" in dlq.output()
    assert dlq.stop() == 0


def dlq_message(p, unique, key, destination, attempt, error):
    p.produce("wal_delivery.dlq", f"payload of {key}".encode(), key=key.encode(), headers=[
        ("idempotency-key", key.encode()), ("source-topic", f"dup.src.{unique}".encode()),
        ("destination", destination.encode()), ("attempt", str(attempt).encode()),
        ("last-error", error.encode()), ("content-type", b"text/plain")])


def test_the_same_failure_handed_off_twice_is_one_dead_letter_with_one_alert(alerts, dlq_worker, kafka_bootstrap,
                                                                            unique):
    """A record's copy for a destination reaches the DLQ more than once when a consumer
    redelivers after a rebalance or a crash (at least once): on-call sees one unresolved
    dead letter and gets one alert for it. Once that one is resolved, a new failure of the
    same record is a new dead letter; another destination's failure is its own."""
    a, b = f"dup-a-{unique}", f"dup-b-{unique}"
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    dlq_message(p, unique, "k1", a, 1, "HTTP 400")
    dlq_message(p, unique, "k1", a, 1, "HTTP 400")   # the same hand-off, redelivered
    dlq_message(p, unique, "k1", a, 6, "HTTP 503")   # a copy that went through the retry steps
    dlq_message(p, unique, "k1", b, 1, "HTTP 400")
    p.flush(10)
    dlq = dlq_worker()
    with connect() as conn:
        dlq_topic = conn.execute("SELECT dlq_topic FROM wal_delivery.settings").fetchone()[0]

        def rows(destination):
            return conn.execute("SELECT id, last_error, resolved_at IS NOT NULL FROM wal_delivery.dead_letters"
                                " WHERE destination = %s ORDER BY id", (destination,)).fetchall()

        def unalerted(*destinations):
            return conn.execute("SELECT count(*) FROM wal_delivery.dead_letters WHERE destination = ANY(%s)"
                                " AND alerted_at IS NULL", (list(destinations),)).fetchone()[0]

        wait_until(lambda: len(rows(b)) == 1, 30, what="the dead letters ingested")
        wait_group_caught_up(kafka_bootstrap, "wal_delivery.dlq", dlq_topic)
        assert [r[1:] for r in rows(a)] == [("HTTP 400", False)]
        wait_until(lambda: unalerted(a, b) == 0, 30, what="the alerts")
        conn.execute("SELECT wal_delivery.resolve_dead_letter(%s, 'fixed the endpoint')", (rows(a)[0][0],))

        dlq_message(p, unique, "k1", a, 1, "HTTP 422")  # failing again after the fix
        p.flush(10)
        wait_until(lambda: len(rows(a)) == 2, 30, what="the new failure as a new dead letter")
        assert [r[1:] for r in rows(a)] == [("HTTP 400", True), ("HTTP 422", False)]
        wait_until(lambda: unalerted(a) == 0, 30, what="the new failure's alert")
        wait_group_caught_up(kafka_bootstrap, "wal_delivery.dlq", dlq_topic)
    sent = [x for x in (json.loads(r["body"]) for r in alerts.requests("/alert"))
            if x.get("destination") in (a, b)]
    assert sorted((x["destination"], x["last_error"]) for x in sent) == \
        [(a, "HTTP 400"), (a, "HTTP 422"), (b, "HTTP 400")]
    assert dlq.stop() == 0


HOSTILE_HEADER_SETS = [
    {"outbox-id": "", "attempt": ""},
    {"outbox-id": "100000000000000000000", "attempt": "99999999999"},
    {"outbox-id": "-5", "attempt": "-1"},
    {"outbox-id": "12abc", "attempt": "3 "},
    {"idempotency-key": b"bad\xff\xfeutf8", "source-topic": b"\xc3\x28topic", "last-error": b"\xe2\x82"},
    {"destination": b"d\x00nul", "content-type": b"text/\xffplain"},
    {"idempotency-key": "k" * 70000},
    {"last-error": "line\nbreak level=error event=forged"},
]


def test_hostile_headers_are_stored_with_what_is_valid_and_never_block_the_rest(dlq_worker, kafka_bootstrap, unique):
    """Every DLQ message is stored, whatever its headers hold (empty or out-of-range
    numbers, invalid UTF-8, NUL bytes, huge values): with what is valid plus its raw
    headers. A message that cannot be stored as is never blocks the ones after it."""
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for i, hs in enumerate(HOSTILE_HEADER_SETS):
        headers = [(k, v if isinstance(v, bytes) else v.encode()) for k, v in hs.items()]
        p.produce("wal_delivery.dlq", f"hostile-{i}-{unique}".encode(), headers=headers)
    p.produce("wal_delivery.dlq", f"after-{unique}".encode(),
              headers=[("idempotency-key", b"fine"), ("destination", f"fine-{unique}".encode())])
    p.flush(10)
    dlq = dlq_worker()
    with connect() as conn:
        def stored():
            return conn.execute(
                "SELECT convert_from(payload, 'UTF8'), outbox_id, attempts, idempotency_key, headers"
                " FROM wal_delivery.dead_letters WHERE convert_from(payload, 'UTF8') LIKE %s",
                (f"%-{unique}",)).fetchall()
        wait_until(lambda: len(stored()) == len(HOSTILE_HEADER_SETS) + 1, 30,
                   what="every hostile message and the one after them stored")
        rows = {r[0]: r[1:] for r in stored()}
    for i in range(4):  # numbers that are not in range are kept only in the raw headers
        outbox_id, attempts, _, headers = rows[f"hostile-{i}-{unique}"]
        assert outbox_id is None and attempts == 0
        assert headers["outbox-id"] == HOSTILE_HEADER_SETS[i]["outbox-id"]
    _, _, key, headers = rows[f"hostile-4-{unique}"]
    assert key.startswith("bad") and "\\xff" in headers["idempotency-key"]
    assert rows[f"after-{unique}"][2] == "fine"
    assert dlq.proc.poll() is None, "the worker died"
    assert "ingest_failed" not in dlq.output()
    events = [parse_logfmt(line)["event"] for line in dlq.output().splitlines()]
    assert "forged" not in events
    assert dlq.stop() == 0


def test_a_hanging_alert_webhook_does_not_slow_ingestion(alerts, dlq_worker, kafka_bootstrap, unique):
    """Alerts go out beside ingestion: with a webhook that never answers, 30 dead letters
    are in the table within seconds (not one per alert timeout); the alerts stay owed and
    go out once the webhook answers; an answer's body is read and dropped, never logged."""
    alerts.behave(hang=True)
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(30):
        p.produce("wal_delivery.dlq", f"hang-{i}-{unique}".encode(),
                  headers=[("idempotency-key", f"hang-{i}".encode()), ("destination", f"h-{unique}".encode())])
    p.flush(10)
    dlq = dlq_worker()
    with connect() as conn:
        started = time.time()
        wait_until(lambda: conn.execute("SELECT count(*) FROM wal_delivery.dead_letters WHERE destination = %s",
                                        (f"h-{unique}",)).fetchone()[0] == 30, 30, what="30 dead letters")
        assert time.time() - started < 10, "ingestion waited for the alert webhook"
        assert conn.execute("SELECT count(*) FROM wal_delivery.dead_letters WHERE destination = %s"
                            " AND alerted_at IS NULL", (f"h-{unique}",)).fetchone()[0] == 30
        alerts.control("reset", {})
        alerts.behave(status=200, body_bytes=4096)
        wait_until(lambda: conn.execute("SELECT count(*) FROM wal_delivery.dead_letters WHERE destination = %s"
                                        " AND alerted_at IS NULL", (f"h-{unique}",)).fetchone()[0] == 0, 60,
                   what="the owed alerts sent once the webhook answers")
    assert "     " not in dlq.output(), "the webhook's answer body reached the worker's output"
    assert dlq.stop() == 0
