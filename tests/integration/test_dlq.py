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
from consumer_helpers import Worker, add_destination, wait_published
from relay_helpers import make_topic, wait_all_stored, wait_until


@pytest.fixture(autouse=True)
def clean(clean_destinations):
    yield
    with connect() as conn:
        conn.execute("UPDATE wal_delivery.settings SET dlq_alert_url = NULL")


def rows_for(conn, destination):
    return conn.execute("SELECT idempotency_key, origin, topic, convert_from(payload, 'UTF8'),"
                        " last_error, attempts, outbox_id IS NOT NULL FROM wal_delivery.dead_letters"
                        " WHERE destination = %s ORDER BY idempotency_key", (destination,)).fetchall()


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
            time.sleep(3)  # a duplicate would show up now
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


def test_a_bad_message_and_a_failing_alert_webhook_do_not_stop_ingestion(tmp_path, kafka_bootstrap, unique):
    alerts = Destination(tmp_path)
    alerts.behave(status=500)
    try:
        with connect() as conn:
            conn.execute("UPDATE wal_delivery.settings SET dlq_alert_url = %s", (alerts.url + "/alert",))
            wait_published(conn)
        p = Producer({"bootstrap.servers": kafka_bootstrap})
        p.produce("wal_delivery.dlq", f"no headers {unique}".encode())
        p.produce("wal_delivery.dlq", f"with some {unique}".encode(), headers={"destination": f"odd-{unique}",
                                                            "attempt": "not a number"})
        p.flush(10)
        dlq = Worker(tmp_path, "dlq", kafka_bootstrap=kafka_bootstrap)
        try:
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
        finally:
            if dlq.proc.poll() is None:
                dlq.stop(signal.SIGKILL)
    finally:
        alerts.stop()
