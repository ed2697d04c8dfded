"""Spans over OTLP/HTTP: what wal_delivery sends arrives at a real OTLP receiver
(tests/otlp_receiver.py, which decodes each request with the opentelemetry-proto package's
own ExportTraceServiceRequest), and a collector that is down or hangs costs a counter, not
latency.

The workers' exporter (common/otlp_exporter) is driven by tests/c/otlp_exporter_check.c
through the delivery attempts' span (common/attempt_span), as consume and retry drive it; the relay's spans come from the running extension with
wal_delivery.otlp_endpoint set."""
import json
import re
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Consumer

from conftest import connect
from relay_helpers import ensure_extension, make_topic, server_log, wait_all_stored, wait_until

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from otlp_receiver import OtlpReceiver, attributes  # noqa: E402

SOURCES = ["tests/c/otlp_exporter_check.c", "src/workers/common/attempt_span.c",
           "src/workers/common/otlp_exporter.c", "src/workers/common/webhook.c",
           "src/workers/common/header_lines.c", "src/workers/common/metrics.c",
           "src/workers/common/log.c", "src/workers/common/text_buffer.c",
           "src/shared/otlp_span.c", "src/shared/utf8.c", "src/shared/trace_context.c"]
DRIVER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PRODUCER, CLIENT = 4, 3
STATUS_OK, STATUS_ERROR = 1, 2


@pytest.fixture
def receiver():
    r = OtlpReceiver().start()
    yield r
    r.stop()


def closed_port():
    """A port nothing listens on: bound once, then let go."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(text, name, labels=""):
    m = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.M)
    assert m, f"{name}{labels} not in /metrics:\n{text}"
    return float(m.group(1))


# ---------------------------------------------------------------- the workers' exporter

@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    out = tmp_path_factory.mktemp("otlp") / "otlp_exporter_check"
    built = subprocess.run(["cc", "-O2", "-Wall", "-Wextra", "-Werror", "-Isrc/workers", "-Isrc",
                            "-DWAL_DELIVERY_VERSION=\"test\"", *SOURCES, "-lcurl", "-ljansson",
                            "-lcrypto", "-lpthread", "-lm", "-o", str(out)],
                           cwd=ROOT, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    return str(out)


def run_driver(driver, endpoint, n_spans, linger_ms):
    out = subprocess.run([driver, endpoint, str(n_spans), str(linger_ms)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), out.stderr


def test_worker_spans_arrive_decoded_with_their_attributes(driver, receiver):
    result, _ = run_driver(driver, receiver.endpoint, 700, 1500)
    spans = receiver.spans()
    sampled = [i for i in range(1, 701) if i % 7 != 0]  # span id i: attempt i - 1
    assert not receiver.rejected
    assert len(spans) == len(sampled) == 600
    assert len(receiver.requests) >= 2, "600 spans are more than one batch of 512"
    resource, first = spans[0]
    assert resource == {"service.name": "wal-worker", "service.version": "test",
                        "wal.role": "consume"}
    by_id = {int.from_bytes(s.span_id, "big"): s for _, s in spans}
    assert sorted(by_id) == sampled, "every sampled attempt's span once, with its own span id"
    for span in by_id.values():
        assert span.trace_id == bytes.fromhex(DRIVER_TRACE)
        assert span.parent_span_id == bytes.fromhex("00f067aa0ba902b7")
        assert span.name == "wal_delivery deliver" and span.kind == CLIENT
        assert span.end_time_unix_nano - span.start_time_unix_nano == 2_000_000  # 2 ms
        assert abs(span.end_time_unix_nano / 1e9 - time.time()) < 60
    ok, failed = by_id[1], by_id[3]
    assert attributes(ok) == {"wal.topic": "orders", "wal.destination": "billing",
                              "wal.attempt": 1, "wal.retry_step": 0,
                              "wal.idempotency_key": 'k-"quoted"-\u00e9',
                              "http.response.status_code": 200, "wal.outcome": "success"}
    assert ok.status.code == STATUS_OK and ok.status.message == ""
    assert attributes(failed)["http.response.status_code"] == 503
    assert attributes(failed)["wal.outcome"] == "transient"
    assert failed.status.code == STATUS_ERROR
    # The byte that is not UTF-8 became "?": the body stays valid JSON.
    assert failed.status.message == '503 "busy"\nretry ? later'
    assert metric(result["metrics"], "wal_otlp_spans_exported_total") == 600
    assert metric(result["metrics"], "wal_otlp_spans_dropped_total",
                  '{reason="export_failed"}') == 0


def test_worker_export_to_a_down_collector_costs_a_counter_not_latency(driver):
    result, log = run_driver(driver, f"http://127.0.0.1:{closed_port()}", 350, 1500)
    # Recording never waits for the network (a generous bound: a copy under a mutex).
    assert result["record_max_s"] < 0.05, result
    assert result["stop_s"] < 4, result
    text = result["metrics"]
    assert metric(text, "wal_otlp_spans_exported_total") == 0
    assert metric(text, "wal_otlp_spans_dropped_total", '{reason="export_failed"}') == 300  # sampled
    assert metric(text, "wal_otlp_export_requests_failed_total") >= 1
    assert log.count("event=otlp_export_failed") == 1, "a down collector is one log line"


def test_worker_export_to_a_hung_collector_never_holds_up_the_caller(driver, receiver):
    receiver.set_behaviour("hang")
    result, _ = run_driver(driver, receiver.endpoint, 7000, 500)  # 6000 sampled
    assert receiver.posts >= 1, "the request was sent and left unanswered"
    assert result["record_max_s"] < 0.05, result
    # The request in flight times out (2 s); nothing more is tried for a failing collector.
    assert result["stop_s"] < 4, result
    text = result["metrics"]
    dropped = {r: metric(text, "wal_otlp_spans_dropped_total", f'{{reason="{r}"}}')
               for r in ("queue_full", "export_failed", "shutdown")}
    assert metric(text, "wal_otlp_spans_exported_total") == 0
    assert dropped["queue_full"] >= 6000 - 4096 - 512, "the bounded queue filled and dropped"
    assert sum(dropped.values()) == 6000, dropped


# ---------------------------------------------------------------- the relay's spans

def set_endpoint(conn, endpoint):
    """Sets wal_delivery.otlp_endpoint (NULL: resets it) and waits for the relay to take it."""
    before = server_log().count("wal_delivery relay: exporting spans to" if endpoint else
                                "wal_delivery relay: span export is off")
    if endpoint:
        conn.execute(f"ALTER SYSTEM SET wal_delivery.otlp_endpoint = '{endpoint}'")
    else:
        conn.execute("ALTER SYSTEM RESET wal_delivery.otlp_endpoint")
    conn.execute("SELECT pg_reload_conf()")
    needle = "wal_delivery relay: exporting spans to" if endpoint else \
        "wal_delivery relay: span export is off"
    wait_until(lambda: server_log().count(needle) > before, 30, what=f"the relay to log {needle!r}")


@pytest.fixture
def relay_topic(unique):
    ensure_extension()
    topic = f"otlp_{unique}"
    with connect() as conn:
        make_topic(conn, topic)
        wait_until(lambda: conn.execute("SELECT in_kafka FROM wal_delivery.kafka_topics"
                                        " WHERE topic = %s", (topic,)).fetchone() == (True,),
                   60, what=f"topic {topic} in Kafka")
    yield topic
    with connect() as conn:
        conn.execute("ALTER SYSTEM RESET wal_delivery.otlp_endpoint")
        conn.execute("SELECT pg_reload_conf()")


def traceparent(trace_id, parent_id, sampled=True):
    return f"00-{trace_id}-{parent_id}-{'01' if sampled else '00'}"


def enqueue(conn, topic, key, headers=None):
    conn.execute("SELECT wal_enqueue(%s, '{}'::jsonb, %s, NULL, %s::jsonb)",
                 (topic, key, json.dumps(headers) if headers is not None else None))


def span_export(conn):
    return conn.execute("SELECT * FROM wal_delivery.relay_span_export()").fetchone()


def kafka_offsets(bootstrap, topic, n):
    """{idempotency key: (partition, offset)} of the first n messages of topic."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "otlp-" + uuid.uuid4().hex,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    found, deadline = {}, time.time() + 30
    try:
        while len(found) < n and time.time() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                key = dict(msg.headers())["idempotency-key"].decode()
                found.setdefault(key, (msg.partition(), msg.offset()))
    finally:
        consumer.close()
    return found


def test_the_relay_span_continues_the_records_trace(relay_topic, receiver, kafka_bootstrap):
    trace, unsampled_trace = uuid.uuid4().hex, uuid.uuid4().hex
    parent = uuid.uuid4().hex[:16]
    with connect() as conn:
        set_endpoint(conn, receiver.endpoint)
        exported0 = span_export(conn)[0]
        enqueue(conn, relay_topic, "sampled", {"traceparent": traceparent(trace, parent)})
        enqueue(conn, relay_topic, "unsampled",
                {"traceparent": traceparent(unsampled_trace, parent, sampled=False)})
        enqueue(conn, relay_topic, "no-context", {"other": "x"})
        # The header's name is not case-sensitive (the record contract).
        enqueue(conn, relay_topic, "capitalised", {"Traceparent": traceparent(trace, "1" * 16)})
        wait_all_stored(conn, relay_topic, 4)
        created = dict(conn.execute(
            "SELECT idempotency_key, (extract(epoch FROM created_at) * 1000000)::bigint"
            "  FROM wal_delivery.outbox WHERE topic = %s", (relay_topic,)).fetchall())
        ours = wait_until(lambda: [s for _, s in receiver.spans() if s.trace_id.hex() == trace]
                          if len([1 for _, s in receiver.spans()
                                  if s.trace_id.hex() == trace]) == 2 else None,
                          30, what="the relay's two spans of the sampled trace")
        # Counted once the relay has read the collector's answer, just after it arrived.
        wait_until(lambda: span_export(conn)[0] - exported0 >= 2, 10,
                   what="the exported spans counted in relay_span_export()")
    offsets = kafka_offsets(kafka_bootstrap, relay_topic, 4)
    assert not receiver.rejected
    assert not [s for _, s in receiver.spans() if s.trace_id.hex() == unsampled_trace]
    of_topic = [s for _, s in receiver.spans()
                if attributes(s)["messaging.destination.name"] == relay_topic]
    assert len(of_topic) == 2, "no span for the unsampled record nor the one without"
    resource = receiver.spans()[0][0]
    assert resource["service.name"] == "wal_delivery" and resource["wal.role"] == "relay"
    by_key = {attributes(s)["wal.idempotency_key"]: s for s in ours}
    span = by_key["sampled"]
    assert span.parent_span_id == bytes.fromhex(parent)
    assert by_key["capitalised"].parent_span_id == bytes.fromhex("1" * 16)
    assert span.span_id not in (b"\0" * 8, bytes.fromhex(parent), by_key["capitalised"].span_id)
    assert span.name == "wal_delivery relay" and span.kind == PRODUCER
    assert span.status.code == STATUS_OK
    # From enqueue (the outbox's created_at) to Kafka's acknowledgement.
    assert span.start_time_unix_nano == created["sampled"] * 1000
    assert span.start_time_unix_nano < span.end_time_unix_nano < time.time_ns()
    partition, offset = offsets["sampled"]
    attrs = attributes(span)
    assert attrs["messaging.destination.name"] == relay_topic
    assert attrs["messaging.destination.partition.id"] == str(partition)
    assert attrs["messaging.kafka.offset"] == offset
    assert attrs["messaging.system"] == "kafka"


def stored_within(conn, topic, key, seconds):
    """Enqueues key and says how long until the outbox shows it stored."""
    started = time.time()
    enqueue(conn, topic, key, {"traceparent": traceparent(uuid.uuid4().hex, "2" * 16)})
    wait_until(lambda: conn.execute("SELECT state FROM wal_delivery.outbox WHERE topic = %s"
                                    " AND idempotency_key = %s", (topic, key)).fetchone()
               == ("stored",), seconds * 10, interval=0.02, what=f"{key} stored")
    return time.time() - started


@pytest.mark.parametrize("collector", ["down", "hung"])
def test_a_collector_that_is_down_or_hangs_costs_a_counter_not_latency(relay_topic, receiver,
                                                                       collector):
    with connect() as conn:
        enqueue(conn, relay_topic, "warm-up")  # the topic's first produce fetches metadata
        wait_all_stored(conn, relay_topic, 1)
        if collector == "hung":
            receiver.set_behaviour("hang")
            set_endpoint(conn, receiver.endpoint)
        else:
            set_endpoint(conn, f"http://127.0.0.1:{closed_port()}")
        failed0 = span_export(conn)
        # Records go on one by one, each in far less than a hung request's 2 s timeout,
        # across several export attempts (one a second at most).
        waits = [stored_within(conn, relay_topic, f"r{i}", 1.5) for i in range(12)]
        for _ in range(6):
            waits.append(stored_within(conn, relay_topic, f"late{len(waits)}", 1.5))
            time.sleep(0.3)
        assert max(waits) < 1.5, f"records waited {max(waits):.2f} s: {waits}"
        wait_until(lambda: span_export(conn)[4] > failed0[4], 15,
                   what="a failed export request counted")
        after = span_export(conn)
    assert after[2] > failed0[2], "the failed request's spans are counted as dropped"
    assert after[0] == failed0[0]
    if collector == "hung":
        assert receiver.posts >= 1 and not receiver.requests


def test_export_off_sends_nothing(relay_topic, receiver):
    with connect() as conn:
        set_endpoint(conn, receiver.endpoint)
        enqueue(conn, relay_topic, "on", {"traceparent": traceparent(uuid.uuid4().hex, "3" * 16)})
        wait_until(lambda: receiver.posts >= 1, 30, what="the span of the record sent while on")
        set_endpoint(conn, None)
        posts = receiver.posts
        for i in range(20):
            enqueue(conn, relay_topic, f"off-{i}",
                    {"traceparent": traceparent(uuid.uuid4().hex, "3" * 16)})
        wait_all_stored(conn, relay_topic, 21)
        time.sleep(2.5)  # past the relay's one-second batching, twice
    assert receiver.posts == posts, "a relay with the endpoint reset sent spans"


def test_the_endpoint_setting_refuses_what_is_not_an_http_url(db):
    ensure_extension()
    for bad, why in [("ftp://collector:4318", "http:// or https://"), ("http://", "no host"),
                     ("http://host:4318/a b", "space")]:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as e:
            db.execute(f"ALTER SYSTEM SET wal_delivery.otlp_endpoint = '{bad}'")
        assert why in str(e.value.diag.message_detail), e.value.diag.message_detail
        assert "127.0.0.1:4318" in e.value.diag.message_hint


# ---------------------------------------------------------------- the workers' attempt spans

@pytest.fixture
def fleet(tmp_path, kafka_bootstrap):
    from retry_helpers import Fleet
    f = Fleet(tmp_path, kafka_bootstrap)
    yield f
    f.stop_all()


@pytest.mark.usefixtures("clean_destinations")
def test_each_attempt_is_a_span_of_the_records_trace(tmp_path, fleet, receiver, unique):
    from conftest import Destination
    from consumer_helpers import add_destination, wait_published
    from retry_helpers import attempt_of

    topic, name = f"otlp.attempts.{unique}", f"otlp-flaky-{unique}"
    trace, parent = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    unsampled = uuid.uuid4().hex
    flaky = Destination(tmp_path)
    flaky.behave(status=503, times=2)  # consume's attempt and retry step 1 fail, step 2 works
    try:
        with connect() as conn:
            make_topic(conn, topic)
            add_destination(conn, name, flaky.url + "/in", [topic],
                            retry_delays="{1 second,1 second,1 second}")
            wait_published(conn)
            set_endpoint(conn, receiver.endpoint)
        workers = [fleet.start(role, "--otlp-endpoint", receiver.endpoint)
                   for role in ("consume", "retry")]
        for w in workers:
            w.wait_ready()
        with connect() as conn:
            enqueue(conn, topic, "sampled", {"traceparent": traceparent(trace, parent)})
        wait_until(lambda: [r for r in flaky.requests("/in") if r["status"] == 200], 60,
                   what="the third attempt's 200")
        with connect() as conn:
            enqueue(conn, topic, "unsampled",
                    {"traceparent": traceparent(unsampled, parent, sampled=False)})
        flaky.wait_for(4, "/in")

        def attempt_spans():
            return [s for _, s in receiver.spans()
                    if s.trace_id.hex() == trace and s.name == "wal_delivery deliver"]
        wait_until(lambda: len(attempt_spans()) == 3, 30, what="three attempt spans")
        time.sleep(1.5)  # the unsampled record's attempt, were it exported, would be in by now
        assert not receiver.rejected
        assert not [s for _, s in receiver.spans() if s.trace_id.hex() == unsampled]
        sent = {r["headers"]["traceparent"].split("-")[2]: r
                for r in flaky.requests("/in") if trace in r["headers"].get("traceparent", "")}
        assert len(sent) == 3
        by_attempt = {}
        for span in attempt_spans():
            attrs = attributes(span)
            # The span is the attempt the destination saw: the span id in its traceparent.
            request = sent[span.span_id.hex()]
            assert attrs["wal.attempt"] == attempt_of(request)
            by_attempt[attrs["wal.attempt"]] = (span, attrs)
            assert span.parent_span_id == bytes.fromhex(parent)
            assert span.kind == CLIENT
            assert span.start_time_unix_nano <= span.end_time_unix_nano  # ms: a local answer may take 0
            assert attrs["wal.topic"] == topic and attrs["wal.destination"] == name
            assert attrs["wal.idempotency_key"] == "sampled"
        assert sorted(by_attempt) == [1, 2, 3]
        for attempt, step, status in ((1, 0, 503), (2, 1, 503), (3, 2, 200)):
            span, attrs = by_attempt[attempt]
            assert attrs["wal.retry_step"] == step
            assert attrs["http.response.status_code"] == status
            if status == 503:
                assert span.status.code == STATUS_ERROR and "503" in span.status.message
                assert attrs["wal.outcome"] == "transient"
            else:
                assert span.status.code == STATUS_OK and attrs["wal.outcome"] == "success"
        resources = {r["wal.role"] for r, s in receiver.spans() if s.trace_id.hex() == trace}
        assert resources == {"relay", "consume", "retry"}, "the relay's span is in the trace too"
        for w in workers:  # counted once the worker has read the collector's answer
            wait_until(lambda: w.metric("wal_otlp_spans_exported_total") >= 1, 10,
                       what="the worker's exported spans counted")
    finally:
        flaky.stop()
