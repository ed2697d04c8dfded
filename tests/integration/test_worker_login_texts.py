"""Every text that tells an operator which role the workers log in as says
wal_delivery_worker: the help of each subcommand, the process worker's refusal of a
superuser, processing_session_problem()'s message, the README and the demo. An operator
who followed a text saying wal_delivery_admin would hand the worker (and, through a SQL
processor, anyone who owns one) the whole control plane (issue 29)."""
import re
import subprocess
from pathlib import Path

from conftest import connect
from consumer_helpers import WORKER
from relay_helpers import ensure_extension

ROOT = Path(__file__).resolve().parents[2]
# "Connect as / log in as / the login: ... a member of wal_delivery_admin" (an admin may
# still be called a member of wal_delivery_admin where the text is about admins).
WRONG = re.compile(r"(?:connect as|log in as|login|wal_worker`?,)[^.]{0,60}?member\s+of\s+`?wal_delivery_admin",
                   re.S | re.I)
SUBCOMMANDS = ["consume", "retry", "dlq", "process", "ingest"]


def help_text(*args):
    out = subprocess.run([WORKER, *args, "--help"], capture_output=True, text=True, timeout=30)
    return out.stdout + out.stderr


def test_the_help_texts_name_the_worker_role_never_the_admin_role():
    texts = {"wal-worker": help_text()} | {s: help_text(s) for s in SUBCOMMANDS}
    for name, text in texts.items():
        assert not WRONG.search(text), f"{name} --help tells operators to use the admin role"
    assert "member of wal_delivery_worker" in " ".join(texts["process"].split())


def test_the_messages_and_docs_name_the_worker_role_never_the_admin_role():
    ensure_extension()
    with connect() as conn:
        definition = conn.execute(
            "SELECT pg_get_functiondef('wal_delivery.processing_session_problem()'::regprocedure)"
        ).fetchone()[0]
    assert "member of wal_delivery_worker" in definition and not WRONG.search(definition)
    for path in ["src/workers/process/process.c", "src/workers/common/options.c", "README.md",
                 "demo/run", "docs/security.md", "docs/operations.md"]:
        text = (ROOT / path).read_text()
        assert not WRONG.search(text), f"{path} tells operators to make the worker an admin"
