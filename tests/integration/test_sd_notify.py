"""Every role speaks the systemd notify protocol when NOTIFY_SOCKET is set: READY=1 once
its configuration is loaded, WATCHDOG=1 from its loop at half of WATCHDOG_USEC, STOPPING=1
when told to stop. The test is the socket's reader (what systemd would be)."""
import os
import socket
import time

import pytest

from conftest import connect
from consumer_helpers import Worker
from ingest_helpers import INGEST_LOGIN, Ingest, ingest_conninfo, setup_ingest


def read_messages(sock, until, stop_after=None):
    got = []
    end = time.time() + until
    while time.time() < end:
        try:
            got.append(sock.recv(4096).decode())
        except socket.timeout:
            continue
        if stop_after and stop_after in got:
            break
    return got


def idle_database():
    """A database of its own with the extension and nothing to process. A batch is one
    turn of process's loop (WatchdogSec must exceed a processor's lease), and rows that
    earlier tests left ready (a stopped worker gives its batch back) would be this
    worker's to run in the shared database, each turn as long as their processors take."""
    name = "sd_notify_idle"
    with connect() as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f"CREATE DATABASE {name}")
    with connect(dbname=name) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS wal_delivery")
    return name


@pytest.mark.parametrize("role", ["ingest", "consume", "retry", "dlq", "process"])
def test_role_notifies_ready_watchdog_and_stopping(tmp_path, kafka_bootstrap, role):
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.2)
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"}
    with connect() as conn:
        setup_ingest(conn)
        # process refuses a superuser: it runs as an admin login, as operations.md asks.
        conn.execute("DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname ="
                     " 'sd_notify_worker') THEN CREATE ROLE sd_notify_worker LOGIN IN ROLE"
                     " wal_delivery_admin; END IF; END $$")
    conninfo = ingest_conninfo().replace(INGEST_LOGIN, "sd_notify_worker")
    if role == "process":
        conninfo = conninfo.replace(f"dbname={os.environ['PGDATABASE']}", f"dbname={idle_database()}")
    if role == "ingest":
        worker = Ingest(tmp_path, kafka_bootstrap, env=env)
    else:
        worker = Worker(tmp_path, role, kafka_bootstrap=kafka_bootstrap, env=env, conninfo=conninfo)
    try:
        got = read_messages(sock, 30, stop_after="READY=1")
        assert "READY=1" in got, worker.output()[-2000:]
        pings = read_messages(sock, 2)
        # Every 200 ms: about ten in two seconds; a loop that stalls sends none.
        assert pings.count("WATCHDOG=1") >= 4, pings
        worker.proc.terminate()
        assert "STOPPING=1" in read_messages(sock, 10, stop_after="STOPPING=1")
    finally:
        worker.stop()
        sock.close()
    assert worker.proc.returncode == 0
