"""The processor under valgrind: SQL and HTTP processors, failed attempts up to a dead
letter, a refused late result, and a SIGTERM, with no invalid read or write, use of an
uninitialised value, bad free or definitely lost block anywhere in the run."""
import json
import re
import signal

from conftest import connect
from consumer_helpers import Worker
from process_helpers import WORKER_ROLE, TransformServer, ensure_worker_role, make_processing_topic, wrap
from relay_helpers import ensure_extension, states, wait_all_stored, wait_until


def test_processor_is_memory_clean_under_valgrind(tmp_path, unique):
    ensure_extension()
    good = TransformServer()
    failing = TransformServer(lambda key, call, body: (500, b"no", 0))
    # The first answer comes after the 1 s lease: refused; the second is written.
    late = TransformServer(lambda key, call, body: (200, wrap(body, call), 2.5 if call == 1 else 0))
    worker = None
    try:
        with connect() as conn:
            ensure_worker_role(conn)
            conn.execute("CREATE OR REPLACE FUNCTION proc_test.vg_identity(p bytea) RETURNS bytea"
                         " LANGUAGE sql AS $$ SELECT p $$")
            topics = {k: f"proc.vg.{k}.{unique}" for k in ("sql", "http", "failing", "late")}
            make_processing_topic(conn, topics["sql"], "sql", "proc_test.vg_identity")
            make_processing_topic(conn, topics["http"], "http", good.url)
            make_processing_topic(conn, topics["failing"], "http", failing.url,
                                  processing_max_attempts=2, processing_backoff="10 milliseconds")
            make_processing_topic(conn, topics["late"], "http", late.url, processing_lease="1 second")
            for t in topics.values():
                conn.execute("SELECT wal_enqueue_batch(%s, %s::jsonb[])",
                             (t, [json.dumps({"i": i, "pad": "x" * 300}) for i in range(20 if "late" not in t else 1)]))
            worker = Worker(tmp_path, "process", conninfo=f"user={WORKER_ROLE}",
                            wrapper=("valgrind", "--error-exitcode=99", "--leak-check=full",
                                     "--errors-for-leak-kinds=definite", "--track-origins=yes"))
            wait_all_stored(conn, topics["sql"], 20, timeout=120)
            wait_all_stored(conn, topics["http"], 20, timeout=120)
            wait_all_stored(conn, topics["late"], 1, timeout=120)
            wait_until(lambda: states(conn, topics["failing"]) == {"dead": 20}, 120, what="dead letters")
        wait_until(lambda: worker.metric("wal_process_results_refused_total", topic=topics["late"]) == 1,
                   60, what="the late result refused")
        code = worker.stop(signal.SIGTERM, timeout=60)
        out = worker.output()
        assert re.search(r"ERROR SUMMARY: 0 errors", out), out[-3000:]
        assert code == 0
    finally:
        if worker and worker.proc.poll() is None:
            worker.stop(signal.SIGKILL)
        for s in (good, failing, late):
            s.stop()
