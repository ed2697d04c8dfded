"""The workers' per-topic delivery counts (common/delivery_stats), driven by
tests/c/delivery_stats_check.c built with a 1 s flush: counts reach
wal_delivery.delivery_stats through add_delivery_stats (unknown topics skipped, counts
made after the last flush sent at stop); with Postgres unreachable, counting stays fast,
at most 4096 keys are kept and the rest are dropped and counted, never a crash.
test_console.py covers counts kept through a refused flush in a real `consume`."""
import os
import subprocess
from pathlib import Path

import pytest

from conftest import connect
from relay_helpers import ensure_extension, make_topic

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["tests/c/delivery_stats_check.c", "src/workers/common/delivery_stats.c",
           "src/workers/common/db_connect.c", "src/workers/common/log.c",
           "src/workers/common/metrics.c", "src/workers/common/text_buffer.c", "src/shared/utf8.c"]


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    out = tmp_path_factory.mktemp("delivery_stats") / "delivery_stats_check"
    include = subprocess.run(["pkg-config", "--variable=includedir", "libpq"], capture_output=True,
                             text=True).stdout.strip() or "/usr/include/postgresql"
    built = subprocess.run(["cc", "-O2", "-Wall", "-Wextra", "-Werror", "-Isrc/workers", "-Isrc",
                            f"-I{include}", "-DDELIVERY_STATS_FLUSH_MS=1000", *SOURCES, "-lpq",
                            "-ljansson", "-lpthread", "-lm", "-o", str(out)],
                           cwd=ROOT, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    return out


def run(driver, *args):
    done = subprocess.run([str(driver), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PGHOST": os.environ.get("PGHOST", "127.0.0.1")})
    assert done.returncode == 0, done.stdout + done.stderr
    return {k: float(v) for k, v in (line.split() for line in done.stdout.splitlines())}, done.stderr


def test_counts_reach_the_table_and_the_last_ones_go_at_stop(driver, unique):
    topic, dest = f"ds.{unique}", f"ds-{unique}"
    ensure_extension()
    with connect() as conn:
        make_topic(conn, topic)
        conn.execute("INSERT INTO wal_delivery.destinations (name, endpoint) VALUES (%s, 'http://127.0.0.1:9/x')",
                     (dest,))
    try:
        got, log = run(driver, "flush", topic, dest)
        assert got["ok_flushes"] >= 1 and got["dropped"] == 0, (got, log)
        with connect() as conn:
            rows = conn.execute("SELECT sum(delivered), sum(failed), sum(dead_lettered) FROM wal_delivery.delivery_stats"
                                " WHERE destination = %s GROUP BY topic", (dest,)).fetchall()
        assert rows == [(4, 2, 1)], "3 delivered, 1 more flushed at stop; the unknown topic skipped"
    finally:
        with connect() as conn:
            conn.execute("DELETE FROM wal_delivery.delivery_stats WHERE destination = %s", (dest,))
            conn.execute("DELETE FROM wal_delivery.destinations WHERE name = %s", (dest,))
            conn.execute("DELETE FROM wal_delivery.topics WHERE name = %s", (topic,))


def test_without_postgres_counting_stays_fast_and_memory_bounded(driver):
    got, log = run(driver, "bounded")
    assert got["failed_flushes"] >= 2, got
    # 3 rounds of 5000 keys of which 4096 are kept: 904 dropped each (more if a minute
    # began in between: the new minute's keys find no room).
    assert got["dropped"] >= 3 * 904, got
    assert got["count_5000_ms"] < 500, "counting never waits on a flush"
    assert got["stopped"] == 1
    assert log.count("event=delivery_stats_flush_failed") == 1, "logged once while it lasts"
    assert log.count("event=delivery_stats_dropped") == 2, "once while running, once at stop"
