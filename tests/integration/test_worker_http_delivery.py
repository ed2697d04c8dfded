"""The workers' HTTP delivery engine (common/http_delivery) and Standard Webhooks signing,
response classes and Retry-After (common/webhook), driven by tests/c/http_delivery_check.c
against the real sample destination (tests/destination.py). Needs no Postgres or Kafka."""
import base64
import hashlib
import hmac
import json
import os
import socket
import subprocess
import time
from email.utils import formatdate
from pathlib import Path

import pytest

from conftest import Destination

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["tests/c/http_delivery_check.c", "src/workers/common/http_delivery.c",
           "src/workers/common/file_limit.c",
           "src/workers/common/webhook.c", "src/workers/common/header_lines.c",
           "src/workers/common/log.c", "src/shared/utf8.c"]


def build_driver(out, extra_flags=()):
    return subprocess.run(
        ["cc", *extra_flags, "-Wall", "-Wextra", "-Werror", "-Isrc/workers", "-Isrc", *SOURCES,
         "-lcurl", "-lcrypto", "-o", str(out)],
        cwd=ROOT, capture_output=True, text=True)


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    out = tmp_path_factory.mktemp("http_delivery") / "http_delivery_check"
    built = build_driver(out)
    assert built.returncode == 0, built.stderr
    return str(out)


def run(driver, base_url, scenario, *args, env=None, timeout=90):
    """Runs the driver; returns its JSON lines (and fails on a non-zero exit)."""
    out = subprocess.run([driver, base_url, scenario, *map(str, args)], capture_output=True,
                         text=True, timeout=timeout, env=env)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def deliveries(driver, base_url, *args):
    """The driver's "done" lines and its summary for a "requests" run."""
    lines = run(driver, base_url, "requests", *args)
    [summary] = [x for x in lines if x["event"] == "summary"]
    assert summary["pending"] == 0 and summary["completed"] == summary["submitted"]
    return [x for x in lines if x["event"] == "done"], summary


def one(driver, base_url, *args):
    [done], _ = deliveries(driver, base_url, *args)
    return done


def python_signature(secret, msg_id, timestamp, body: bytes):
    """Standard Webhooks v1, computed independently of the C code."""
    if secret.startswith("whsec_"):
        encoded = secret.removeprefix("whsec_")
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    else:
        key = secret.encode()
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- signing, unit level

@pytest.mark.parametrize("secret, msg_id, timestamp, body", [
    # The example published with the Standard Webhooks spec.
    ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330,
     '{"test": 2432232314}'),
    # Padded and unpadded base64 keys (EVP_DecodeBlock counts padding as bytes).
    ("whsec_" + base64.b64encode(b"k" * 31).decode(), "order-42-created", 1700000000, "{}"),
    ("whsec_" + base64.b64encode(b"k" * 32).decode().rstrip("="), "id", 1, "x"),
    ("whsec_" + base64.b64encode(bytes(range(34))).decode(), "id", 1700000001, "Zoë ✓"),
    # No whsec_ prefix: the secret's raw bytes are the key.
    ("plain-secret", "msg_1", 1700000002, '{"a":1}'),
    ("whsec_c2VjcmV0", "empty-body", 1700000003, ""),
])
def test_signature_matches_an_independent_python_hmac(driver, secret, msg_id, timestamp, body):
    [got] = run(driver, "-", "sign", "--secret", secret, "--msg-id", msg_id,
                "--timestamp", timestamp, "--body", body)
    assert got["ok"] is True
    assert got["signature"] == python_signature(secret, msg_id, timestamp, body.encode())


def test_signature_of_the_spec_example_is_the_published_one(driver):
    [got] = run(driver, "-", "sign", "--secret", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                "--msg-id", "msg_p5jXN8AQM9LWM0D4loKWxJek", "--timestamp", 1614265330,
                "--body", '{"test": 2432232314}')
    assert got["signature"] == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


@pytest.mark.parametrize("secret", ["", "whsec_", "whsec_!!!notbase64", "whsec_a", "whsec_ab=c"])
def test_a_bad_secret_signs_nothing(driver, secret):
    [got] = run(driver, "-", "sign", "--secret", secret, "--msg-id", "m", "--timestamp", 1,
                "--body", "{}")
    assert got == {"ok": False, "signature": ""}


# ---------------------------------------------------------------- classes and Retry-After

@pytest.mark.parametrize("curl_code, status, transient, outcome", [
    (0, 200, None, "success"),
    (0, 204, None, "success"),
    (0, 301, None, "permanent"),
    (0, 400, None, "permanent"),
    (0, 404, None, "permanent"),
    (0, 408, None, "transient"),
    (0, 425, None, "transient"),
    (0, 429, None, "transient"),
    (0, 500, None, "transient"),
    (0, 503, None, "transient"),
    (7, 0, None, "transient"),       # CURLE_COULDNT_CONNECT
    (28, 0, None, "transient"),      # CURLE_OPERATION_TIMEDOUT
    (28, 200, None, "transient"),    # timed out reading the body of an answer
    (0, 404, "404", "transient"),
    (0, 503, "404", "permanent"),    # a list replaces the default, it does not extend it
    (0, 503, "4XX,5XX", "transient"),
    (0, 429, "", "permanent"),       # an empty list: no status is transient
    (0, 200, "", "success"),
    (0, 418, "bogus,4x,41", "permanent"),
])
def test_classification(driver, curl_code, status, transient, outcome):
    args = ["--curl-code", curl_code, "--status", status]
    if transient is not None:
        args += ["--transient", transient]
    assert run(driver, "-", "classify", *args) == [{"outcome": outcome}]


NOW = 1_700_000_000


@pytest.mark.parametrize("value, seconds", [
    ("120", 120),
    (" 7 ", 7),
    ("0", 0),
    ("99999999999999999999", 2**31 - 1),
    (formatdate(NOW + 30, usegmt=True), 30),                                  # IMF-fixdate
    (time.strftime("%A, %d-%b-%y %H:%M:%S GMT", time.gmtime(NOW + 45)), 45),  # RFC 850
    (time.strftime("%a %b %e %H:%M:%S %Y", time.gmtime(NOW + 60)), 60),       # asctime
    (formatdate(NOW - 300, usegmt=True), 0),                                  # already past
    ("", -1),
    ("soon", -1),
    ("-5", -1),
    ("1.5", -1),
    ("12abc", -1),
])
def test_retry_after_parsing(driver, value, seconds):
    assert run(driver, "-", "retry-after", "--value", value, "--now", NOW) == [{"seconds": seconds}]


# ---------------------------------------------------------------- against a real destination

@pytest.mark.parametrize("status, outcome", [
    (200, "success"), (201, "success"), (400, "permanent"), (422, "permanent"),
    (503, "transient"), (408, "transient"),
])
def test_answer_status_gives_its_class(driver, destination, status, outcome):
    destination.behave(status=status)
    got = one(driver, destination.url, "--path", "/status")
    assert (got["status"], got["curl_code"], got["outcome"]) == (status, 0, outcome)
    assert got["error"] == ("" if outcome == "success" else f"HTTP {status}")
    assert json.loads(got["response_excerpt"]) == {"status": status}


def test_429_is_transient_and_its_retry_after_is_honoured(driver, destination):
    destination.behave(status=429, headers={"Retry-After": "7"}, times=1)
    destination.behave(path="/date", status=429,
                       headers={"Retry-After": formatdate(time.time() + 30, usegmt=True)})
    got = one(driver, destination.url, "--path", "/seconds")
    assert (got["status"], got["outcome"]) == (429, "transient")
    assert (got["retry_after"], got["retry_after_s"]) == ("7", 7)

    got = one(driver, destination.url, "--path", "/date")
    assert got["outcome"] == "transient"
    assert 27 <= got["retry_after_s"] <= 31

    got = one(driver, destination.url, "--path", "/plain")
    assert (got["status"], got["retry_after"], got["retry_after_s"]) == (200, None, -1)


def test_connection_refused_is_transient(driver):
    got = one(driver, f"http://127.0.0.1:{closed_port()}", "--path", "/x")
    assert (got["status"], got["curl_code"], got["outcome"]) == (0, 7, "transient")
    assert "connect" in got["error"].lower()


def test_a_hung_destination_times_out_as_transient(driver, destination):
    destination.behave(hang=True)
    got = one(driver, destination.url, "--path", "/hang", "--timeout-ms", 500)
    assert (got["status"], got["curl_code"], got["outcome"]) == (0, 28, "transient")
    assert 450 <= got["elapsed_ms"] < 3000
    assert "timed out" in got["error"].lower()


def test_a_custom_transient_list_changes_the_class(driver, destination):
    destination.behave(path="/missing", status=404)
    destination.behave(path="/down", status=503)
    assert one(driver, destination.url, "--path", "/missing")["outcome"] == "permanent"
    assert one(driver, destination.url, "--path", "/missing",
               "--transient", "404")["outcome"] == "transient"
    assert one(driver, destination.url, "--path", "/down",
               "--transient", "404")["outcome"] == "permanent"


def most_at_once(requests, hold_s):
    """The most requests the destination worked on at once: each holds [arrival, +hold_s)."""
    arrivals = sorted(r["arrived_at"] for r in requests)
    return max(sum(1 for b in arrivals if a - hold_s < b <= a) for a in arrivals)


@pytest.fixture
def other_destination(tmp_path):
    (tmp_path / "other").mkdir()
    d = Destination(tmp_path / "other")
    yield d
    d.stop()


def test_concurrency_limit_holds_and_does_not_block_another_destination(
        driver, destination, other_destination):
    # Two servers, as in production: the sample server's listen backlog is only 5, so 8
    # simultaneous connects to one of them would stall on SYN retries, not on the engine.
    destination.behave(path="/slow", delay_ms=300)
    lines = run(driver, destination.url, "two-destinations", "--count", 20,
                "--fast-count", 5, "--max-in-flight", 4, "--fast-url", other_destination.url)
    done = [x for x in lines if x["event"] == "done"]
    [summary] = [x for x in lines if x["event"] == "summary"]
    slow = sorted((x for x in done if x["destination"] == "slow"), key=lambda x: x["t_ms"])
    fast = [x for x in done if x["destination"] == "fast"]
    assert len(slow) == 20 and len(fast) == 5
    assert all(x["outcome"] == "success" for x in done)

    # The engine never had more than 4 of "slow" in flight, and used all 4.
    assert summary["max_in_flight_seen"]["slow"] == 4
    # The destination agrees: at most 4 slow requests at once, in about 5 waves of 300 ms.
    seen = destination.requests("/slow")
    assert len(seen) == 20
    assert most_at_once(seen, 0.3) == 4
    assert slow[-1]["t_ms"] >= 5 * 300 - 100
    assert max(x["queued_ms"] for x in slow) >= 3 * 300 - 100

    # "fast" was submitted behind 16 waiting "slow" requests yet started at once and was
    # done before the first queued "slow" request could finish.
    assert max(x["queued_ms"] for x in fast) < 100
    assert max(x["t_ms"] for x in fast) < slow[4]["t_ms"]
    assert len(other_destination.requests("/fast")) == 5

    # Keep-alive: one connection per concurrent slot, reused across the waves.
    assert summary["new_connections"] <= 8


def test_keep_alive_reuses_one_connection_for_sequential_requests(driver, destination):
    done, summary = deliveries(driver, destination.url, "--path", "/seq", "--count", 10,
                               "--sequential")
    assert [x["index"] for x in done] == list(range(10))
    assert all(x["outcome"] == "success" for x in done)
    assert len(destination.requests("/seq")) == 10
    assert summary["new_connections"] == 1
    assert sum(x["new_connections"] == 0 for x in done) == 9


def test_a_freed_slot_sends_the_next_request_before_the_poll_returns(driver, destination):
    """A request that an answer's freed slot starts goes out in that same poll: a consumer's
    next turn (taking in records) must not keep it unsent while the destination idles."""
    lines = run(driver, destination.url, "requests", "--path", "/next", "--count", 3,
                "--max-in-flight", 1, "--hold-ms", 1500)
    holds = [x["wall_ms"] / 1000 for x in lines if x["event"] == "hold"]
    got = sorted(r["arrived_at"] for r in destination.requests("/next"))
    assert len(got) == 3 and len(holds) >= 2
    # The 2nd and 3rd requests arrived during the holds after the 1st and 2nd answers, not
    # after them (a poll that did not send them would leave them until the hold ended).
    assert got[1] < holds[0] + 1.0
    assert got[2] < holds[1] + 1.0

def test_method_headers_and_body_arrive_as_sent(driver, destination):
    body = '{"name": "Zoë", "note": "line\\nbreak", "n": 1}'
    got = one(driver, destination.url, "--path", "/orders/42?x=1", "--method", "PUT",
              "--header", "Content-Type: application/json; charset=utf-8",
              "--header", "Idempotency-Key: order-42-created",
              "--header", "X-Custom: a value, with: colons", "--body", body)
    assert got["outcome"] == "success"
    [req] = destination.requests("/orders/42")
    assert req["method"] == "PUT"
    assert req["path"] == "/orders/42?x=1"
    assert req["body"] == body
    h = req["headers"]
    assert h["content-type"] == "application/json; charset=utf-8"
    assert h["idempotency-key"] == "order-42-created"
    assert h["x-custom"] == "a value, with: colons"
    assert h["content-length"] == str(len(body.encode()))
    assert h["user-agent"] == "wal_delivery"
    assert "expect" not in h


def test_a_body_without_content_type_is_not_labelled_form_encoded(driver, destination):
    one(driver, destination.url, "--path", "/bare", "--body", "raw bytes")
    [req] = destination.requests("/bare")
    assert (req["method"], req["body"]) == ("POST", "raw bytes")
    assert "content-type" not in req["headers"]


@pytest.mark.parametrize("method", ["GET", "DELETE", "PATCH"])
def test_other_methods(driver, destination, method):
    args = ["--path", "/m", "--method", method]
    if method == "GET":
        args += ["--body", ""]
    assert one(driver, destination.url, *args)["outcome"] == "success"
    [req] = destination.requests("/m")
    assert req["method"] == method


def test_webhook_signature_verifies_in_python(driver, destination):
    secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    body = '{"order_id": 42, "total": "9.99"}'
    done, _ = deliveries(driver, destination.url, "--path", "/hooks", "--count", 3,
                         "--secret", secret, "--body", body)
    assert all(x["outcome"] == "success" for x in done)
    seen = destination.requests("/hooks")
    assert sorted(r["headers"]["webhook-id"] for r in seen) == ["msg_0", "msg_1", "msg_2"]
    for req in seen:
        h = req["headers"]
        assert abs(int(h["webhook-timestamp"]) - time.time()) < 60
        expected = python_signature(secret, h["webhook-id"], h["webhook-timestamp"],
                                    req["body"].encode())
        assert hmac.compare_digest(h["webhook-signature"], expected)
        # and a tampered body would not verify
        assert h["webhook-signature"] != python_signature(
            secret, h["webhook-id"], h["webhook-timestamp"], req["body"].encode() + b" ")


def test_freeing_the_engine_aborts_in_flight_and_waiting_requests(driver, destination):
    destination.behave(hang=True)
    lines = run(driver, destination.url, "abort", "--path", "/hang", "--count", 6,
                "--max-in-flight", 2, "--abort-after-ms", 400)
    events = [x["event"] for x in lines]
    assert events[0] == "freeing" and events[-1] == "freed"
    assert lines[0] == {"event": "freeing", "pending": 6, "in_flight": 2}
    done = [x for x in lines if x["event"] == "done"]
    assert sorted(x["index"] for x in done) == list(range(6))
    assert all(x["aborted"] and x["curl_code"] == 42 and x["status"] == 0 for x in done)
    assert all(x["error"].startswith("aborted") for x in done)
    started = [x for x in done if x["elapsed_ms"] > 0]
    assert len(started) == 2
    assert len(destination.requests("/hang")) == 2
    assert lines[-1] == {"event": "freed", "submitted": 6, "completed": 6}


def test_engine_is_clean_under_address_and_undefined_sanitizers(destination, tmp_path):
    out = tmp_path / "http_delivery_check_asan"
    built = build_driver(out, ["-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer"])
    if built.returncode != 0:
        pytest.skip(f"no sanitizer runtime here: {built.stderr[:200]}")
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    destination.behave(path="/slow", delay_ms=100)
    destination.behave(path="/hang", hang=True)
    secret = "whsec_" + base64.b64encode(b"s" * 24).decode()
    for scenario, *args in [
        ("two-destinations", "--count", 12, "--max-in-flight", 3),
        ("requests", "--path", "/seq", "--count", 5, "--sequential", "--secret", secret),
        ("requests", "--path", "/hang", "--timeout-ms", 200),
        ("abort", "--path", "/hang", "--count", 5, "--max-in-flight", 2),
    ]:
        res = subprocess.run([str(out), destination.url, scenario, *map(str, args)],
                             capture_output=True, text=True, timeout=60, env=env)
        assert res.returncode == 0, res.stderr
        assert "Sanitizer" not in res.stderr and "runtime error" not in res.stderr, res.stderr
