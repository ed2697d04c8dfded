"""A topic with 300 subscribed destinations: every one gets every record (there is no
fixed limit on a topic's fan-out). It runs late in the suite on purpose: each destination
owns a partition of every retry step for good, so the retry topics grow to 300+
partitions for the tests after it."""
import json

from conftest import Destination, connect, record_key
from consumer_helpers import Worker, add_destination, wait_published
from relay_helpers import make_topic, wait_all_stored, wait_until

FANOUT = 300


def test_three_hundred_destinations_on_one_topic_each_get_every_record(tmp_path, kafka_bootstrap, unique,
                                                                      clean_destinations):
    topic = f"wide.{unique}"
    d = Destination(tmp_path)
    w = None
    try:
        with connect() as conn:
            make_topic(conn, topic)
            for i in range(FANOUT):
                add_destination(conn, f"wide-{i}-{unique}", f"{d.url}/d{i}", [topic])
            conn.execute("SELECT wal_enqueue_batch(%s, %s::jsonb[], %s)",
                         (topic, [json.dumps({"n": n}) for n in range(3)], [f"w{n}" for n in range(3)]))
            wait_all_stored(conn, topic, 3)
            wait_published(conn, timeout=120)
        w = Worker(tmp_path, "consume", kafka_bootstrap=kafka_bootstrap)
        got = d.wait_for(FANOUT * 3, timeout=120)
        per_destination = {}
        for r in got:
            per_destination.setdefault(r["path"], set()).add(record_key(r))
        assert len(per_destination) == FANOUT
        assert all(keys == {"w0", "w1", "w2"} for keys in per_destination.values())
        wait_until(lambda: w.metric("wal_open_records") == 0, 30, what="every record done")
    finally:
        if w is not None:
            w.stop()
        d.stop()
