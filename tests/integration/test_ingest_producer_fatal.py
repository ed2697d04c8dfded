"""`wal-worker ingest` after a fatal error of its idempotent producer (real broker, real
Postgres): the producer is replaced by a new one, the records meanwhile go to the outbox
(202), the direct path answers 201 again afterwards, and every record answered 2xx is in
Kafka. The fatal error is injected with rd_kafka_test_fatal_error through the test-only
hook WAL_TEST_FATAL_FILE (src/workers/common/fatal_error_hook.h), which is off
unless that variable is set. And a change of the control plane's kafka_bootstrap_servers
replaces both producers without a restart."""
import time

from conftest import connect
from consumer_helpers import wait_published
from ingest_helpers import Ingest, IngestLoad, send_record, setup_ingest, topics_with_token
from relay_helpers import read_topic, report, wait_until


def outbox_unshipped(topic):
    with connect() as conn:
        return conn.execute("SELECT count(*) FROM wal_delivery.outbox WHERE topic = %s"
                            " AND state <> 'stored'", (topic,)).fetchone()[0]


def test_a_fatal_producer_error_is_replaced_and_loses_no_acknowledged_record(
        tmp_path, kafka_bootstrap, unique):
    trigger = tmp_path / "fatal"
    with connect() as conn:
        setup_ingest(conn)
        (topic,), token = topics_with_token(conn, unique, acks=-1)
    ingest = Ingest(tmp_path, kafka_bootstrap, env={"WAL_TEST_FATAL_FILE": str(trigger)})
    try:
        ingest.wait_listening()
        wait_until(lambda: send_record(ingest.port, topic, token)[0] == 201, 30, what="config")
        with IngestLoad(ingest.port, topic, token, threads=4) as load:
            wait_until(lambda: load.count(201) >= 200, 60, what="201s before the fault")
            injected_at = time.time()
            trigger.touch()
            wait_until(lambda: "event=kafka_producer_recreated" in ingest.log_path.read_text(),
                       30, what="the producer to be replaced")
            wait_until(lambda: sum(1 for a in load.answers
                                   if a[0] > injected_at and a[3] == 201) >= 200, 60,
                       what="201s from the new producer")
        log = ingest.log_path.read_text()
        assert not trigger.exists(), "the hook did not take the trigger"
        assert "event=test_fatal_error_injected" in log
        assert "event=kafka_producer_fatal" in log
        assert ingest.metric("wal_ingest_kafka_producer_restarts_total", reason="fatal_error") == 1

        statuses = {a[3] for a in load.answers}
        assert statuses <= {201, 202}, f"refused: {statuses} {load.errors[:3]}"
        # The swap takes milliseconds: records that met the broken producer (or were
        # in flight on it and failed) went to the outbox; how many depends on timing.
        after = [a for a in load.answers if a[0] > injected_at]
        outbox = sum(1 for a in after if a[3] == 202)

        acked = load.acknowledged()
        wait_until(lambda: outbox_unshipped(topic) == 0, 120, what="the relay to ship the outbox")
        seen = read_topic(kafka_bootstrap, topic, acked, timeout=120)
        missing = set(acked) - set(seen)
        dupes = sum(len(v) - 1 for v in seen.values())
        report(f"ingest producer fatal error: {load.count(201)} answered 201, "
               f"{load.count(202)} answered 202 ({outbox} after the fault), "
               f"{len(missing)} missing in Kafka, {dupes} duplicates")
        assert not missing, f"{len(missing)} acknowledged records are not in Kafka"
    finally:
        ingest.stop()


def test_the_fault_hook_is_off_without_its_variable(tmp_path, kafka_bootstrap, unique):
    with connect() as conn:
        setup_ingest(conn)
        (topic,), token = topics_with_token(conn, unique, acks=-1)
    ingest = Ingest(tmp_path, kafka_bootstrap)
    try:
        ingest.wait_listening()
        wait_until(lambda: send_record(ingest.port, topic, token)[0] == 201, 30, what="config")
        assert "test_hook" not in ingest.log_path.read_text()
    finally:
        ingest.stop()


def test_a_change_of_bootstrap_servers_replaces_the_producers(tmp_path, kafka_bootstrap, unique):
    """Started on a bootstrap address where nothing listens (records go to the outbox), the
    service follows the control plane to the real broker without a restart."""
    with connect() as conn:
        setup_ingest(conn)
        (topic,), token = topics_with_token(conn, unique, acks=-1)
        before = conn.execute("SELECT kafka_bootstrap_servers FROM wal_delivery.settings").fetchone()[0]
        conn.execute("UPDATE wal_delivery.settings SET kafka_bootstrap_servers = '127.0.0.1:1'")
        wait_published(conn)
    ingest = Ingest(tmp_path, None)  # no -X bootstrap.servers: the control plane's
    try:
        ingest.wait_listening()
        wait_until(lambda: send_record(ingest.port, topic, token)[0] == 202, 30,
                   what="202s while the configured bootstrap is unreachable")
        with connect() as conn:
            conn.execute("UPDATE wal_delivery.settings SET kafka_bootstrap_servers = %s",
                         (kafka_bootstrap,))
            wait_published(conn)
        wait_until(lambda: send_record(ingest.port, topic, token)[0] == 201, 60,
                   what="201s through the new bootstrap servers")
        assert "event=kafka_bootstrap_changed" in ingest.log_path.read_text()
        assert ingest.metric("wal_ingest_kafka_producer_restarts_total",
                             reason="bootstrap_changed") == 2
    finally:
        ingest.stop()
        with connect() as conn:
            conn.execute("UPDATE wal_delivery.settings SET kafka_bootstrap_servers = %s", (before,))
            wait_published(conn)
