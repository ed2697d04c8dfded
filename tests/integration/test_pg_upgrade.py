"""pg_upgrade of a Postgres 15 cluster with wal_delivery installed and records waiting, to
the Postgres under test (docs/operations.md, "Upgrading Postgres").

The old cluster runs Debian 12's Postgres 15 (15.18: tests/deps/postgres-15-before says why
not 15.20) with the extension built from this checkout for 15, installed into a copy of
that server (what is installed machine-wide is left alone). Some
records ship to Kafka before the upgrade; then Kafka is out of the old cluster's reach
and more records wait: in the log outbox (a plain topic), and in the row table (a topic
with a processor: some processed and waiting to ship, some not processed yet). pg_upgrade
moves the cluster to the new major version; after ALTER EXTENSION ... UPDATE the new
relays ship every waiting record, and none that shipped before the upgrade ships again
(a clean stop leaves nothing in flight, so at-least-once allows no second copy here).

It runs when the server under test is not 15 (make PG=17 test-core; CI does)."""
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg
import pytest

from conftest import ROOT
from consumer_helpers import free_port
from relay_helpers import read_topic, wait_until

OLD_MAJOR = "15"
SYSTEM_PG15_CONFIG = "/usr/lib/postgresql/15/bin/pg_config"
NEW_PG_CONFIG = os.environ.get("PG_CONFIG") or "pg_config"


def pg_config(binary, what):
    return subprocess.run([binary, what], check=True, capture_output=True, text=True).stdout.strip()


def new_major():
    return pg_config(NEW_PG_CONFIG, "--version").split()[1].split(".")[0]


pytestmark = pytest.mark.skipif(
    new_major() == OLD_MAJOR,
    reason="upgrades Postgres 15 to the server under test, which is 15 here: "
           "runs in make PG=17 test-core")


def as_postgres(cmd, **kw):
    """Postgres refuses to run as root; the tests do (as tests/env, they use postgres)."""
    if os.geteuid() == 0:
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout}\n{done.stderr}"
    return done


def build_old_extension(tmp):
    """Debian 12's Postgres 15 of tests/deps/postgres-15-before (see there why not the
    installed 15.20), copied into tmp, with the extension of this checkout built for 15
    and installed into the copy. Returns the copy's bin directory."""
    before = ROOT / ".cache/pg15-before"
    assert (before / "version").is_file(), "no .cache/pg15-before: run PG=17 tests/setup"
    shutil.copytree(before, tmp / "pg15", symlinks=True)
    prefix = tmp / "pg15"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           check=True, capture_output=True, text=True).stdout.split("\0")
    src = tmp / "src"
    for f in filter(None, files):
        if (ROOT / f).is_file() and not f.startswith((".cache/", "bench/", "docs/")):
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, src / f)
    env = {k: v for k, v in os.environ.items() if k not in ("PG", "PGBIN", "RDKAFKA", "MAKEFLAGS")}
    subprocess.run(["make", "-s", "-j2", f"PG_CONFIG={SYSTEM_PG15_CONFIG}", "wal_delivery.so",
                    "build/wal_delivery--" + extension_version() + ".sql"],
                   cwd=src, env=env, check=True, capture_output=True)
    shutil.copy2(src / "wal_delivery.so", prefix / "usr/lib/postgresql/15/lib")
    for script in [src / "wal_delivery.control", *(src / "build").glob("wal_delivery--*.sql"),
                   *(src / "sql/releases").glob("*.sql"), *(src / "sql/updates").glob("*.sql")]:
        shutil.copy2(script, prefix / "usr/share/postgresql/15/extension")
    return prefix / "usr/lib/postgresql/15/bin"


def extension_version():
    for line in (ROOT / "wal_delivery.control").read_text().splitlines():
        if line.startswith("default_version"):
            return line.split("'")[1]
    raise AssertionError("no default_version in wal_delivery.control")


class Cluster:
    """A cluster of our own, run by the postgres OS user, on a free port."""

    def __init__(self, bindir, datadir, sockdir):
        self.bin, self.data, self.sock, self.port = Path(bindir), datadir, sockdir, free_port()

    def init(self, bootstrap):
        as_postgres([str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
                     "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"])
        self.configure(bootstrap)

    def configure(self, bootstrap):
        conf = Path(self.data) / "postgresql.auto.conf"
        conf.write_text(
            f"listen_addresses = '127.0.0.1'\nport = {self.port}\n"
            f"unix_socket_directories = '{self.sock}'\n"
            "shared_preload_libraries = 'wal_delivery'\nmax_worker_processes = 16\n"
            "wal_delivery.database = 'wal_delivery'\nwal_delivery.reconcile_interval = '2s'\n"
            "wal_delivery.maintenance_interval = '2s'\nwal_delivery.relay_delivery_timeout = '5s'\n"
            "wal_delivery.relay_max_backoff = '2s'\n"
            f"wal_delivery.kafka_bootstrap_servers = '{bootstrap}'\n")
        if os.geteuid() == 0:
            shutil.chown(conf, "postgres")

    def start(self):
        as_postgres([str(self.bin / "pg_ctl"), "-D", str(self.data), "-l",
                     str(Path(self.data).parent / (Path(self.data).name + ".log")), "-w", "start"])

    def stop(self):
        as_postgres([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"])

    def connect(self, dbname="wal_delivery"):
        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=dbname,
                               autocommit=True)


def enqueue(conn, topic, keys):
    for key in keys:
        conn.execute("SELECT wal_enqueue(%s, %s::text, %s)", (topic, f"payload of {key}", key))


def process_rows(conn, topic, count):
    """Does what wal-worker process does for a SQL processor, through the same calls:
    claims rows and completes them with their processed payload."""
    done = 0
    while done < count:
        rows = conn.execute("SELECT id, lease_token, payload FROM wal_delivery.claim_for_processor(%s)"
                            " WHERE topic = %s", (count - done, topic)).fetchall()
        assert rows, f"no {topic} rows to process after {done} of {count}"
        for row_id, token, payload in rows:
            conn.execute("SELECT wal_delivery.complete_processing(%s, %s, %s)",
                         (row_id, token, b"processed " + payload))
        done += len(rows)


def counts(conn, topic):
    return dict(conn.execute("SELECT state::text, count(*) FROM wal_delivery.outbox WHERE topic = %s"
                             " GROUP BY 1", (topic,)).fetchall())


@pytest.fixture
def workdir():
    """A directory the postgres user can reach (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="wal-pg-upgrade-"))
    path.chmod(0o755)
    yield path
    if os.environ.get("KEEP_PG_UPGRADE") is None:
        shutil.rmtree(path, ignore_errors=True)


def test_pg_upgrade_from_15_ships_every_waiting_record_once(workdir, kafka_bootstrap, unique):
    tmp_path, work = workdir, workdir / "clusters"
    work.mkdir()
    if os.geteuid() == 0:
        shutil.chown(work, "postgres")
    old = Cluster(build_old_extension(tmp_path), work / "old", work)
    new = Cluster(pg_config(NEW_PG_CONFIG, "--bindir"), work / "new", work)
    log_topic, row_topic = f"upg-log-{unique}", f"upg-rows-{unique}"
    shipped = [f"before-{i}" for i in range(50)]
    waiting_log = [f"log-{i}" for i in range(300)]
    waiting_ready = [f"ready-{i}" for i in range(40)]
    waiting_pending = [f"pending-{i}" for i in range(40)]

    # The old cluster: ships some records, then waits with Kafka out of reach.
    old.init(kafka_bootstrap)
    as_postgres([str(old.bin / "postgres"), "--single", "-D", str(old.data), "template1"],
                input="CREATE DATABASE wal_delivery\n")
    old.start()
    try:
        with old.connect() as conn:
            conn.execute("CREATE EXTENSION wal_delivery")
            conn.execute("CREATE FUNCTION public.mark(p bytea) RETURNS bytea LANGUAGE sql"
                         " AS $$ SELECT 'x'::bytea || p $$")
            for name, extra in ((log_topic, ""), (row_topic, ", processor_kind, processor")):
                values = ", 'sql', 'public.mark'" if extra else ""
                conn.execute(f"INSERT INTO wal_delivery.topics (name, partitions, replication_factor,"
                             f" min_insync_replicas{extra}) VALUES (%s, 2, 1, 1{values})", (name,))
            enqueue(conn, log_topic, shipped)
        before = read_topic(kafka_bootstrap, log_topic, shipped, timeout=90)
        assert set(before) == set(shipped)
        old.stop()
        old.configure("127.0.0.1:1")  # nothing listens there: records wait
        old.start()
        with old.connect() as conn:
            enqueue(conn, log_topic, waiting_log)
            enqueue(conn, row_topic, waiting_ready + waiting_pending)
            process_rows(conn, row_topic, len(waiting_ready))
            assert counts(conn, row_topic) == {"processed": len(waiting_ready),
                                               "pending": len(waiting_pending)}
            [ext_version] = conn.execute(
                "SELECT extversion FROM pg_extension WHERE extname = 'wal_delivery'").fetchone()
    finally:
        old.stop()

    # pg_upgrade, as the docs say: the new cluster made with the new server's initdb and
    # the same settings, then pg_upgrade run by the postgres user from a directory it owns.
    new.init(kafka_bootstrap)
    as_postgres([str(new.bin / "pg_upgrade"),
                 "--old-bindir", str(old.bin), "--new-bindir", str(new.bin),
                 "--old-datadir", str(old.data), "--new-datadir", str(new.data),
                 "--old-port", str(old.port), "--new-port", str(new.port),
                 "--socketdir", str(work), "--username", "postgres"], cwd=work)

    new.start()
    try:
        with new.connect() as conn:
            conn.execute("ALTER EXTENSION wal_delivery UPDATE")
            [now_version, server] = conn.execute(
                "SELECT extversion, current_setting('server_version_num')::int / 10000"
                " FROM pg_extension WHERE extname = 'wal_delivery'").fetchone()
            assert now_version == ext_version and str(server) == new_major()
            process_rows(conn, row_topic, len(waiting_pending))
            wait_until(lambda: counts(conn, row_topic) == {"stored": 80}, 90,
                       what=f"every row of {row_topic} stored (now {counts(conn, row_topic)})")
        log_seen = read_topic(kafka_bootstrap, log_topic, shipped + waiting_log, timeout=90)
        rows_seen = read_topic(kafka_bootstrap, row_topic, waiting_ready + waiting_pending, timeout=60)
    finally:
        new.stop()

    assert set(log_seen) == set(shipped + waiting_log), "log outbox records lost or foreign"
    assert set(rows_seen) == set(waiting_ready + waiting_pending), "row-table records lost"
    again = sorted(k for k in shipped if len(log_seen[k]) > 1)
    assert not again, f"shipped before the upgrade and again after it: {again[:10]}"
    twice = sorted(k for k, copies in {**log_seen, **rows_seen}.items() if len(copies) > 1)
    assert not twice, f"records shipped twice across a clean upgrade: {twice[:10]}"
    for key in waiting_ready + waiting_pending:
        assert rows_seen[key][0]["value"] == f"processed payload of {key}".encode()
