"""The README's quick start works as written on one Kafka broker: its SQL blocks (each
under a `<!-- quick start ... -->` line) run unchanged, as a superuser, in a fresh
one-broker environment of their own (no extension yet, every setting at its default). The
config is published, every topic is ready, a consume worker logged in as the quick start's
role becomes ready, and the enqueued record reaches Kafka. And the settings table of
docs/operations.md (the one table of wal_delivery.settings) documents every column, in
order."""
import re
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from conftest import env_cmd
from consumer_helpers import Worker
from relay_helpers import ensure_extension

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
OPERATIONS = (ROOT / "docs" / "operations.md").read_text()


def quick_start_blocks():
    return re.findall(r"^<!-- quick start[^\n]*-->\n```sql\n(.*?)^```$", README, re.M | re.S)


@pytest.fixture(scope="module")
def one_broker():
    """A fresh environment (Postgres and one Kafka broker) of this test's own: {PGPORT,
    KAFKA_BOOTSTRAP}."""
    env_dir = f"/tmp/wal_delivery-quickstart-{uuid.uuid4().hex[:8]}"
    try:
        out = env_cmd("up", "--brokers", "1", env_dir=env_dir).stdout
        yield dict(re.findall(r"^export (\w+)='?([^'\n]*)'?$", out, re.M))
    finally:
        env_cmd("down", env_dir=env_dir, check=False)


def psql(env, sql, *flags):
    out = subprocess.run(["psql", "-X", *flags, "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1",
                          "-p", env["PGPORT"], "-U", "postgres", "-d", "wal_delivery"], input=sql,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"{sql}\n{out.stderr}"
    return out.stdout


def wait_for(env, sql, want, timeout=60):
    deadline = time.monotonic() + timeout
    while (got := psql(env, sql, "-A", "-t").strip()) != want:
        assert time.monotonic() < deadline, f"{sql}: {got!r}, wanted {want!r}"
        time.sleep(0.5)


def test_quick_start_as_written_publishes_the_config_on_one_broker(one_broker, tmp_path):
    setup, check, enqueue = quick_start_blocks()
    assert "CREATE EXTENSION wal_delivery;" in setup and "wal_enqueue(" in enqueue

    psql(one_broker, setup)
    wait_for(one_broker, "SELECT in_sync FROM wal_delivery.config_status", "t")
    status = psql(one_broker, check)
    assert re.search(r"^ +(\d+) \| +\1 \| t$", status, re.M), status
    for topic in ("orders.events", "wal_delivery.dlq", "wal_delivery.retry.1", "wal_delivery.retry.2",
                  "wal_delivery.retry.3"):
        assert re.search(rf"^ {re.escape(topic)} +\| \w+ +\| t +\| +$", status, re.M), status

    # A worker starts on that config, logged in as the quick start's role (-X wins over
    # the quick start's kafka_bootstrap_servers, which names a broker this machine lacks).
    worker = Worker(tmp_path, "consume", kafka_bootstrap=one_broker["KAFKA_BOOTSTRAP"],
                    conninfo=f"host=127.0.0.1 port={one_broker['PGPORT']} dbname=wal_delivery user=wal_worker")
    try:
        deadline = time.monotonic() + 60
        while worker.get("/readyz")[0] != 200:
            assert worker.proc.poll() is None and time.monotonic() < deadline, worker.output()[-3000:]
            time.sleep(0.5)
    finally:
        worker.stop()

    psql(one_broker, enqueue)
    wait_for(one_broker, "SELECT state FROM wal_delivery.outbox WHERE idempotency_key = 'order-42-created'",
             "stored")


def test_operations_settings_table_documents_every_column_in_order(db):
    ensure_extension()
    columns = [r[0] for r in db.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = 'wal_delivery.settings'::regclass"
        " AND attnum > 0 AND NOT attisdropped AND attname <> 'singleton' ORDER BY attnum")]
    table = OPERATIONS[OPERATIONS.index("### `settings` (one row)"):]
    table = table[:table.index("\n\n", table.index("| column |"))]
    assert re.findall(r"^\| `(\w+)` \|", table, re.M) == columns
    # One table: no other document lists the settings' columns again.
    for doc in ("README.md", "docs/design.md", "docs/security.md", "CONTRIBUTING.md"):
        assert "| `retry_topic_prefix` |" not in (ROOT / doc).read_text(), doc
    assert OPERATIONS.count("| `retry_topic_prefix` |") == 1
