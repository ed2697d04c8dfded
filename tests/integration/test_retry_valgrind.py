"""The retry worker under valgrind: scheduling by due time, handing failures on to the next
step and the DLQ, tripping a pause, a probe, a resume with its ramp-up, a bad message and
SIGTERM, with no invalid read or write, use of an uninitialised value or bad free."""
import json
import re
import signal

from conftest import Destination, connect, record_key
from consumer_helpers import Worker, add_destination, reset_destinations, wait_published
from relay_helpers import ensure_extension, make_topic, wait_all_stored, wait_until
from retry_helpers import TIME_SCALE, destination_status


def test_retry_worker_is_memory_clean_under_valgrind(tmp_path, kafka_bootstrap, unique):
    ensure_extension()
    reset_destinations()
    topic, name = f"r.vg.{unique}", f"vg-{unique}"
    dest = Destination(tmp_path)
    dest.behave(status=503)
    workers = []
    try:
        with connect() as conn:
            make_topic(conn, topic)
            add_destination(conn, name, dest.url + "/v", [topic], pause_after_failures=3,
                            probe_interval="30 seconds",
                            retry_delays="{10 seconds,20 seconds,30 seconds}")
            wait_published(conn)
        common = dict(kafka_bootstrap=kafka_bootstrap)
        consumer = Worker(tmp_path, "consume", "--time-scale", str(TIME_SCALE), **common)
        retry = Worker(tmp_path, "retry", "--time-scale", str(TIME_SCALE), **common,
                       wrapper=("valgrind", "--error-exitcode=99", "--leak-check=no",
                                "--track-origins=yes"))
        workers += [consumer, retry]
        retry.wait_ready(timeout=120)
        with connect() as conn:
            conn.execute("SELECT wal_enqueue_batch(%s, %s::jsonb[], %s)",
                         (topic, [json.dumps({"i": i}) for i in range(6)],
                          [f"v{i}-{unique}" for i in range(6)]))
            wait_all_stored(conn, topic, 6)
        wait_until(lambda: destination_status(name)["breaker"] == "open", 120, what="the pause")
        dest.behave(status=200)
        wait_until(lambda: destination_status(name)["breaker"] == "closed", 120,
                   what="the probe to resume it")
        wait_until(lambda: {record_key(r) for r in dest.requests("/v")
                            if r.get("status") == 200} >= {f"v{i}-{unique}" for i in range(6)},
                   120, what="every record delivered after the resume")
        code = retry.stop(signal.SIGTERM, timeout=90)
        out = retry.output()
        assert re.search(r"ERROR SUMMARY: 0 errors", out), out[-3000:]
        assert "event=destination_resumed" in out
        assert code == 0
    finally:
        for w in workers:
            if w.proc.poll() is None:
                w.stop(signal.SIGKILL)
        dest.stop()
        reset_destinations()
