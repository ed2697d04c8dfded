"""A `consume` worker behind by a backlog many times its prefetch bound holds no more than
the bound: librdkafka's prefetch (set small here with -X, as an operator may) plus the
open records (2000), whatever the lag. The destination answers slowly, so the backlog
stays in Kafka and the worker sits at its caps; its peak RSS (VmHWM, the kernel's own
high-water mark) then grows by far less than the backlog it is behind. Without the
bound librdkafka fetches the whole backlog ahead (its default is 64 MB) and the check
fails. No timing threshold: the waits only let the caps fill."""
import json
import signal
import time

import pytest

from conftest import Destination, connect
from consumer_helpers import Worker, add_destination, wait_published
from relay_helpers import make_topic, report, wait_all_stored, wait_until

RECORDS = 24000
PAYLOAD = 2000  # bytes of JSON per record: a 48 MB backlog
PREFETCH = ["-X", "queued.max.messages.kbytes=1024", "-X", "queued.min.messages=1000",
            "-X", "max.partition.fetch.bytes=65536"]  # fetch.max.bytes: 1 MB, the least allowed
# What the worker may hold at its caps: the 1 MB prefetch and a 192 KB fetch response,
# each record with librdkafka's bookkeeping and the headers, and 2000 open records of
# ~2 KB (their copies too): ~8 MB measured; the backlog is 48 MB.
ALLOWED_GROWTH_KB = 20 * 1024

pytestmark = pytest.mark.usefixtures("clean_destinations")


def status_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def test_memory_stays_within_the_prefetch_bound_whatever_the_lag(tmp_path, kafka_bootstrap, unique):
    topic = f"c.mem.{unique}"
    dest = Destination(tmp_path)
    w = None
    try:
        with connect() as conn:
            make_topic(conn, topic, partitions=3)
            add_destination(conn, f"mem-{unique}", dest.url + "/m", [topic], max_in_flight=4)
            wait_published(conn)
        w = Worker(tmp_path, "consume", *PREFETCH, kafka_bootstrap=kafka_bootstrap)
        w.wait_ready()
        wait_until(lambda: "event=subscribed" in w.output() and "event=assigned" in w.output(),
                   60, what="the worker to subscribe and get its partitions")
        assert "queued_max_kbytes=1024" in w.output(), "the -X prefetch bound is not in effect"
        # Its footprint with nothing to deliver: code, dedupe set, connections.
        base_kb = status_kb(w.proc.pid, "VmRSS")

        # 4 requests in flight, each answered after 5 s: under 1 record/s drains, so the
        # backlog stays in Kafka while the worker fills its caps.
        dest.behave(delay_ms=5000)
        pad = "x" * (PAYLOAD - 30)
        with connect() as conn:
            for lo in range(0, RECORDS, 1000):
                conn.execute("SELECT wal_enqueue_batch(%s, %s::jsonb[])",
                             (topic, [json.dumps({"n": i, "pad": pad}) for i in range(lo, lo + 1000)]))
            wait_all_stored(conn, topic, RECORDS, timeout=180)
        wait_until(lambda: w.metric("wal_open_records") >= 2000, 120,
                   what="the worker to hold its 2000 open records")
        time.sleep(5)  # librdkafka refills its prefetch at least once a second
        # Behind: every record the destination has not seen (the worker's lag gauge knows
        # the partitions' ends only as of its last fetch, which the bound stopped).
        lag = RECORDS - len(dest.requests())
        peak_kb = status_kb(w.proc.pid, "VmHWM")
        report(f"consume memory: {base_kb // 1024} MB idle, peak {peak_kb // 1024} MB with "
               f"{lag} records ({lag * PAYLOAD / 1e6:.0f} MB) not delivered yet")
        assert lag * PAYLOAD > 2 * ALLOWED_GROWTH_KB * 1024, "the backlog drained: nothing was checked"
        assert peak_kb - base_kb < ALLOWED_GROWTH_KB, (
            f"peak RSS grew by {(peak_kb - base_kb) // 1024} MB over the idle {base_kb // 1024} MB "
            f"while {lag} records were behind: the prefetch is not bounded")
    finally:
        if w is not None:
            w.stop(signal.SIGKILL)
        dest.stop()
