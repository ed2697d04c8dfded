"""A record is sent again only after Kafka refused it or its acknowledgement was lost,
never while its first attempt can still be acknowledged: a broker that stops answering
(SIGSTOP, then SIGCONT: a real broker whose acknowledgement comes later than the relay's
pass waits) gets each record once, and the relay counts no possible duplicate."""
import os
import signal
import time
import uuid
from pathlib import Path

from conftest import connect
from relay_helpers import ensure_extension, make_topic, read_topic, states, wait_all_stored

RECORDS = 50


def possible_duplicates(conn):
    return conn.execute("SELECT possible_duplicates FROM wal_delivery.relay_passes()").fetchone()[0]


def set_delivery_timeout(conn, value):
    conn.execute(f"ALTER SYSTEM SET wal_delivery.relay_delivery_timeout = '{value}'")
    conn.execute("SELECT pg_reload_conf()")


def test_a_late_acknowledgement_is_waited_for_not_sent_again(kafka_bootstrap):
    ensure_extension()
    broker = int(Path(os.environ["WAL_ENV_DIR"], "kafka", "n1.pid").read_text())
    topic = "inflight." + uuid.uuid4().hex[:8]
    with connect() as conn:
        conn.autocommit = True
        make_topic(conn, topic)
        # The pass waits the delivery timeout and 5 s more (7 s) for reports.
        set_delivery_timeout(conn, "2s")
        try:
            conn.execute("SELECT wal_enqueue(%s, 'warm'::text, 'warm')", (topic,))
            wait_all_stored(conn, topic, 1)
            before = possible_duplicates(conn)

            os.kill(broker, signal.SIGSTOP)
            try:
                with conn.transaction():
                    for i in range(RECORDS):
                        conn.execute("SELECT wal_enqueue(%s, %s::text, %s)", (topic, f"v{i}", f"k{i}"))
                # Longer than the pass's wait, shorter than librdkafka's request timeout
                # (30 s): the broker answers the first attempt when it runs again.
                time.sleep(15)
                assert states(conn, topic).get("pending") == RECORDS
            finally:
                os.kill(broker, signal.SIGCONT)

            wait_all_stored(conn, topic, RECORDS + 1, timeout=120)
            seen = read_topic(kafka_bootstrap, topic, ["warm"] + [f"k{i}" for i in range(RECORDS)])
            copies = {k: len(v) for k, v in seen.items()}
            assert copies == {k: 1 for k in ["warm"] + [f"k{i}" for i in range(RECORDS)]}, copies
            assert possible_duplicates(conn) == before
        finally:
            conn.execute("ALTER SYSTEM RESET wal_delivery.relay_delivery_timeout")
            conn.execute("SELECT pg_reload_conf()")
