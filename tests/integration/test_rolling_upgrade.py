"""Upgrading in place while records flow (docs/operations.md, "Upgrading"): SQL writers
enqueue the whole time; the library is installed as a new file and Postgres restarted
(the new relays run the new file; a session started after the install, before the
restart, ran the old one), the extension is updated with ALTER EXTENSION ... UPDATE to a
synthetic next version, every worker is restarted one instance at a time (SIGTERM, a fresh start,
/readyz before the next), the update is rolled back, and every record whose
COMMIT returned reaches every subscribed destination at least once: delivered with a 2xx,
or, for a destination that refuses it, a dead letter written by the dlq worker.

The next version exists only for this test: its update script (and the one back) is
written into the extension directory of the server under test (the server reports it in
pg_config), and removed afterwards, so every other test sees the released version only."""
import os
import signal
import threading
import time
from pathlib import Path

import psycopg
import pytest

from conftest import Destination, connect, env_cmd, record_key
from consumer_helpers import Worker, add_destination, wait_published
from relay_helpers import connect_when_ready, relay_pids, report, wait_new_relay, wait_until

pytestmark = pytest.mark.usefixtures("clean_destinations")

TIME_SCALE = 10
SHUTDOWN_BOUND = 15  # seconds: docs/operations.md, "Fixed timings"
# Functions the relay and the writers call on every pass: the update replaces them
# (with their own text) while they are in use, as a real update that changes them would.
REPLACED = ["wal_delivery.claim_ready_to_ship", "wal_delivery.mark_stored",
            "wal_delivery.note_shipping_failures", "pg_catalog.wal_enqueue"]


class Writers:
    """Threads that each call wal_enqueue in its own transaction until stopped. A record
    counts as committed once COMMIT returned (autocommit: the call returned); its outbox
    id and key are kept. Errors are counted and retried with a new connection."""

    def __init__(self, topic, threads=2, pause=0.015):
        self.topic, self.pause = topic, pause
        self.committed, self.errors = {}, 0  # key -> outbox id
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                         for i in range(threads)]

    def _run(self, n):
        conn, i = None, 0
        while not self._stop.is_set():
            key = f"w{n}-{i}"
            try:
                if conn is None:
                    conn = connect()
                [outbox_id] = conn.execute("SELECT wal_enqueue(%s, %s::text, %s)",
                                           (self.topic, f"payload of {key}", key)).fetchone()
                with self._lock:
                    self.committed[key] = outbox_id
                i += 1
            except psycopg.Error:
                with self._lock:
                    self.errors += 1
                conn = None
                time.sleep(0.2)
            time.sleep(self.pause)
        if conn is not None:
            conn.close()

    def count(self):
        with self._lock:
            return len(self.committed)

    def wait_more(self, more, timeout=60):
        start = self.count()
        wait_until(lambda: self.count() >= start + more, timeout,
                   what=f"{more} more committed records (at {self.count()})")

    def start(self):
        for t in self._threads:
            t.start()

    def stop(self):
        self._stop.set()
        for t in self._threads:
            t.join(30)


def extension_dir(conn):
    """Where the server under test reads extension scripts: its own SHAREDIR (the
    pg_config view answers for the running server, a private prefix included)."""
    [share] = conn.execute("SELECT setting FROM pg_config WHERE name = 'SHAREDIR'").fetchone()
    return Path(share) / "extension"


def library_path(conn):
    [lib] = conn.execute("SELECT setting FROM pg_config WHERE name = 'PKGLIBDIR'").fetchone()
    return Path(lib) / "wal_delivery.so"


def install_library_copy(path):
    """Installs the library again as a new file (a new inode), as a package upgrade does:
    written beside it, then renamed over it. Its content is the same."""
    tmp = path.with_name(path.name + ".rolling-upgrade-tmp")
    tmp.write_bytes(path.read_bytes())
    tmp.chmod(path.stat().st_mode & 0o7777)
    os.replace(tmp, path)
    return path.stat().st_ino


def mapped_library(pid):
    """The inode of wal_delivery.so mapped by process pid, and whether that file was
    replaced since ("(deleted)")."""
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        if line.rstrip().endswith(("wal_delivery.so", "wal_delivery.so (deleted)")):
            return int(line.split()[4]), line.endswith("(deleted)")
    return None


def installed_version(conn):
    return conn.execute("SELECT extversion FROM pg_extension"
                        " WHERE extname = 'wal_delivery'").fetchone()[0]


def update_scripts(conn, old, new):
    """An update old -> new that replaces the relay's and the writers' functions with
    their own definitions, adds a function and a comment; and the update back."""
    replaced = []
    for name in REPLACED:
        for [oid] in conn.execute("SELECT p.oid FROM pg_proc p JOIN pg_namespace n"
                                  " ON n.oid = p.pronamespace WHERE n.nspname || '.' || p.proname = %s",
                                  (name,)).fetchall():
            replaced.append(conn.execute("SELECT pg_get_functiondef(%s)", (oid,)).fetchone()[0] + ";")
    assert len(replaced) >= len(REPLACED), "a function the update replaces is missing"
    forward = "\n".join([
        f"-- wal_delivery {old} -> {new}: written by tests/integration/test_rolling_upgrade.py",
        *replaced,
        "CREATE FUNCTION wal_delivery.rolling_upgrade_probe() RETURNS text LANGUAGE sql"
        f" IMMUTABLE AS $$ SELECT '{new}'::text $$;",
        "COMMENT ON FUNCTION wal_delivery.rolling_upgrade_probe() IS"
        " 'added by the rolling upgrade test';",
    ])
    back = "\n".join([
        f"-- wal_delivery {new} -> {old}: written by tests/integration/test_rolling_upgrade.py",
        "DROP FUNCTION wal_delivery.rolling_upgrade_probe();",
        *replaced,
    ])
    return forward, back


def last_id(conn, topic):
    return conn.execute("SELECT coalesce(max(id), 0) FROM wal_delivery.outbox WHERE topic = %s",
                        (topic,)).fetchone()[0]


def shipped_since(conn, topic, mark):
    """Rows of topic after id mark that the relay shipped to Kafka."""
    return conn.execute("SELECT count(*) FROM wal_delivery.outbox WHERE topic = %s"
                        " AND id > %s AND state = 'stored'", (topic, mark)).fetchone()[0]


def metric_sum(worker, name, label):
    """The sum of a metric's series that carry label (e.g. 'destination="d"')."""
    return sum(float(line.split()[-1]) for line in worker.get("/metrics")[1].splitlines()
               if line.startswith(name + "{") and label in line)


def delivered_keys(dest):
    return {record_key(r) for r in dest.requests() if 200 <= r.get("status", 0) < 300}


def dead_letter_keys(destination):
    with connect() as conn:
        return {k for [k] in conn.execute("SELECT idempotency_key FROM wal_delivery.dead_letters"
                                          " WHERE destination = %s", (destination,))}


def test_rolling_upgrade_of_the_extension_and_every_worker_loses_nothing(
        tmp_path, kafka_bootstrap, unique):
    topic = f"up.{unique}"
    names = {"ok": f"up-ok-{unique}", "flaky": f"up-flaky-{unique}", "refusing": f"up-refusing-{unique}"}
    dests = {role: Destination(tmp_path) for role in names}
    # Slow answers keep requests in flight when a worker is told to stop.
    dests["ok"].behave(delay_ms=150)
    dests["flaky"].behave(delay_ms=150)
    dests["flaky"].behave(status=503, ratio=0.3)   # retry steps deliver what fails
    dests["refusing"].behave(status=400)           # every record becomes a dead letter
    workers, written, writers = [], [], None
    admin = connect()
    try:
        old = installed_version(admin)
        new = "1.1" if old == "1.0" else old + ".1"
        ext_dir = extension_dir(admin)
        forward_path = ext_dir / f"wal_delivery--{old}--{new}.sql"
        back_path = ext_dir / f"wal_delivery--{new}--{old}.sql"
        if not os.access(ext_dir, os.W_OK):
            pytest.skip(f"{ext_dir} is not writable by this user: run the tests as its owner"
                        " (tests/run as root, or a private prefix from tests/pg-prefix)")
        for p in (forward_path, back_path):
            assert not p.exists(), f"{p} exists: this test would overwrite a real update script"

        def start(role):
            w = Worker(tmp_path, role, "--time-scale", str(TIME_SCALE), kafka_bootstrap=kafka_bootstrap)
            workers.append(w)
            return w

        try:
            forward, back = update_scripts(admin, old, new)
            for path, text in ((forward_path, forward), (back_path, back)):
                path.write_text(text + "\n")
                path.chmod(0o644)  # the server runs as another user
                written.append(path)

            admin.execute("INSERT INTO wal_delivery.topics (name, partitions, replication_factor,"
                          " min_insync_replicas) VALUES (%s, 4, 1, 1)", (topic,))
            add_destination(admin, names["ok"], dests["ok"].url, [topic], max_in_flight=64)
            add_destination(admin, names["flaky"], dests["flaky"].url, [topic], max_in_flight=64,
                            retry_delays="{1s,1s,1s}", pause_after_failures=1000)
            add_destination(admin, names["refusing"], dests["refusing"].url, [topic])
            wait_published(admin, timeout=60)

            fleet = {"consume-a": start("consume"), "consume-b": start("consume"),
                     "retry": start("retry"), "dlq": start("dlq")}
            for w in fleet.values():
                w.wait_ready()

            writers = Writers(topic)
            writers.start()
            wait_until(lambda: len(delivered_keys(dests["ok"])) >= 50, 60,
                       what="records to flow end to end")

            # The new package's library: a new file. Every process forked from the running
            # postmaster, a relay started now included, still runs the old one; a server
            # restart (writers retry, workers reconnect) loads the new one.
            lib = library_path(admin)
            if os.access(lib.parent, os.W_OK):
                old_ino = lib.stat().st_ino
                new_ino = install_library_copy(lib)
                with connect() as session:
                    [backend] = session.execute("SELECT pg_backend_pid()").fetchone()
                    session.execute("SELECT wal_delivery.library_version()")
                    assert mapped_library(backend) == (old_ino, True)
                old_relays = relay_pids(admin)
                admin.close()
                env_cmd("pg-stop")
                env_cmd("pg-start")
                admin = connect_when_ready()
                relays = wait_new_relay(old_relays)
                assert all(mapped_library(pid) == (new_ino, False) for pid in relays)
                mark = last_id(admin, topic)
                wait_until(lambda: shipped_since(admin, topic, mark) >= 100, 90,
                           what="the new relay to ship records enqueued after the restart")
                restarted = "server restarted with the library replaced, "
            else:
                restarted = "library not replaced (not writable), "

            # (a) ALTER EXTENSION ... UPDATE mid-flow; the relay keeps shipping.
            relays = relay_pids(admin)
            mark = last_id(admin, topic)
            t0 = time.monotonic()
            admin.execute(f"ALTER EXTENSION wal_delivery UPDATE TO '{new}'")
            update_s = time.monotonic() - t0
            assert installed_version(admin) == new
            assert admin.execute("SELECT wal_delivery.rolling_upgrade_probe()").fetchone()[0] == new

            wait_until(lambda: shipped_since(admin, topic, mark) >= 200, 60,
                       what="the relay to ship records enqueued around the update")
            assert relay_pids(admin) == relays, "a relay restarted during the update"

            # (b) every worker, one instance at a time: SIGTERM, a fresh start, ready.
            stops = []
            for name in ("consume-a", "consume-b", "retry", "dlq"):
                old_w = fleet[name]
                role = name.split("-")[0]
                t0 = time.monotonic()
                rc = old_w.stop(signal.SIGTERM, timeout=SHUTDOWN_BOUND + 15)
                took = time.monotonic() - t0
                stops.append(f"{name} {took:.2f}s")
                assert rc == 0, f"{name} exited {rc} on SIGTERM:\n{old_w.output()[-2000:]}"
                assert took < SHUTDOWN_BOUND + 5, f"{name} took {took:.1f}s to stop"
                assert "event=stopped" in old_w.output()
                if role == "consume":  # drained: nothing left open for the next owner
                    assert "event=stopped open_records=0" in old_w.output()
                fleet[name] = start(role)
                fleet[name].wait_ready()
                # The new instance works before the next one stops.
                if role == "consume":
                    before = len(dests["ok"].requests())
                    wait_until(lambda: len(dests["ok"].requests()) >= before + 50, 60,
                               what=f"deliveries after restarting {name}")
                elif role == "retry":
                    wait_until(lambda: metric_sum(fleet[name], "wal_retry_delivered_total",
                                                  f'destination="{names["flaky"]}"') >= 10,
                               60, what="the new retry worker to deliver")
                else:
                    before = len(dead_letter_keys(names["refusing"]))
                    wait_until(lambda: len(dead_letter_keys(names["refusing"])) >= before + 20, 60,
                               what="the new dlq worker to write dead letters")

            # Rolling back is the same statement to the old version, also while records flow.
            admin.execute(f"ALTER EXTENSION wal_delivery UPDATE TO '{old}'")
            assert installed_version(admin) == old
            mark = last_id(admin, topic)
            wait_until(lambda: shipped_since(admin, topic, mark) >= 100, 60,
                       what="the relay to ship records enqueued after the rollback")
            assert relay_pids(admin) == relays, "a relay restarted during the rollback"

            # (c) stop writing, let it drain, count end to end.
            writers.stop()
            committed = dict(writers.committed)
            keys = set(committed)
            assert len(keys) >= 500, f"too few records flowed ({len(keys)})"

            def missing():
                return {
                    "ok": keys - delivered_keys(dests["ok"]),
                    "flaky": keys - delivered_keys(dests["flaky"]) - dead_letter_keys(names["flaky"]),
                    "refusing": keys - dead_letter_keys(names["refusing"]),
                }
            try:
                wait_until(lambda: not any(missing().values()), 120, interval=1,
                           what="every committed record at every destination")
            finally:
                lost = {k: len(v) for k, v in missing().items()}
            assert lost == {"ok": 0, "flaky": 0, "refusing": 0}
            ids = list(committed.values())
            assert admin.execute("SELECT count(*) FROM wal_delivery.outbox WHERE id = ANY(%s)"
                                 " AND state = 'stored'", (ids,)).fetchone()[0] == len(ids)

            def dups(dest):
                seen = {}
                for r in dest.requests():
                    if 200 <= r.get("status", 0) < 300:
                        seen[record_key(r)] = seen.get(record_key(r), 0) + 1
                return sum(n - 1 for n in seen.values())
            flaky_dead = len(dead_letter_keys(names["flaky"]) & keys)
            [dead_dups] = admin.execute(
                "SELECT count(*) - count(DISTINCT idempotency_key) FROM wal_delivery.dead_letters"
                " WHERE destination = %s", (names["refusing"],)).fetchone()
            report(f"rolling upgrade ({restarted}{old} -> {new} -> {old} mid-flow, 4 workers restarted one at"
                   f" a time: {', '.join(stops)}): {len(keys)} committed records"
                   f" ({writers.errors} writer errors), 0 lost at 3 destinations;"
                   f" duplicates: ok {dups(dests['ok'])}, flaky {dups(dests['flaky'])}"
                   f" ({flaky_dead} dead after 4 attempts), refusing {dead_dups} dead letters;"
                   f" ALTER EXTENSION took {update_s:.2f}s")
        finally:
            if writers is not None:
                writers.stop()
            for w in workers:
                w.stop(signal.SIGKILL if w.proc.poll() is None else signal.SIGTERM, timeout=5)
            for d in dests.values():
                d.stop()
            try:
                with connect_when_ready() as conn:
                    if installed_version(conn) != old:
                        conn.execute(f"ALTER EXTENSION wal_delivery UPDATE TO '{old}'")
            finally:
                for p in written:
                    p.unlink(missing_ok=True)
    finally:
        admin.close()
