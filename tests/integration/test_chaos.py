"""Issue 19, "Now break all of it": the short chaos run (chaos/run, what `make chaos`
runs) as part of the suite. It starts its own environment (Postgres + 3 Kafka brokers, in
a scratch WAL_ENV_DIR), runs every worker role, the SQL and HTTP generators, 8 scripted
destinations and archival to S3 under a fault schedule (broker kill -9 and SIGSTOP, two
brokers down, a Postgres immediate restart, kill -9 of every worker kind), then judges
the ledger: no acknowledged record lost, nothing rolled back delivered, paused
destinations probed only, healthy destinations' p99 unaffected, every backlog drained.

One run, judged strictly: a failed check fails the test. The FAIL lines go to the suite's
fault report with the directory holding the run's records, logs and report."""
import os
import subprocess
import time
import uuid
from pathlib import Path

from conftest import env_cmd, needs_pg_cron
from relay_helpers import report

ROOT = Path(__file__).resolve().parents[2]


def chaos_run():
    """(verdict lines, exit status, output directory) of one short run."""
    # Beside the suite's other output (tests/run keeps .cache/test-output), so the run's
    # records, logs and report survive a failure.
    out = ROOT / ".cache" / "test-output" / f"chaos-{time.strftime('%Y%m%d-%H%M%S')}"
    env_dir = f"/tmp/wal_delivery-chaos-{uuid.uuid4().hex[:8]}"  # its own environment
    env = {k: v for k, v in os.environ.items() if k not in ("WAL_ENV_DIR",)}
    try:
        proc = subprocess.run([str(ROOT / "chaos" / "run"), "--no-build", "--duration", "2m", "--out", str(out),
                               "--env-dir", env_dir], capture_output=True, text=True, timeout=600, env=env)
    finally:
        env_cmd("down", env_dir=env_dir, check=False)  # also after a timeout or a crash of the run
    print(proc.stderr[-6000:])
    print(proc.stdout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("PASS ", "FAIL "))]
    return lines, proc.returncode, out


@needs_pg_cron
def test_short_chaos_run_passes_every_check():
    lines, status, out = chaos_run()
    failed = [line for line in lines if line.startswith("FAIL ")]
    for line in lines:
        report("chaos: " + line[:600])
    report(f"chaos: exit {status}; records, logs and report in {out}")
    assert lines, f"the chaos run printed no verdict (exit {status}; records in {out})"
    assert not failed, f"chaos checks failed (records, logs and report in {out}):\n" + "\n".join(failed)
    assert status == 0
    assert (out / "report" / "index.html").exists()
