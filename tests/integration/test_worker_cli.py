"""wal-worker's command line: help for every role, clear errors for bad options."""
import subprocess
from pathlib import Path

import pytest

WORKER = str(Path(__file__).resolve().parents[2] / "bin" / "wal-worker")


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
