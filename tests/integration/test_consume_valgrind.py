"""The consumer under valgrind: delivering, signing, handing off to a retry step, taking a
config change and stopping on SIGTERM, with no invalid read or write, use of an
uninitialised value or bad free anywhere in the run."""
import json
import re
import signal

from conftest import Destination, connect
from consumer_helpers import Worker, add_destination, reset_destinations, wait_published
from relay_helpers import ensure_extension, make_topic, wait_all_stored, wait_until


def test_consumer_is_memory_clean_under_valgrind(tmp_path, kafka_bootstrap, unique):
    ensure_extension()
    reset_destinations()
    topic = f"c.vg.{unique}"
    ok, failing = Destination(tmp_path), Destination(tmp_path)
    failing.behave(status=503)
    worker = None
    try:
        with connect() as conn:
            make_topic(conn, topic)
            add_destination(conn, f"vg-ok-{unique}", ok.url, [topic],
                            secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
            add_destination(conn, f"vg-failing-{unique}", failing.url, [topic])
            keys = [f"v{i}" for i in range(10)]
            conn.execute("SELECT wal_enqueue_batch(%s, %s::jsonb[], %s)",
                         (topic, [json.dumps({"i": i}) for i in range(10)], keys))
            wait_all_stored(conn, topic, 10)
            wait_published(conn)
        worker = Worker(tmp_path, "consume", kafka_bootstrap=kafka_bootstrap,
                        wrapper=("valgrind", "--error-exitcode=99", "--leak-check=no",
                                 "--track-origins=yes"))
        ok.wait_for(10, timeout=120)
        wait_until(lambda: worker.metric("wal_handed_off_total", destination=f"vg-failing-{unique}",
                                         to="retry.1") == 10, 120, what="hand-offs")
        with connect() as conn:  # a config change while running
            conn.execute("UPDATE wal_delivery.destinations SET max_in_flight = 4 WHERE name = %s",
                         (f"vg-ok-{unique}",))
            wait_published(conn)
        wait_until(lambda: "event=config_changed" in worker.output(), 60, what="the config change")
        code = worker.stop(signal.SIGTERM, timeout=60)
        out = worker.output()
        assert re.search(r"ERROR SUMMARY: 0 errors", out), out[-3000:]
        assert code == 0
    finally:
        if worker and worker.proc.poll() is None:
            worker.stop(signal.SIGKILL)
        ok.stop()
        failing.stop()
        reset_destinations()
