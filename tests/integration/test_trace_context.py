"""Trace context end to end, with real Postgres, Kafka, workers and HTTP destinations: an
app's transaction sets wal_delivery.traceparent and enqueues; the relay writes the
record's traceparent to Kafka; every delivery attempt (the first try, each retry step,
the half-open probe, a replay from the dead letters) sends a traceparent with the
record's trace id and a span id of its own, and the record's tracestate; the dead
letter keeps the context. The ingest service takes the request's traceparent header.
Invalid values are refused at every door, and the workers' log lines about a record
carry its topic, key and trace id."""
import http.client
import json
import re

import pytest

from conftest import Destination, connect, record_key
from consumer_helpers import add_destination, wait_published
from consumer_helpers import Worker
from ingest_helpers import Ingest, post, send_record, setup_ingest, topics_with_token
from process_helpers import WORKER_ROLE, ensure_worker_role
from relay_helpers import make_topic, read_topic, wait_all_stored, wait_until
from retry_helpers import Fleet, attempt_of, dead_letters, destination_status, wait_breaker

pytestmark = pytest.mark.usefixtures("clean_destinations")

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
STATE = "vendor=abc,other=x"
TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


@pytest.fixture
def fleet(tmp_path, kafka_bootstrap):
    f = Fleet(tmp_path, kafka_bootstrap)
    yield f
    f.stop_all()


def enqueue_traced(topic, keys, traceparent=PARENT, tracestate=STATE):
    """An app's transaction that traces: SET LOCAL, then wal_enqueue as it always did."""
    with connect() as conn:
        with conn.transaction():
            conn.execute("SELECT set_config('wal_delivery.traceparent', %s, true)", (traceparent,))
            conn.execute("SELECT set_config('wal_delivery.tracestate', %s, true)", (tracestate,))
            for k in keys:
                conn.execute("SELECT wal_enqueue(%s, %s::jsonb, %s)", (topic, json.dumps({"k": k}), k))


def post_repeated(port, path, headers):
    """A request with the headers as given, a name twice included; (status, body text)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.putrequest("POST", path)
        for name, value in headers:
            c.putheader(name, value)
        c.putheader("Content-Length", "2")
        c.endheaders(b"{}")
        r = c.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        c.close()


def spans(requests, trace_id=TRACE_ID, flags="01"):
    """The span ids of requests, once each request is sure to continue the trace."""
    out = []
    for r in requests:
        m = TRACEPARENT.match(r["headers"].get("traceparent", ""))
        assert m, f"attempt {attempt_of(r)} sent no valid traceparent: {r['headers']}"
        assert m.group(1) == trace_id and m.group(3) == flags, r["headers"]["traceparent"]
        out.append(m.group(2))
    return out


def test_every_attempt_continues_the_trace_and_the_dead_letter_keeps_it(tmp_path, fleet, unique):
    topic, name = f"tc.steps.{unique}", f"tc-down-{unique}"
    down = Destination(tmp_path)
    down.behave(status=503)
    key = f"traced-{unique}"
    try:
        with connect() as conn:
            make_topic(conn, topic)
            # A configured traceparent gives way to the attempt's own: never two.
            add_destination(conn, name, down.url + "/in", [topic],
                            retry_delays="{1 second,1 second,1 second}",
                            headers={"TraceParent": "00-11111111111111111111111111111111-1111111111111111-01"})
            wait_published(conn)
        consume, retry, dlq = fleet.start_ready("consume", "retry", "dlq")
        enqueue_traced(topic, [key])
        with connect() as conn:
            wait_all_stored(conn, topic, 1)
        wait_until(lambda: len(dead_letters(name)) == 1, 60, what="the record in dead_letters")

        # The relay wrote the record's headers to Kafka unchanged.
        (msg,), = read_topic(fleet.bootstrap, topic, [key]).values()
        assert msg["headers"]["traceparent"] == PARENT and msg["headers"]["tracestate"] == STATE

        attempts = sorted(down.requests("/in"), key=lambda r: r["arrived_at"])
        assert [attempt_of(r) for r in attempts] == [1, 2, 3, 4]
        ids = spans(attempts)
        assert len(set(ids)) == 4 and "00f067aa0ba902b7" not in ids, \
            f"each attempt is a span of its own, not the enqueuing one: {ids}"
        assert all(r["headers"]["tracestate"] == STATE for r in attempts)

        # The dead letter keeps the context; its replay continues the same trace.
        dead_id = dead_letters(name)[0][3]
        with connect() as conn:
            letter = conn.execute("SELECT wal_delivery.inspect_dead_letter(%s)", (dead_id,)).fetchone()[0]
            assert letter["headers"]["traceparent"] == PARENT
            assert letter["headers"]["tracestate"] == STATE
            down.behave(status=200)
            conn.execute("SELECT wal_delivery.replay_dead_letter(%s)", (dead_id,))
        replayed = down.wait_for(5, "/in", timeout=30)
        replay = sorted(replayed, key=lambda r: r["arrived_at"])[-1]
        assert replay["status"] == 200 and record_key(replay) == key
        (replay_span,) = spans([replay])
        assert replay_span not in ids

        # The workers' lines about the record carry its topic, key and trace id.
        for worker, event in ((consume, "hand_off"), (retry, "hand_off"), (dlq, "dead_letter")):
            lines = [ln for ln in worker.output().splitlines() if f"event={event} " in ln and key in ln]
            assert lines, f"no event={event} line about {key} in {worker.log_path.name}"
            for ln in lines:
                fields = dict(re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', ln))
                assert fields.get("topic") == topic and fields.get("key") == key, ln
                assert fields.get("trace_id") == TRACE_ID, ln
    finally:
        down.stop()


def test_the_probe_of_a_paused_destination_continues_the_trace(tmp_path, fleet, unique):
    topic, name = f"tc.probe.{unique}", f"tc-probe-{unique}"
    down = Destination(tmp_path)
    down.behave(status=503)
    key = f"probed-{unique}"
    try:
        with connect() as conn:
            make_topic(conn, topic)
            add_destination(conn, name, down.url + "/p", [topic], pause_after_failures=1,
                            probe_interval="10 seconds", retry_delays="{1 second,1 second,1 second}")
            wait_published(conn)
        fleet.start_ready("consume", "retry", "dlq")
        # Sampled off (flags 00): the flags travel as the record has them.
        enqueue_traced(topic, [key], traceparent=f"00-{TRACE_ID}-00f067aa0ba902b7-00", tracestate="")
        wait_breaker(name, "open", timeout=30)
        wait_until(lambda: destination_status(name)["probes"] >= 1, 30, what="a probe")
        down.behave(status=200)
        wait_breaker(name, "closed", timeout=30)
        attempts = sorted(down.requests("/p"), key=lambda r: r["arrived_at"])
        assert len(attempts) >= 3, "the first try, step 1 and at least one probe"
        assert all(record_key(r) == key for r in attempts)
        ids = spans(attempts, flags="00")
        assert len(set(ids)) == len(ids)
        assert all("tracestate" not in r["headers"] for r in attempts), "an empty one is none"
    finally:
        down.stop()


def test_a_processed_record_keeps_the_trace_of_its_input(tmp_path, kafka_bootstrap, unique):
    """A processor's output is the same record (its processed payload): its headers, the
    trace context with them, reach Kafka with it."""
    topic, key = f"tc.proc.{unique}", f"processed-{unique}"
    with connect() as conn:
        ensure_worker_role(conn)
        conn.execute("CREATE OR REPLACE FUNCTION proc_test.trace_upper(p bytea) RETURNS bytea"
                     " LANGUAGE sql AS $$SELECT convert_to(upper(convert_from(p, 'UTF8')), 'UTF8')$$")
        make_topic(conn, topic, processor_kind="sql", processor="proc_test.trace_upper")
    enqueue_traced(topic, [key])
    w = Worker(tmp_path, "process", conninfo=f"user={WORKER_ROLE}")
    try:
        with connect() as conn:
            wait_all_stored(conn, topic, 1)
        (msg,), = read_topic(kafka_bootstrap, topic, [key]).values()
        assert msg["value"] == json.dumps({"k": key}).upper().encode()
        assert msg["headers"]["traceparent"] == PARENT and msg["headers"]["tracestate"] == STATE
    finally:
        w.stop()


def test_a_records_own_context_in_any_case_is_continued_and_none_sends_none(tmp_path, fleet, unique):
    topic, name = f"tc.none.{unique}", f"tc-none-{unique}"
    own_trace = "0af7651916cd43dd8448eb211c80319c"
    dest = Destination(tmp_path)
    try:
        with connect() as conn:
            make_topic(conn, topic)
            add_destination(conn, name, dest.url + "/n", [topic])
            wait_published(conn)
        fleet.start_ready("consume")
        with connect() as conn:
            conn.execute("SELECT wal_enqueue(%s, '{}'::jsonb, %s)", (topic, f"plain-{unique}"))
            # Header names ignore case: the relay writes "TraceParent" as given, and the
            # consumer reads it as the record's traceparent.
            conn.execute("SELECT wal_enqueue(%s, '{}'::jsonb, %s, headers => %s)",
                         (topic, f"own-{unique}",
                          json.dumps({"TraceParent": f"00-{own_trace}-b7ad6b7169203331-01",
                                      "TRACESTATE": "k=v"})))
        got = {record_key(r): r for r in dest.wait_for(2, "/n")}
        plain = got[f"plain-{unique}"]
        assert "traceparent" not in plain["headers"] and "tracestate" not in plain["headers"]
        own = got[f"own-{unique}"]
        (span,) = spans([own], trace_id=own_trace)
        assert span != "b7ad6b7169203331" and own["headers"]["tracestate"] == "k=v"
    finally:
        dest.stop()


def test_ingest_takes_the_request_context_and_refuses_a_bad_one(tmp_path, kafka_bootstrap, unique):
    with connect() as conn:
        setup_ingest(conn)
        (topic,), token = topics_with_token(conn, unique)
    ingest = Ingest(tmp_path, kafka_bootstrap)
    try:
        ingest.wait_listening()
        auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        own = f"00-{'a' * 32}-{'b' * 16}-01"
        # Single record: the request's context, unless the record brings its own.
        status, body, _ = post(ingest.port, f"/v1/topics/{topic}/records", b"{}",
                               {**auth, "Idempotency-Key": "i-1", "traceparent": PARENT, "tracestate": STATE})
        assert status == 201, body
        status, body, _ = send_record(ingest.port, topic, token, ikey="i-2",
                                      headers={"traceparent": own})
        assert status == 201, body
        # NDJSON batch: every line takes the request's context unless it has its own.
        lines = [{"value": {"n": 1}, "idempotency_key": "i-3"},
                 {"value": {"n": 2}, "idempotency_key": "i-4", "headers": {"TraceParent": own}}]
        status, body, _ = post(ingest.port, f"/v1/topics/{topic}/batch",
                               "\n".join(json.dumps(x) for x in lines).encode(),
                               {**auth, "Content-Type": "application/x-ndjson", "traceparent": PARENT})
        assert status in (200, 201), body
        seen = read_topic(kafka_bootstrap, topic, ["i-1", "i-2", "i-3", "i-4"])
        assert seen["i-1"][0]["headers"]["traceparent"] == PARENT
        assert seen["i-1"][0]["headers"]["tracestate"] == STATE
        assert seen["i-2"][0]["headers"]["traceparent"] == own
        assert seen["i-3"][0]["headers"]["traceparent"] == PARENT
        assert seen["i-4"][0]["headers"]["traceparent"] == own  # its own (names ignore case)

        # Bad values: 400 naming the problem, nothing stored.
        bad = {
            f"00-{TRACE_ID.upper()}-00f067aa0ba902b7-01": "trace id is not 32 lowercase hex",
            f"00-{'0' * 32}-00f067aa0ba902b7-01": "trace id is all zeros",
            f"00-{TRACE_ID}-{'0' * 16}-01": "parent id is all zeros",
            f"ff-{TRACE_ID}-00f067aa0ba902b7-01": "version ff is invalid",
            f"{PARENT}0": "exactly 55 characters",
        }
        for value, problem in bad.items():
            status, body, _ = post(ingest.port, f"/v1/topics/{topic}/records", b"{}",
                                   {**auth, "traceparent": value})
            assert status == 400 and problem in body["message"], (value, body)
            status, body, _ = send_record(ingest.port, topic, token, headers={"traceparent": value})
            assert status == 400 and problem in body["message"], (value, body)
        status, body, _ = post(ingest.port, f"/v1/topics/{topic}/records", b"{}",
                               {**auth, "traceparent": PARENT, "tracestate": "v" * 513})
        assert status == 400 and "longer than 512" in body["message"], body
        # A repeated header is refused, not merged (docs/security.md).
        status, body = post_repeated(ingest.port, f"/v1/topics/{topic}/records",
                                     [*auth.items(), ("traceparent", PARENT), ("traceparent", PARENT)])
        assert status == 400 and "traceparent" in body, body
    finally:
        ingest.stop()
