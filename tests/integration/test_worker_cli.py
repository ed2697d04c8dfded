"""wal-worker's command line: its version, help for every role (what dlq and process do), clear
errors for bad options, the admin port and -X as typed."""
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from relay_helpers import ensure_extension

ROOT = Path(__file__).resolve().parents[2]
WORKER = str(ROOT / "bin" / "wal-worker")


def run(*args):
    return subprocess.run([WORKER, *args], capture_output=True, text=True, timeout=10)


def test_main_help_lists_every_role_and_common_option():
    out = run("--help")
    assert out.returncode == 0
    for word in ["consume", "retry", "dlq", "process", "--db", "-X NAME=VALUE",
                 "--admin-port", "--time-scale"]:
        assert word in out.stdout


@pytest.mark.parametrize("role", ["consume", "retry", "dlq", "process"])
def test_each_role_has_help(role):
    out = run(role, "--help")
    assert out.returncode == 0
    assert out.stdout.startswith(f"wal-worker {role}:")
    assert "What it does:" in out.stdout


@pytest.mark.parametrize("role, words", [
    ("dlq", ["group wal_delivery.dlq", "wal_delivery.dead_letters", "committed", "dlq_alert_url",
             "wal_dead_letter_alerts_total", "replay_dead_letter()", "retry step 1",
             "unresolved_dead_letters"]),
    ("process", ["lease", "fencing token", "SQL processors", "HTTP processors", "processing_backoff",
                 "processing_max_attempts", "dead letter", "Needs no Kafka", "superuser",
                 "processing_status"]),
])
def test_dlq_and_process_help_say_what_the_role_does(role, words):
    out = run(role, "--help").stdout
    what = out[out.index("What it does:"):out.index("Common options:")]
    for word in words:
        assert word in what, word


def test_version_is_the_extensions_default_version():
    control = (ROOT / "wal_delivery.control").read_text()
    version = re.search(r"^default_version\s*=\s*'([^']+)'", control, re.M).group(1)
    for flag in ("--version", "-V"):
        out = run(flag)
        assert out.returncode == 0 and out.stdout == f"wal-worker {version}\n", out
    assert "--version" in run("--help").stdout


@pytest.mark.parametrize("args, message", [
    (["nosuchrole"], "unknown role 'nosuchrole'"),
    (["consume", "-X", "no-equals"], "-X needs NAME=VALUE"),
    (["consume", "--admin-port", "99999"], "--admin-port must be a port number"),
    (["retry", "--time-scale", "0.5"], "--time-scale must be a number >= 1"),
    (["retry", "--destination", "a"], "--destination only applies to 'consume'"),
])
def test_bad_options_are_refused_with_a_clear_message(args, message):
    out = run(*args)
    assert out.returncode == 2
    assert message in out.stderr


def test_admin_port_zero_takes_a_free_port_and_logs_it_and_argv_stays_readable(kafka_bootstrap):
    ensure_extension()  # the worker starts its admin server once it has a config
    proc = subprocess.Popen([WORKER, "dlq", "--admin-port", "0", "--admin-listen", "127.0.0.1",
                             "-X", f"bootstrap.servers={kafka_bootstrap}", "-X", "client.id=cli-check"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        port = None
        deadline = time.monotonic() + 30
        while port is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            m = re.search(r"event=admin_server_started address=127\.0\.0\.1 port=(\d+)", line)
            port = int(m.group(1)) if m else None
        assert port, "no event=admin_server_started line"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            assert r.status == 200
        # ps shows the command line as typed, -X NAME=VALUE included.
        argv = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert b"client.id=cli-check" in argv
        assert f"bootstrap.servers={kafka_bootstrap}".encode() in argv
    finally:
        proc.terminate()
        proc.wait(10)


def test_admin_listen_must_be_an_address():
    out = run("dlq", "--admin-listen", "")
    assert out.returncode == 2 and "--admin-listen needs a numeric IP address" in out.stderr


def test_a_database_without_the_extension_is_named_as_such_not_as_unreachable():
    proc = subprocess.Popen([WORKER, "dlq", "--db", "dbname=postgres"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        line = ""
        deadline = time.monotonic() + 20
        while "event=no_config" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()
        assert "event=no_config" in line
        assert "has no wal_delivery extension" in line and "CREATE EXTENSION wal_delivery" in line
        assert "unreachable" not in line
    finally:
        proc.terminate()
        proc.wait(10)
