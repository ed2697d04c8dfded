"""The workers' admin HTTP server and metrics registry (src/workers/common/admin_server.c,
metrics.c), through the test driver tests/c/admin_server_check.c over real HTTP on
127.0.0.1: the /metrics text is valid Prometheus exposition with exact escaping, /healthz,
/readyz and /config answer as the worker's callbacks say, other paths and methods are
refused, /config needs the peer token, the listen address is the one asked for, idle
connections do not lock out health checks, a taken port is reported clearly, and
concurrent increments and scrapes lose nothing."""
import json
import os
import re
import socket
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from relay_helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]
INCREMENT_THREADS = 8  # as in the driver
TOKEN = "peer-token-0123456789"
WITH_TOKEN = {"Authorization": f"Bearer {TOKEN}"}

# Never through an http_proxy from the environment: the server is on loopback.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(scope="module")
def driver_binary(tmp_path_factory):
    binary = tmp_path_factory.mktemp("admin_server") / "admin_server_check"
    # The libmicrohttpd the workers build with (the Makefile's MHD_PREFIX): tests/setup's
    # 1.0 build when it is there, else the system's.
    mhd = ROOT / ".cache" / "libmicrohttpd"
    mhd_flags = ([f"-I{mhd / 'include'}"], [str(mhd / "lib" / "libmicrohttpd.a")]) \
        if (mhd / "lib" / "libmicrohttpd.a").exists() else ([], ["-lmicrohttpd"])
    out = subprocess.run(
        ["cc", "-Wall", "-Wextra", "-Werror", *mhd_flags[0], "-Isrc/workers", "-Isrc",
         "tests/c/admin_server_check.c", "src/workers/common/metrics.c",
         "src/workers/common/text_buffer.c", "src/workers/common/admin_server.c",
         "src/workers/common/file_limit.c",
         "src/workers/common/http_framing.c", "src/workers/common/listen_socket.c",
         "src/workers/common/log.c", "src/shared/utf8.c",
         *mhd_flags[1], "-lpthread", "-o", str(binary)],
        cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, f"the driver does not compile:\n{out.stderr}"
    return binary


class Driver:
    """A running admin_server_check."""

    def __init__(self, binary, ready_file, port=0, increments_per_thread=1000,
                 address=None, token=TOKEN):
        env = {k: v for k, v in os.environ.items() if not k.startswith("ADMIN_CHECK_")}
        if address:
            env["ADMIN_CHECK_ADDRESS"] = address
        if token:
            env["ADMIN_CHECK_TOKEN"] = token
        self.proc = subprocess.Popen(
            [str(binary), str(port), str(ready_file), str(increments_per_thread)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline()
        host = address or "127.0.0.1"
        if not line.startswith(f"listening on {host}:"):
            self.proc.kill()
            raise RuntimeError(f"driver did not start: {line!r} {self.proc.stderr.read()!r}")
        self.port = int(line.rsplit(":", 1)[1])
        self.url = f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def get(self, path, method="GET", data=None, headers=None):
        return http(self.url + path, method, data, headers)

    def stop(self):
        """SIGTERM; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


@pytest.fixture
def start_driver(driver_binary, tmp_path):
    drivers = []

    def start(**kw):
        d = Driver(driver_binary, tmp_path / "ready", **kw)
        drivers.append(d)
        return d

    yield start
    for d in drivers:
        d.stop()


def http(url, method="GET", data=None, headers=None):
    """(status, headers, body) also for 4xx/5xx answers."""
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with OPENER.open(req, timeout=10) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


# ---------------------------------------------------------------- a Prometheus text parser

METRIC_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
SAMPLE = re.compile(rf"^({METRIC_NAME})(?:\{{(.*)\}})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(,|$)')
VALUE = re.compile(r"^(?:[+-]?Inf|NaN|[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)$")


def unescape(text, quote):
    """Undoes the exposition format's escapes; anything else after a backslash is invalid."""
    escapes = {"\\": "\\", "n": "\n"} | ({'"': '"'} if quote else {})
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\":
            assert text[i + 1:i + 2] in escapes, f"bad escape in {text!r}"
            out.append(escapes[text[i + 1]])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def parse_prometheus(text):
    """{name: {"help", "type", "samples": {labels tuple: value}}}, asserting the text
    follows the exposition format 0.0.4: each family's HELP and TYPE once, before its
    samples, samples of a family together, valid names, escapes and values."""
    assert text.endswith("\n"), "the exposition must end with a newline"
    families, current = {}, None
    for line in text[:-1].split("\n"):
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            keyword, rest = line[2:6], line[7:]
            name, _, value = rest.partition(" ")
            assert re.fullmatch(METRIC_NAME, name), line
            family = families.setdefault(name, {"samples": {}})
            key = keyword.lower()
            assert key not in family, f"second {keyword} for {name}"
            assert not family["samples"], f"{keyword} after samples of {name}"
            if key == "help":
                family["help"] = unescape(value, quote=False)
            else:
                assert value in {"counter", "gauge", "histogram", "summary", "untyped"}, line
                family["type"] = value
            current = name
            continue
        assert not line.startswith("#") or line.startswith("# "), line
        if line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, label_text, value = m.groups()
        assert name == current, f"sample {name} outside its family {current}"
        assert "type" in families[name], f"sample {name} before its TYPE"
        labels = []
        while label_text:
            lm = LABEL.match(label_text)
            assert lm, f"bad labels in {line!r}"
            labels.append((lm.group(1), unescape(lm.group(2), quote=True)))
            label_text = label_text[lm.end():]
        assert VALUE.match(value), f"bad value in {line!r}"
        key = tuple(labels)
        assert key not in families[name]["samples"], f"duplicate series {line!r}"
        families[name]["samples"][key] = float(value)
    return families


# ---------------------------------------------------------------- the tests

EXPECTED_FIXED_METRICS = """\
# HELP admin_check_deliveries_total Deliveries by destination and outcome.
# TYPE admin_check_deliveries_total counter
admin_check_deliveries_total{destination="say \\"hi\\"",outcome="ok"} 3
admin_check_deliveries_total{destination="back\\\\slash",outcome="ok"} 1.5
admin_check_deliveries_total{destination="new\\nline",outcome="failed"} 2
# HELP admin_check_breaker_open Whether a destination's breaker is open.\\nOne line per \
destination, path C:\\\\x
# TYPE admin_check_breaker_open gauge
admin_check_breaker_open{destination="plain"} 1.25
admin_check_breaker_open{destination="ünïcode"} -2.5
# HELP admin_check_up 1 while the driver runs.
# TYPE admin_check_up gauge
admin_check_up 1
# HELP admin_check_untouched_total Never incremented.
# TYPE admin_check_untouched_total counter
admin_check_untouched_total 0
# HELP admin_check_increments_total Increments by the SIGUSR1 threads.
# TYPE admin_check_increments_total counter
"""


def test_metrics_are_prometheus_text_with_exact_escaping(start_driver):
    d = start_driver()
    status, headers, body = d.get("/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    text = body.decode("utf-8")
    assert text == EXPECTED_FIXED_METRICS

    families = parse_prometheus(text)
    deliveries = families["admin_check_deliveries_total"]
    assert deliveries["type"] == "counter"
    # The parsed label values are the driver's own strings, byte for byte; the -5 it
    # added to the first series was ignored (a counter never goes down).
    assert deliveries["samples"] == {
        (("destination", 'say "hi"'), ("outcome", "ok")): 3.0,
        (("destination", "back\\slash"), ("outcome", "ok")): 1.5,
        (("destination", "new\nline"), ("outcome", "failed")): 2.0,
    }
    breaker = families["admin_check_breaker_open"]
    assert breaker["type"] == "gauge"
    assert breaker["help"] == ("Whether a destination's breaker is open.\n"
                               "One line per destination, path C:\\x")
    assert breaker["samples"] == {(("destination", "plain"),): 1.25,
                                  (("destination", "ünïcode"),): -2.5}
    # A metric without labels shows its series from the start; a labelled one only once used.
    assert families["admin_check_untouched_total"]["samples"] == {(): 0.0}
    assert families["admin_check_increments_total"]["samples"] == {}

    # A query string does not change the path.
    status, _, body = d.get("/metrics?format=text")
    assert status == 200 and body.decode() == text


def test_healthz_readyz_and_config_follow_the_callbacks(start_driver, tmp_path):
    d = start_driver()
    ready_file = tmp_path / "ready"

    status, _, body = d.get("/healthz")
    assert (status, body) == (200, b"ok\n")

    status, _, body = d.get("/readyz")
    assert (status, body) == (503, b"not ready\n")
    status, _, _ = d.get("/config", headers=WITH_TOKEN)
    assert status == 503

    ready_file.touch()
    status, _, body = d.get("/readyz")
    assert (status, body) == (200, b"ready\n")
    status, headers, body = d.get("/config", headers=WITH_TOKEN)
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body) == {"role": "admin-check", "time_scale": 10,
                                "note": 'quote " backslash \\ accent é'}

    ready_file.unlink()
    status, _, _ = d.get("/readyz")
    assert status == 503
    status, _, _ = d.get("/healthz")
    assert status == 200


@pytest.mark.parametrize("path", ["/", "/metric", "/metrics/", "/healthz/x", "/admin/config"])
def test_unknown_paths_are_404(start_driver, path):
    d = start_driver()
    status, _, body = d.get(path)
    assert (status, body) == (404, b"not found\n")


@pytest.mark.parametrize("method, data", [("POST", b"x" * 100000), ("POST", None),
                                          ("PUT", b"{}"), ("DELETE", None)])
def test_methods_other_than_get_are_405(start_driver, method, data):
    d = start_driver()
    for path in ["/metrics", "/readyz", "/nowhere"]:
        status, headers, body = d.get(path, method, data)
        assert (status, body) == (405, b"method not allowed\n")
        assert headers["Allow"] == "GET, HEAD"
    # The server still answers afterwards.
    assert d.get("/healthz")[0] == 200


def test_head_is_get_without_a_body(start_driver):
    d = start_driver()
    status, headers, body = d.get("/metrics", "HEAD")
    assert status == 200 and body == b""
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")


def test_listens_on_loopback_by_default(start_driver):
    d = start_driver()
    listening = []
    for table in ["/proc/net/tcp", "/proc/net/tcp6"]:
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, port = local.split(":")
            if state == "0A" and int(port, 16) == d.port:
                listening.append(address)
    assert listening == ["0100007F"]  # 127.0.0.1, and no IPv6 socket


def test_a_taken_port_is_refused_with_a_clear_message(start_driver, driver_binary, tmp_path):
    first = start_driver()
    second = subprocess.run([str(driver_binary), str(first.port), str(tmp_path / "ready")],
                            capture_output=True, text=True, timeout=10)
    assert second.returncode == 1
    assert (f"admin_server_check: cannot listen on 127.0.0.1:{first.port}: Address already in use"
            in second.stderr)
    assert first.get("/healthz")[0] == 200


def test_stop_frees_the_port_for_the_next_server(start_driver):
    first = start_driver()
    # A scrape leaves a connection behind in TIME_WAIT; the next server binds anyway.
    assert first.get("/metrics")[0] == 200
    assert first.stop() == 0
    assert first.proc.stdout.read() == "stopped\n"
    second = start_driver(port=first.port)
    assert second.port == first.port
    assert second.get("/healthz")[0] == 200


def test_concurrent_increments_and_scrapes_lose_nothing(start_driver):
    increments_per_thread = 20000
    total = increments_per_thread * INCREMENT_THREADS
    d = start_driver(increments_per_thread=increments_per_thread)
    stop = threading.Event()
    errors, seen = [], [[] for _ in range(4)]

    def scrape(values):
        try:
            while not stop.is_set():
                status, _, body = d.get("/metrics")
                assert status == 200
                samples = parse_prometheus(body.decode())["admin_check_increments_total"]["samples"]
                values.append(samples.get((("thread", "all"),), 0.0))
        except Exception as e:  # reported below, with the thread's own traceback lost
            errors.append(repr(e))

    scrapers = [threading.Thread(target=scrape, args=(values,)) for values in seen]
    for t in scrapers:
        t.start()
    try:
        deadline = time.time() + 10
        while min(len(v) for v in seen) < 3 and time.time() < deadline and not errors:
            time.sleep(0.01)
        d.proc.send_signal(signal.SIGUSR1)
        line = d.proc.stdout.readline()  # the driver's threads have all joined
        assert line == f"increments done {total}\n", f"driver: {line!r} {d.proc.poll()}"
        # Each scraper gets one more scrape in, after the last increment.
        after = [len(v) for v in seen]
        wait_until(lambda: errors or all(len(v) > n for v, n in zip(seen, after)), 30,
                   what="a scrape by every scraper after the increments")
    finally:
        stop.set()
        for t in scrapers:
            t.join(30)

    assert not errors, errors
    assert d.proc.poll() is None, "the driver died"
    for values in seen:
        assert values == sorted(values), "a counter went down between scrapes"
    # The scrapes really ran while the threads were incrementing.
    assert any(0 < v < total for values in seen for v in values), \
        f"no scrape saw a partial count ({sum(map(len, seen))} scrapes)"

    families = parse_prometheus(d.get("/metrics")[2].decode())
    increments = families["admin_check_increments_total"]["samples"]
    assert increments[(("thread", "all"),)] == total
    for i in range(INCREMENT_THREADS):
        assert increments[(("thread", str(i)),)] == increments_per_thread
        assert families["admin_check_last_increment"]["samples"][(("thread", str(i)),)] == \
            increments_per_thread
    assert d.stop() == 0


def test_config_needs_the_peer_token(start_driver, tmp_path):
    (tmp_path / "ready").touch()
    d = start_driver()
    for headers in ({}, {"Authorization": "Bearer wrong-token-0123456"},
                    {"Authorization": f"Bearer {TOKEN}x"}, {"Authorization": f"Bearer {TOKEN[:-1]}"},
                    {"Authorization": TOKEN}, {"Authorization": "Bearer "}):
        status, _, body = d.get("/config", headers=headers)
        assert status == 401, headers
        assert b"admin-check" not in body
    status, _, body = d.get("/config", headers=WITH_TOKEN)
    assert status == 200 and json.loads(body)["role"] == "admin-check"
    # The rest of the admin port needs no token: probes and scrapers do not carry one.
    assert d.get("/healthz")[0] == 200 and d.get("/metrics")[0] == 200


def test_config_is_not_served_without_a_configured_token(start_driver, tmp_path):
    (tmp_path / "ready").touch()
    d = start_driver(token=None)
    for headers in ({}, {"Authorization": "Bearer "}, WITH_TOKEN):
        status, _, body = d.get("/config", headers=headers)
        assert status == 403, headers
        assert b"WAL_PEER_TOKEN" in body and b"admin-check" not in body


@pytest.mark.parametrize("address", ["127.0.0.2", "::1"])
def test_listens_on_the_address_asked_for(start_driver, address):
    d = start_driver(address=address)
    assert d.get("/healthz")[0] == 200
    # Not on the default loopback address (for ::1, 127.0.0.1 is another family).
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", d.port), timeout=2).close()


def test_a_name_instead_of_an_address_is_refused(driver_binary, tmp_path):
    env = dict(os.environ, ADMIN_CHECK_ADDRESS="localhost")
    proc = subprocess.run([str(driver_binary), "0", str(tmp_path / "ready")], env=env,
                          capture_output=True, text=True, timeout=10)
    assert proc.returncode == 1
    assert "cannot listen on localhost:0: not a numeric IP address" in proc.stderr


def test_idle_connections_do_not_lock_out_health_checks(start_driver):
    d = start_driver()
    idle = [socket.create_connection(("127.0.0.1", d.port), timeout=5) for _ in range(300)]
    try:
        # Half of them begin a request and never finish it.
        for s in idle[::2]:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        assert d.get("/healthz")[0] == 200
        assert time.monotonic() - started < 1.0
    finally:
        for s in idle:
            s.close()
