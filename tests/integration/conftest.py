"""Fixtures shared by the integration tests: the running environment (tests/env), database
connections, Kafka clients and sample HTTP destinations. Everything here talks to real
servers on 127.0.0.1; nothing is mocked."""
import json
import os
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = ROOT / "tests" / "env"


def load_env():
    """The environment's settings: from the process (tests/run exports them) or tests/env."""
    if os.environ.get("PGPORT") and os.environ.get("WAL_ENV_DIR"):
        return
    out = subprocess.run([str(ENV), "print"], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.exit('no test environment: run eval "$(tests/env up)" or make test', 2)
    for line in out.stdout.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        os.environ[key] = value.strip("'")


load_env()


def server_has_pg_cron():
    """Whether the server under test has pg_cron: Debian 12's 15 has; the Postgres 17 of
    tests/deps/postgres has none when Debian 13's pg-cron source cannot be downloaded
    (README, "Supported versions"), and tests/env then starts it without pg_cron."""
    config = os.environ.get("PG_CONFIG") or "pg_config"
    out = subprocess.run([config, "--pkglibdir"], capture_output=True, text=True)
    return out.returncode == 0 and (Path(out.stdout.strip()) / "pg_cron.so").is_file()


# For the tests of what pg_cron does: they cannot run on a server without it.
needs_pg_cron = pytest.mark.skipif(not server_has_pg_cron(),
                                   reason="this Postgres has no pg_cron (README, \"Supported versions\")")


@pytest.fixture(scope="session")
def kafka_bootstrap():
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    if not bootstrap:
        pytest.fail("the environment has no Kafka broker (started with --no-kafka?)")
    return bootstrap


def connect(dbname=None, **kw):
    kw.setdefault("autocommit", True)
    return psycopg.connect(dbname=dbname or os.environ["PGDATABASE"], **kw)


@pytest.fixture
def db():
    with connect() as conn:
        yield conn


def record_key(request):
    """The app's idempotency key of a request a destination received. A record is
    identified to destinations as "<topic>:<key>" (keys are unique per topic only):
    Idempotency-Key carries that, its topic being the X-Wal-Topic header."""
    headers = request["headers"]
    topic, identity = headers["x-wal-topic"], headers["idempotency-key"]
    assert identity.startswith(topic + ":"), f"Idempotency-Key {identity!r} is not {topic}:<key>"
    return identity[len(topic) + 1:]


@pytest.fixture
def unique():
    """A short unique suffix for topic, table and destination names."""
    return uuid.uuid4().hex[:10]


class Destination:
    """A running tests/destination.py on 127.0.0.1."""

    def __init__(self, tmp_path):
        self.proc = subprocess.Popen(
            ["python3", str(ROOT / "tests" / "destination.py"), "--port", "0",
             "--log", str(tmp_path / "destination.jsonl")],
            stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            self.proc.kill()
            raise RuntimeError(f"destination did not start: {line!r}")
        self.url = "http://" + line.split()[-1]

    def control(self, path, value=None):
        data = None if value is None else json.dumps(value).encode()
        req = urllib.request.Request(self.url + "/_control/" + path, data=data,
                                     method="GET" if data is None else "POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def behave(self, **behaviour):
        self.control("behaviour", behaviour)

    def requests(self, path=""):
        return self.control("requests?path=" + path if path else "requests")

    def wait_for(self, count, path="", timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            got = self.requests(path)
            if len(got) >= count:
                return got
            time.sleep(0.1)
        raise AssertionError(f"destination got {len(self.requests(path))} requests, wanted {count}")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture
def clean_destinations():
    """No destinations before and after the test: worker tests share one database, and a
    leftover subscription would send another test's records to a stopped server."""
    from consumer_helpers import reset_destinations  # they import this module
    from relay_helpers import ensure_extension

    ensure_extension()
    reset_destinations()
    yield
    reset_destinations()


@pytest.fixture
def destination(tmp_path):
    d = Destination(tmp_path)
    yield d
    d.stop()


def env_cmd(*args, env_dir=None, check=True, timeout=300):
    env = dict(os.environ)
    if env_dir:
        env["WAL_ENV_DIR"] = str(env_dir)
    out = subprocess.run([str(ENV), *args], capture_output=True, text=True, env=env, timeout=timeout)
    if check and out.returncode != 0:  # with tests/env's own words, which say why
        raise AssertionError(f"tests/env {' '.join(args)} exited {out.returncode}:\n"
                             f"{out.stdout[-2000:]}{out.stderr[-4000:]}")
    return out
