"""`wal-worker process`: records of processing topics go pending -> processing -> processed
-> stored, with a SQL processor (run in the database) or an HTTP transform service, and
reach Kafka processed with their idempotency key. The lease fences every write: a crashed
processor's rows come back after the lease, a late result is refused, two processors
never claim the same row, and a row is processed once. Failures count attempts; after the
last one the row is in dead_letters. Transitions are counted by a trigger (process_helpers).
The workers run as a non-superuser member of wal_delivery_admin (WORKER_ROLE), as the
worker requires, and SQL processors as the processing role (wal_delivery_processor)."""
import json
import signal
import time

import pytest

from conftest import connect, env_cmd
from consumer_helpers import Worker
from process_helpers import (WORKER_ROLE, TransformServer, ensure_worker_role, install_audit,
                             make_processing_topic, remove_audit, transitions, wrap)
from relay_helpers import ensure_extension, make_topic, read_topic, report, states, wait_all_stored, wait_until

SQL_WRAP = """
CREATE OR REPLACE FUNCTION proc_test.wrap(p bytea) RETURNS bytea LANGUAGE sql AS $$
    SELECT convert_to(jsonb_build_object('wrapped', convert_from(p, 'UTF8')::jsonb,
                                         'by', 'sql')::text, 'UTF8')
$$"""


@pytest.fixture(autouse=True)
def setup():
    ensure_extension()
    install_audit()
    with connect() as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS proc_test")
        conn.execute(SQL_WRAP)
        ensure_worker_role(conn)
    yield
    remove_audit()


@pytest.fixture
def workers():
    started = []
    yield started
    for w in started:
        if w.proc.poll() is None:
            w.stop(signal.SIGKILL, timeout=5)


def start(workers, tmp_path, name, user=WORKER_ROLE):
    w = Worker(tmp_path, "process", conninfo=f"user={user} application_name={name}")
    workers.append(w)
    return w


def enqueue_json(conn, topic, keys):
    conn.execute("SELECT wal_enqueue_batch(%s, %s::jsonb[], %s)",
                 (topic, [json.dumps({"key": k}) for k in keys], keys))


def assert_processed_once(conn, topic, n):
    processed = transitions(conn, topic, "processed")
    assert len(processed) == n and set(processed.values()) == {1}, \
        f"every row reaches processed exactly once: {sorted(processed.values())[-3:]}"


def test_sql_and_http_processors_reach_kafka_processed_with_their_keys(tmp_path, kafka_bootstrap,
                                                                        unique, workers):
    sql_topic, http_topic = f"proc.sql.{unique}", f"proc.http.{unique}"
    transform = TransformServer()
    try:
        with connect() as conn:
            make_processing_topic(conn, sql_topic, "sql", "proc_test.wrap")
            make_processing_topic(conn, http_topic, "http", transform.url)
            keys = [f"k{i:03}" for i in range(60)]
            enqueue_json(conn, sql_topic, keys)
            enqueue_json(conn, http_topic, keys)
            # Nothing ships before it is processed: a record committed after them on a
            # plain topic is stored, so the relay has had its pass over them.
            plain = f"proc.plain.{unique}"
            make_topic(conn, plain)
            conn.execute("SELECT wal_enqueue(%s, 'after'::text, 'after')", (plain,))
            wait_all_stored(conn, plain, 1)
            assert states(conn, sql_topic) == {"pending": 60}
            assert states(conn, http_topic) == {"pending": 60}
            w = start(workers, tmp_path, "p1")
            wait_all_stored(conn, sql_topic, 60)
            wait_all_stored(conn, http_topic, 60)
            assert_processed_once(conn, sql_topic, 60)
            assert_processed_once(conn, http_topic, 60)

        from_sql = read_topic(kafka_bootstrap, sql_topic, keys)
        from_http = read_topic(kafka_bootstrap, http_topic, keys)
        assert set(from_sql) == set(keys) and set(from_http) == set(keys)
        for k in keys:
            assert json.loads(from_sql[k][0]["value"]) == {"wrapped": {"key": k}, "by": "sql"}
            assert json.loads(from_http[k][0]["value"]) == {"transformed": {"key": k}, "call": 1}
            # Kafka carries the plain key; destinations get "<topic>:<key>" (record_key).
            assert from_sql[k][0]["headers"]["idempotency-key"] == k
            assert from_sql[k][0]["headers"]["source-topic"] == sql_topic
        sent = transform.requests[0]
        assert sent["headers"]["Content-Type"] == "application/json"
        assert sent["headers"]["Idempotency-Key"] in keys
        assert json.loads(sent["body"]) == {"key": sent["headers"]["Idempotency-Key"]}
        assert transform.count() == 60, "each HTTP row transformed once"

        assert w.get("/readyz")[0] == 200 and w.get("/healthz")[0] == 200
        # A claimed row whose turn comes too late is given back unstarted (no attempt
        # spent) and claimed again, so claims may exceed rows; each row was processed
        # exactly once (assert_processed_once above) and each HTTP row transformed once.
        assert w.metric("wal_process_claimed_total") >= 120
        assert w.metric("wal_process_processed_total", topic=sql_topic) == 60
        assert w.metric("wal_process_processed_total", topic=http_topic) == 60
        assert w.metric("wal_process_batches_total") >= 2
        assert w.metric("wal_process_batch_seconds_total") > 0
        assert w.stop() == 0
        assert "event=stopped" in w.output()
    finally:
        transform.stop()


def test_the_worker_needs_no_more_than_the_worker_role(tmp_path, kafka_bootstrap, unique, workers):
    topic, http_topic = f"proc.role.{unique}", f"proc.role.http.{unique}"
    transform = TransformServer()
    try:
        with connect() as conn:
            conn.execute("CREATE OR REPLACE FUNCTION proc_test.fails_once(p bytea) RETURNS bytea"
                         " LANGUAGE plpgsql AS $$ BEGIN IF convert_from(p, 'UTF8') LIKE '%bad%' THEN"
                         " RAISE EXCEPTION 'bad record'; END IF; RETURN p; END $$")
            make_processing_topic(conn, topic, "sql", "proc_test.fails_once", processing_max_attempts=1)
            make_processing_topic(conn, http_topic, "http", transform.url)
            enqueue_json(conn, topic, ["good", "bad"])
            enqueue_json(conn, http_topic, ["h1"])
            w = start(workers, tmp_path, "p1")
            wait_until(lambda: states(conn, topic) == {"stored": 1, "dead": 1}, 30,
                       what=f"one stored, one dead (now {states(conn, topic)})")
            wait_all_stored(conn, http_topic, 1)
        assert "permission denied" not in w.output()
        assert w.metric("wal_process_processed_total", topic=topic) == 1
        assert w.metric("wal_process_dead_total", topic=topic) == 1
    finally:
        transform.stop()


def test_kill9_mid_batch_rows_come_back_after_the_lease_and_are_processed_once(
        tmp_path, kafka_bootstrap, unique, workers):
    topic = f"proc.kill.{unique}"
    transform = TransformServer(lambda key, call, body: (200, wrap(body, call), 1.0))
    try:
        with connect() as conn:
            make_processing_topic(conn, topic, "http", transform.url, processing_lease="3 seconds")
            keys = [f"k{i:03}" for i in range(250)]
            enqueue_json(conn, topic, keys)
            first = start(workers, tmp_path, "victim")
            wait_until(lambda: transform.count() >= 50, 30, what="a batch in flight")
            first.stop(signal.SIGKILL)
            held = conn.execute("SELECT id FROM wal_delivery.outbox WHERE topic = %s"
                                " AND state = 'processing'", (topic,)).fetchall()
            assert held, "the kill left rows in processing"
            second = start(workers, tmp_path, "survivor")
            wait_all_stored(conn, topic, 250, timeout=120)
            assert_processed_once(conn, topic, 250)
            claims = transitions(conn, topic, "processing")
            assert all(claims[i] >= 2 for (i,) in held), "each held row was claimed again"
            again = conn.execute("SELECT count(*) FROM public.process_audit WHERE topic = %s"
                                 " AND state = 'processing' AND app = 'survivor' AND outbox_id"
                                 " = ANY(%s)", (topic, [i for (i,) in held])).fetchone()[0]
            assert again == len(held), "the survivor took over every row the victim held"
        seen = read_topic(kafka_bootstrap, topic, keys)
        assert set(seen) == set(keys)
        report(f"process kill -9: {len(held)} rows held at the kill, all 250 processed once"
               f" and shipped, {transform.count()} transform calls")
        assert second.stop() == 0
    finally:
        transform.stop()


# The first call sleeps past the 1 s lease: 1.5 s returns a late result (refused); 3 s
# outlives the worker's statement timeout (lease + 1 s), which cancels the call.
SQL_SLOW_FIRST = """
CREATE SEQUENCE IF NOT EXISTS proc_test.slow_calls;
CREATE OR REPLACE FUNCTION proc_test.slow_first(p bytea) RETURNS bytea LANGUAGE plpgsql AS $$
DECLARE
    call bigint := nextval('proc_test.slow_calls');
BEGIN
    IF call = 1 THEN
        PERFORM pg_sleep(current_setting('proc_test.first_sleep')::float);
    END IF;
    RETURN convert_to(jsonb_build_object('call', call)::text, 'UTF8');
END $$"""


@pytest.mark.parametrize("case", ["http", "sql-late", "sql-hung"])
def test_a_processor_slower_than_the_lease_writes_nothing_and_the_next_holder_wins(
        tmp_path, kafka_bootstrap, unique, workers, case):
    kind = case.split("-")[0]
    topic = f"proc.late.{case}.{unique}"
    transform = TransformServer(lambda key, call, body: (200, wrap(body, call), 3.0 if call == 1 else 0))
    try:
        with connect() as conn:
            if kind == "sql":
                conn.execute("DROP SEQUENCE IF EXISTS proc_test.slow_calls")
                conn.execute(SQL_SLOW_FIRST)
                conn.execute(f"ALTER DATABASE {conn.info.dbname} SET proc_test.first_sleep ="
                             f" '{1.5 if case == 'sql-late' else 3}'")
            processor = transform.url if kind == "http" else "proc_test.slow_first"
            make_processing_topic(conn, topic, kind, processor, processing_lease="1 second")
            enqueue_json(conn, topic, ["only"])
            slow = start(workers, tmp_path, "slow")
            wait_until(lambda: transitions(conn, topic, "processing"), 20, what="the first claim")
            fast = start(workers, tmp_path, "fast")
            wait_all_stored(conn, topic, 1, timeout=30)
            if case == "sql-hung":
                wait_until(lambda: slow.metric("wal_process_sql_timeouts_total") == 1, 20,
                           what="the hung call cancelled")
                assert "canceling statement due to statement timeout" in slow.output()
            else:
                wait_until(lambda: slow.metric("wal_process_results_refused_total", topic=topic) == 1,
                           20, what="the late result refused")
                assert "event=result_refused" in slow.output()
            assert_processed_once(conn, topic, 1)
            assert sum(transitions(conn, topic, "processing").values()) == 2
        seen = read_topic(kafka_bootstrap, topic, ["only"])
        assert len(seen["only"]) == 1
        value = json.loads(seen["only"][0]["value"])
        assert value["call"] == 2, "Kafka has the next holder's payload, not the late one"
        assert slow.metric("wal_process_processed_total", topic=topic) + \
            fast.metric("wal_process_processed_total", topic=topic) == 1
    finally:
        transform.stop()


def test_a_slow_answer_does_not_hold_back_the_rest_of_its_batch(tmp_path, kafka_bootstrap, unique,
                                                                 workers):
    topic = f"proc.slowone.{unique}"
    transform = TransformServer(
        lambda key, call, body: (200, wrap(body, call), 3.0 if key == "slow" and call == 1 else 0))
    try:
        with connect() as conn:
            make_processing_topic(conn, topic, "http", transform.url, processing_lease="2 seconds")
            keys = ["slow"] + [f"k{i:02}" for i in range(20)]
            enqueue_json(conn, topic, keys)
            w = start(workers, tmp_path, "p1")
            wait_all_stored(conn, topic, len(keys), timeout=60)
            attempts = dict(conn.execute("SELECT idempotency_key, attempts FROM wal_delivery.outbox"
                                         " WHERE topic = %s", (topic,)).fetchall())
            assert_processed_once(conn, topic, len(keys))
        assert attempts.pop("slow") == 2
        assert set(attempts.values()) == {1}, "the fast answers were written within their lease"
        assert w.metric("wal_process_results_refused_total", topic=topic) == 1
        seen = read_topic(kafka_bootstrap, topic, keys)
        assert json.loads(seen["slow"][0]["value"])["call"] == 2
        assert json.loads(seen["k07"][0]["value"]) == {"transformed": {"key": "k07"}, "call": 1}
    finally:
        transform.stop()


SQL_ALWAYS_FAILS = """
CREATE OR REPLACE FUNCTION proc_test.always_fails(p bytea) RETURNS bytea LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'cannot enrich %', convert_from(p, 'UTF8') USING ERRCODE = 'data_exception';
END $$"""


@pytest.mark.parametrize("kind", ["http", "sql"])
def test_a_processor_that_always_fails_gets_exactly_five_attempts_then_dead_letters(
        tmp_path, unique, workers, kind):
    topic = f"proc.fail.{kind}.{unique}"
    transform = TransformServer(lambda key, call, body: (500, b"boom", 0))
    try:
        with connect() as conn:
            conn.execute(SQL_ALWAYS_FAILS)
            processor = transform.url if kind == "http" else "proc_test.always_fails"
            make_processing_topic(conn, topic, kind, processor, processing_backoff="50 milliseconds")
            enqueue_json(conn, topic, ["doomed"])
            w = start(workers, tmp_path, "p1")
            wait_until(lambda: states(conn, topic) == {"dead": 1}, 30, what="the row dead")
            time.sleep(1)  # absence window from the row's death: a sixth attempt would show now
            dead = conn.execute("SELECT origin, attempts, last_error, convert_from(payload, 'UTF8')"
                                " FROM wal_delivery.dead_letters WHERE topic = %s", (topic,)).fetchall()
            assert len(dead) == 1
            origin, attempts, error, payload = dead[0]
            assert (origin, attempts, json.loads(payload)) == ("processing", 5, {"key": "doomed"})
            if kind == "http":
                assert error == f"{transform.url} answered HTTP 500"
                assert transform.count() == 5
            else:
                assert "cannot enrich" in error and "22000" in error
            assert sum(transitions(conn, topic, "processing").values()) == 5
        assert w.metric("wal_process_failed_total", topic=topic) == 5
        assert w.metric("wal_process_dead_total", topic=topic) == 1
        assert w.output().count("event=processing_failed") == 5
        assert "next=dead_letters" in w.output()
        assert w.proc.poll() is None, "still running"
    finally:
        transform.stop()


SQL_SLOWISH_IDENTITY = """
CREATE OR REPLACE FUNCTION proc_test.slowish(p bytea) RETURNS bytea LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep(0.002);
    RETURN p;
END $$"""


def test_two_processors_on_one_backlog_never_claim_the_same_row(tmp_path, kafka_bootstrap, unique,
                                                                workers):
    topic = f"proc.two.{unique}"
    n = 1500
    with connect() as conn:
        conn.execute(SQL_SLOWISH_IDENTITY)
        make_processing_topic(conn, topic, "sql", "proc_test.slowish")
        keys = [f"k{i:04}" for i in range(n)]
        enqueue_json(conn, topic, keys)
        a, b = start(workers, tmp_path, "pa"), start(workers, tmp_path, "pb")
        wait_all_stored(conn, topic, n, timeout=120)
        claims = transitions(conn, topic, "processing")
        assert len(claims) == n and set(claims.values()) == {1}, "each row claimed exactly once"
        assert_processed_once(conn, topic, n)
        by_worker = dict(conn.execute("SELECT app, count(*) FROM public.process_audit WHERE topic = %s"
                                      " AND state = 'processing' GROUP BY 1", (topic,)).fetchall())
    assert by_worker.get("pa", 0) > 0 and by_worker.get("pb", 0) > 0, by_worker
    assert a.metric("wal_process_claimed_total") == by_worker["pa"]
    assert b.metric("wal_process_claimed_total") == by_worker["pb"]
    report(f"process, two workers on {n} rows: claims {by_worker}, none twice")
    seen = read_topic(kafka_bootstrap, topic, keys)
    assert set(seen) == set(keys)
    assert json.loads(seen["k0007"][0]["value"]) == {"key": "k0007"}


def bad_then_good(bad):
    """An HTTP answer that is `bad` for a key's first two calls, then the usual transform."""
    def answer(key, call, body):
        return bad if call <= 2 else (200, wrap(body, call), 0)
    return answer


SQL_BAD = """
CREATE SEQUENCE IF NOT EXISTS proc_test.bad_calls;
CREATE OR REPLACE FUNCTION proc_test.raises_twice(p bytea) RETURNS bytea LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('proc_test.bad_calls') <= 2 THEN
        RAISE EXCEPTION 'not yet';
    END IF;
    RETURN p;
END $$;
CREATE OR REPLACE FUNCTION proc_test.returns_null(p bytea) RETURNS bytea LANGUAGE sql AS $$ SELECT NULL::bytea $$;
CREATE OR REPLACE FUNCTION proc_test.returns_garbage(p bytea) RETURNS bytea LANGUAGE sql AS $$ SELECT '\\x00ff'::bytea $$;
CREATE OR REPLACE FUNCTION proc_test.comes_and_goes(p bytea) RETURNS bytea LANGUAGE sql AS $$ SELECT p $$;
"""


def test_bad_processors_count_attempts_log_and_lose_nothing(tmp_path, kafka_bootstrap, unique, workers):
    cases = {  # topic suffix: (kind, processor, HTTP answer, expected error text)
        "garbage": ("http", bad_then_good((200, b"<html>not json", 0)), "not JSON"),
        "status500": ("http", bad_then_good((500, b"oops", 0)), "answered HTTP 500"),
        "timeout": ("http", bad_then_good((200, b"{}", 2.0)), "did not answer within 500 ms"),
        "raises": ("sql", "proc_test.raises_twice", "not yet"),
        "null": ("sql", "proc_test.returns_null", "returned NULL"),
        "sqlgarbage": ("sql", "proc_test.returns_garbage", "not JSON"),
        "missing": ("sql", "proc_test.comes_and_goes", "does not exist"),
    }
    servers = []
    try:
        with connect() as conn:
            conn.execute("DROP SEQUENCE IF EXISTS proc_test.bad_calls")
            conn.execute(SQL_BAD)
            for name, (kind, processor, _) in cases.items():
                if kind == "http":
                    servers.append(TransformServer(processor))
                    processor = servers[-1].url
                topic = f"proc.bad.{name}.{unique}"
                make_processing_topic(conn, topic, kind, processor, processing_backoff="50 milliseconds",
                                      processing_timeout="500 milliseconds",
                                      processing_max_attempts=5 if name not in ("null", "sqlgarbage") else 2)
                enqueue_json(conn, topic, [f"{name}-1", f"{name}-2"])
            conn.execute("DROP FUNCTION proc_test.comes_and_goes(bytea)")
            w = start(workers, tmp_path, "p1")

            def topic(name):
                return f"proc.bad.{name}.{unique}"

            # Failing for good: each attempt counted, then dead_letters with the error.
            for name in ("null", "sqlgarbage"):
                wait_until(lambda: states(conn, topic(name)) == {"dead": 2}, 30, what=f"{name} dead")
            # Failing twice, then good: processed and shipped on the third attempt.
            wait_until(lambda: w.metric("wal_process_failed_total", topic=topic("missing")) >= 4, 30,
                       what="the missing function's attempts")
            conn.execute("CREATE FUNCTION proc_test.comes_and_goes(p bytea) RETURNS bytea"
                         " LANGUAGE sql AS $$ SELECT p $$")
            for name in ("garbage", "status500", "timeout", "raises", "missing"):
                wait_all_stored(conn, topic(name), 2, timeout=60)
            for name, (kind, _, error) in cases.items():
                assert error in w.output(), f"{name}: the log names the error"
                assert w.metric("wal_process_failed_total", topic=topic(name)) >= 2, name
                attempts = conn.execute("SELECT max(attempts) FROM wal_delivery.outbox WHERE topic = %s",
                                        (topic(name),)).fetchone()[0]
                if name in ("null", "sqlgarbage"):
                    assert attempts == 2
                    errors = [r[0] for r in conn.execute(
                        "SELECT last_error FROM wal_delivery.dead_letters WHERE topic = %s", (topic(name),))]
                    assert len(errors) == 2 and all(error in e for e in errors), errors
                elif name == "missing":
                    assert attempts >= 3
                else:
                    # The HTTP ones fail each key's first two calls; raises_twice fails the
                    # first two calls overall, the first attempt of both rows (one batch).
                    assert attempts == (3 if kind == "http" else 2), name
            for name in ("garbage", "status500", "timeout", "raises", "missing"):
                seen = read_topic(kafka_bootstrap, topic(name), [f"{name}-1", f"{name}-2"])
                assert set(seen) == {f"{name}-1", f"{name}-2"}, f"{name}: nothing lost"
            assert json.loads(seen["missing-1"][0]["value"]) == {"key": "missing-1"}
        assert w.proc.poll() is None, "the worker survived every bad processor"
        assert "Segmentation" not in w.output()
    finally:
        for s in servers:
            s.stop()


def test_postgres_immediate_stop_mid_backlog_loses_nothing_and_processes_once(
        tmp_path, kafka_bootstrap, unique, workers):
    topic = f"proc.pgstop.{unique}"
    n = 1500
    with connect() as conn:
        conn.execute(SQL_SLOWISH_IDENTITY)
        make_processing_topic(conn, topic, "sql", "proc_test.slowish", processing_lease="3 seconds")
        keys = [f"k{i:04}" for i in range(n)]
        enqueue_json(conn, topic, keys)
        w = start(workers, tmp_path, "p1")
        wait_until(lambda: 100 <= states(conn, topic).get("stored", 0) + states(conn, topic).get("processed", 0),
                   60, what="some rows processed")
    env_cmd("pg-stop-immediate")
    time.sleep(1)  # the fault window: Postgres stays down a second under the worker
    env_cmd("pg-start")
    with connect() as conn:
        wait_all_stored(conn, topic, n, timeout=120)
        assert_processed_once(conn, topic, n)
        claims = transitions(conn, topic, "processing")
    assert w.proc.poll() is None, "the worker rode out the restart"
    out = w.output()
    assert out.rindex("event=db_connected") > out.index("event=db_unreachable"), "it reconnected"
    seen = read_topic(kafka_bootstrap, topic, keys)
    assert set(seen) == set(keys)
    report(f"process, Postgres immediate stop mid-backlog: {n} rows all processed once and shipped,"
           f" {sum(claims.values()) - n} claims repeated after the restart")


# ------------------------------------------------------------------ rows pay for their own failures

SQL_HANGS = """
CREATE OR REPLACE FUNCTION proc_test.hangs_on_bad(p bytea) RETURNS bytea LANGUAGE plpgsql AS $$
BEGIN
    IF convert_from(p, 'UTF8')::jsonb->>'key' LIKE 'hang%' THEN
        PERFORM pg_sleep(3600);
    END IF;
    PERFORM pg_sleep(0.01);
    RETURN p;
END $$"""


def attempts_by_key(conn, topic):
    return dict(conn.execute("SELECT idempotency_key, attempts FROM wal_delivery.outbox WHERE topic = %s",
                             (topic,)).fetchall())


def test_a_hanging_sql_processor_costs_only_its_own_rows_attempts(tmp_path, kafka_bootstrap, unique,
                                                                  workers):
    """Issue 16.2: 3 rows whose processor hangs among 40, lease 2 s, two workers. Each hang
    is cancelled alone (at its lease plus a second) as a failed attempt of its own row,
    with the backoff; the 37 good rows are processed on their first attempt."""
    topic = f"proc.hang.{unique}"
    keys = [f"hang-{i:02}" if i in (7, 19, 33) else f"k{i:02}" for i in range(40)]
    hanging = [k for k in keys if k.startswith("hang")]
    with connect() as conn:
        conn.execute(SQL_HANGS)
        make_processing_topic(conn, topic, "sql", "proc_test.hangs_on_bad", processing_lease="2 seconds",
                              processing_backoff="200 milliseconds")
        enqueue_json(conn, topic, keys)
        a, b = start(workers, tmp_path, "pa"), start(workers, tmp_path, "pb")
        wait_until(lambda: states(conn, topic) == {"stored": 37, "dead": 3}, 120,
                   what=f"37 stored and 3 dead (now {states(conn, topic)})")
        attempts = attempts_by_key(conn, topic)
        claims = transitions(conn, topic, "processing")
        dead = dict(conn.execute("SELECT idempotency_key, last_error FROM wal_delivery.dead_letters"
                                 " WHERE topic = %s", (topic,)).fetchall())
    good = {k: n for k, n in attempts.items() if k not in hanging}
    assert set(good.values()) == {1}, f"good rows spent attempts on the hanging ones: {good}"
    assert sum(claims.values()) == 37 + 3 * 5, "each good row claimed once, each hanging one 5 times"
    assert sorted(dead) == hanging
    assert all("did not finish within its lease" in e and "statement timeout" in e for e in dead.values()), dead
    assert a.metric("wal_process_sql_timeouts_total") + b.metric("wal_process_sql_timeouts_total") == 15
    assert a.metric("wal_process_processed_total", topic=topic) + \
        b.metric("wal_process_processed_total", topic=topic) == 37
    seen = read_topic(kafka_bootstrap, topic, [k for k in keys if k not in hanging])
    assert len(seen) == 37


SQL_SLOW = """
CREATE OR REPLACE FUNCTION proc_test.slow(p bytea) RETURNS bytea LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep(1.5);
    RETURN p;
END $$"""


def test_no_row_spends_its_lease_waiting_for_another_rows_processor(tmp_path, kafka_bootstrap, unique,
                                                                   workers):
    """Issue 16.3: three SQL rows of 1.5 s each and ten HTTP rows, all with a 2 s lease, for
    one worker. HTTP rows are never in a batch behind SQL rows, and each SQL row's lease
    starts when its processor does: every row is written on its first attempt."""
    sql_topic, http_topic = f"proc.wait.sql.{unique}", f"proc.wait.http.{unique}"
    transform = TransformServer()
    try:
        with connect() as conn:
            conn.execute(SQL_SLOW)
            make_processing_topic(conn, sql_topic, "sql", "proc_test.slow", processing_lease="2 seconds")
            make_processing_topic(conn, http_topic, "http", transform.url, processing_lease="2 seconds")
            enqueue_json(conn, sql_topic, ["s1", "s2", "s3"])
            enqueue_json(conn, http_topic, [f"h{i}" for i in range(10)])
            w = start(workers, tmp_path, "p1")
            wait_all_stored(conn, sql_topic, 3, timeout=60)
            wait_all_stored(conn, http_topic, 10, timeout=60)
            assert set(attempts_by_key(conn, sql_topic).values()) == {1}
            assert set(attempts_by_key(conn, http_topic).values()) == {1}
            assert_processed_once(conn, sql_topic, 3)
            assert_processed_once(conn, http_topic, 10)
        assert transform.count() == 10, "each HTTP row sent once"
        for t in (sql_topic, http_topic):
            assert w.metric("wal_process_results_refused_total", topic=t) == 0
        assert w.metric("wal_process_sql_timeouts_total") == 0
    finally:
        transform.stop()


SQL_WRITES = """
CREATE TABLE IF NOT EXISTS proc_test.side_effects (key text, call bigint);
GRANT INSERT, SELECT ON proc_test.side_effects TO wal_delivery_processor;
CREATE SEQUENCE IF NOT EXISTS proc_test.write_calls;
DROP SEQUENCE IF EXISTS proc_test.late_calls;
CREATE SEQUENCE proc_test.late_calls;
GRANT USAGE ON SEQUENCE proc_test.write_calls, proc_test.late_calls TO wal_delivery_processor;
CREATE OR REPLACE FUNCTION proc_test.writes(p bytea) RETURNS bytea LANGUAGE plpgsql AS $$
DECLARE
    v_key text := convert_from(p, 'UTF8')::jsonb->>'key';
    v_call bigint := nextval('proc_test.write_calls');
BEGIN
    INSERT INTO proc_test.side_effects VALUES (v_key, v_call);
    IF v_key LIKE 'late%' AND nextval('proc_test.late_calls') = 1 THEN
        PERFORM pg_sleep(1.5);   -- the first call only: after the 1 s lease, before the cut
    ELSIF v_key LIKE 'null%' THEN
        RETURN NULL;
    END IF;
    RETURN p;
END $$"""


def test_what_a_processor_wrote_is_undone_unless_its_result_is_stored(tmp_path, unique, workers):
    """Issue 16.7: a late result is refused and so is what its processor wrote, like a
    processor that raises; so is a result that cannot be stored (NULL here)."""
    late_topic, null_topic = f"proc.undo.late.{unique}", f"proc.undo.null.{unique}"
    with connect() as conn:
        conn.execute(SQL_WRITES)
        make_processing_topic(conn, late_topic, "sql", "proc_test.writes", processing_lease="1 second",
                              processing_backoff="100 milliseconds")
        make_processing_topic(conn, null_topic, "sql", "proc_test.writes", processing_max_attempts=1)
        late_key, null_key = f"late-{unique}", f"null-{unique}"
        enqueue_json(conn, late_topic, [late_key])
        enqueue_json(conn, null_topic, [null_key])
        w = start(workers, tmp_path, "p1")
        wait_all_stored(conn, late_topic, 1, timeout=30)
        wait_until(lambda: states(conn, null_topic) == {"dead": 1}, 30, what="the NULL row dead")
        writes = dict(conn.execute("SELECT key, count(*) FROM proc_test.side_effects WHERE key IN (%s, %s)"
                                   " GROUP BY 1", (late_key, null_key)).fetchall())
    assert w.metric("wal_process_results_refused_total", topic=late_topic) == 1
    assert writes == {late_key: 1}, f"only the stored attempt's write is kept: {writes}"


def test_sigterm_mid_batch_gives_back_the_rows_it_has_not_started(tmp_path, unique, workers):
    topic = f"proc.stop.{unique}"
    with connect() as conn:
        conn.execute("CREATE OR REPLACE FUNCTION proc_test.third_second(p bytea) RETURNS bytea"
                     " LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.3); RETURN p; END $$")
        make_processing_topic(conn, topic, "sql", "proc_test.third_second")
        enqueue_json(conn, topic, [f"k{i:02}" for i in range(30)])
        w = start(workers, tmp_path, "p1")
        wait_until(lambda: states(conn, topic).get("processing") == 30, 20, what="the batch claimed")
        # The batch is one transaction: what shows is the worker running a row's processor
        # (that row is finished at the stop); most rows are not started yet, 0.3 s each.
        wait_until(lambda: conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'p1'"
                                        " AND state = 'active' AND query LIKE '%run_sql_processor_row%'"
                                        ).fetchone()[0], 30, what="a row's processor running")
        stopped = time.monotonic()
        assert w.stop() == 0
        assert time.monotonic() - stopped < 5, "the stop waits for one row, not the batch"
        rows = conn.execute("SELECT state::text, attempts, count(*) FROM wal_delivery.outbox WHERE topic = %s"
                            " GROUP BY 1, 2", (topic,)).fetchall()
    by_state = {(s, a): n for s, a, n in rows}
    started = sum(n for (s, a), n in by_state.items() if s in ("processed", "stored"))
    assert 1 <= started < 30, by_state
    assert by_state.get(("pending", 0)) == 30 - started, f"the rest back, no attempt spent: {by_state}"
    assert "event=stopped" in w.output()
    # What was given back would be the next test's process worker's, 0.3 s a row; a
    # deleted topic's rows are nobody's to claim.
    with connect() as conn:
        conn.execute("SET wal_delivery.force_delete = on")
        assert conn.execute("DELETE FROM wal_delivery.topics WHERE name = %s", (topic,)).rowcount == 1


# ------------------------------------------------------------------ who processors run as

def test_the_worker_refuses_to_run_as_a_superuser(tmp_path, unique, workers):
    w = start(workers, tmp_path, "su", user="postgres")
    assert w.proc.wait(30) == 1
    assert "event=superuser_refused user=postgres" in w.output()

    # Re-checked at every connect: a worker whose login became a superuser exits at its
    # next reconnect.
    role = f"proc_becomes_su_{unique}"
    with connect() as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN IN ROLE wal_delivery_worker")
        try:
            w = start(workers, tmp_path, "later", user=role)
            w.wait_ready(30)
            conn.execute(f"ALTER ROLE {role} SUPERUSER")
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
            assert w.proc.wait(30) == 1
            assert f"event=superuser_refused user={role}" in w.output()
        finally:
            conn.execute(f"DROP ROLE {role}")


SQL_WHO = """
CREATE OR REPLACE FUNCTION proc_test.whoami(p bytea) RETURNS bytea LANGUAGE sql AS $$
    SELECT convert_to(jsonb_build_object('current_user', current_user, 'session_user', session_user)::text, 'UTF8')
$$;
CREATE OR REPLACE FUNCTION proc_test.make_me_superuser(p bytea) RETURNS bytea LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('ALTER ROLE %I SUPERUSER', session_user);
    RETURN p;
END $$;
CREATE OR REPLACE FUNCTION proc_test.reset_role_then_superuser(p bytea) RETURNS bytea LANGUAGE plpgsql AS $$
BEGIN
    RESET ROLE;
    EXECUTE format('ALTER ROLE %I SUPERUSER', session_user);
    RETURN p;
END $$"""


def test_processors_run_as_the_processing_role_and_cannot_make_anyone_superuser(tmp_path, unique,
                                                                                workers):
    """Issue 15.3: an admin's processor ran ALTER ROLE ... SUPERUSER with the worker's
    superuser rights. Processors run as wal_delivery_processor; one that resets its role
    gets the worker's own, which is not a superuser: the attempt fails."""
    topics = {name: f"proc.who.{name}.{unique}" for name in ("whoami", "direct", "reset")}
    with connect() as conn:
        conn.execute(SQL_WHO)
        make_processing_topic(conn, topics["whoami"], "sql", "proc_test.whoami")
        make_processing_topic(conn, topics["direct"], "sql", "proc_test.make_me_superuser",
                              processing_max_attempts=1)
        make_processing_topic(conn, topics["reset"], "sql", "proc_test.reset_role_then_superuser",
                              processing_max_attempts=1)
        for t in topics.values():
            enqueue_json(conn, t, ["one"])
        start(workers, tmp_path, "p1")
        wait_all_stored(conn, topics["whoami"], 1, timeout=30)
        for name in ("direct", "reset"):
            wait_until(lambda: states(conn, topics[name]) == {"dead": 1}, 30, what=f"{name} dead")
        who = json.loads(conn.execute("SELECT convert_from(processed_payload, 'UTF8') FROM wal_delivery.outbox"
                                      " WHERE topic = %s", (topics["whoami"],)).fetchone()[0])
        errors = dict(conn.execute("SELECT topic, last_error FROM wal_delivery.dead_letters WHERE topic = ANY(%s)",
                                   ([topics["direct"], topics["reset"]],)).fetchall())
        superusers = conn.execute("SELECT rolname FROM pg_roles WHERE rolsuper AND rolname IN (%s, %s)",
                                  (WORKER_ROLE, "wal_delivery_processor")).fetchall()
    assert who == {"current_user": "wal_delivery_processor", "session_user": WORKER_ROLE}
    for name in ("direct", "reset"):
        assert "raised 42501" in errors[topics[name]], errors
    assert superusers == []


def test_a_processing_role_that_became_a_superuser_fails_the_attempt(tmp_path, unique, workers):
    role = f"proc_role_{unique}"
    topic = f"proc.badrole.{unique}"
    with connect() as conn:
        conn.execute(f"CREATE ROLE {role} NOLOGIN")
        conn.execute(f"GRANT {role} TO wal_delivery_worker")
        conn.execute(f"GRANT USAGE ON SCHEMA proc_test TO {role}")
        try:
            conn.execute("UPDATE wal_delivery.settings SET processing_role = %s", (role,))
            conn.execute(f"ALTER ROLE {role} SUPERUSER")
            make_processing_topic(conn, topic, "sql", "proc_test.wrap", processing_max_attempts=1)
            enqueue_json(conn, topic, ["one"])
            start(workers, tmp_path, "p1")
            wait_until(lambda: states(conn, topic) == {"dead": 1}, 30, what="the row dead")
            error = conn.execute("SELECT last_error FROM wal_delivery.dead_letters WHERE topic = %s",
                                 (topic,)).fetchone()[0]
            assert f'role "{role}" is a superuser' in error
        finally:
            conn.execute("UPDATE wal_delivery.settings SET processing_role = DEFAULT")
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


# ------------------------------------------------------------------ HTTP answers

def vm_hwm_kb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_an_http_answer_is_read_only_up_to_the_topics_limit(tmp_path, unique, workers, destination):
    """Issue 15.6: every answer was buffered up to 100 MB whatever the topic allowed (792 MB
    of memory for 8 rows). An answer over max_payload_bytes fails its attempt as soon as it
    passes the limit, and the worker's memory stays small."""
    topic = f"proc.huge.{unique}"
    destination.behave(path="/transform", body_bytes=50_000_000)
    with connect() as conn:
        make_processing_topic(conn, topic, "http", destination.url + "/transform", max_payload_bytes=100_000,
                              processing_max_attempts=1, processing_timeout="30 seconds")
        enqueue_json(conn, topic, [f"k{i}" for i in range(8)])
        w = start(workers, tmp_path, "p1")
        wait_until(lambda: states(conn, topic) == {"dead": 8}, 60, what="8 dead rows")
        errors = [r[0] for r in conn.execute("SELECT last_error FROM wal_delivery.dead_letters WHERE topic = %s",
                                             (topic,))]
    peak_mb = vm_hwm_kb(w.proc.pid) / 1024
    assert all("over the topic's max_payload_bytes (100000)" in e for e in errors), errors
    assert peak_mb < 60, f"the worker peaked at {peak_mb:.0f} MB for 8 answers of 50 MB"
    report(f"process, 8 HTTP answers of 50 MB over a 100 kB topic limit: worker peak RSS {peak_mb:.0f} MB")
