"""`make demo` runs on this machine from start to finish and shows records going through
every part that exists, then `make demo-stop` leaves nothing running."""
import os
import re
import subprocess
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_end_to_end_and_stops_cleanly():
    env_dir = f"/tmp/wal_delivery-demotest-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, WAL_ENV_DIR=env_dir, DEMO_FOLLOW="0")
    try:
        out = subprocess.run([str(ROOT / "demo" / "run")], env=env, capture_output=True,
                             text=True, timeout=600)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        # Committed records are stored and read back from Kafka with their headers; the
        # rolled-back one appears nowhere.
        for key in ("order-1-created", "order-2-created", "order-2-paid"):
            assert re.search(rf"\| {key} +\| stored ", out.stdout), key
            assert f"idempotency-key={key}," in out.stdout
        assert 'value={"event": "paid", "order_id": 2}' in out.stdout
        assert "order-3-created" not in out.stdout
        # ... and delivered to the sample destination by the consumer.
        for key in ("order-1-created", "order-2-created", "order-2-paid"):
            assert re.search(rf"POST /orders  idempotency-key={key} ", out.stdout), key
        assert re.search(r'wal_delivered_total\{destination="sample-destination"\} 3', out.stdout)
        # A 503 is retried from step 1; a 400 becomes a dead letter on-call can see in SQL.
        assert "order-4-created  x-wal-attempt=2  answered 200" in out.stdout
        assert re.search(r"sample-destination\s*\|\s*order-4-refund\s*\|\s*HTTP 400", out.stdout)
        assert "make demo-stop" in out.stdout
    finally:
        subprocess.run([str(ROOT / "demo" / "stop")], env=env, capture_output=True, timeout=120)
    assert not os.path.exists(env_dir)
    assert subprocess.run(["pgrep", "-f", env_dir], capture_output=True).stdout == b""
