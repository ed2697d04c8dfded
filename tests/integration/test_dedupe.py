"""The consumer's dedupe set (common/dedupe), driven by tests/c/dedupe_check.c: pairs by
destination, TTL, the cap evicting the oldest, and a footprint that does not grow as the
set fills (it is allocated up front). Needs no Postgres or Kafka."""
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_dedupe_set_scenarios(tmp_path):
    out = tmp_path / "dedupe_check"
    built = subprocess.run(["cc", "-O2", "-Wall", "-Wextra", "-Werror", "-Isrc/workers",
                            "tests/c/dedupe_check.c", "src/workers/consume/dedupe.c", "-o", str(out)],
                           cwd=ROOT, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    run = subprocess.run([str(out)], capture_output=True, text=True, timeout=60)
    lines = run.stdout.splitlines()
    assert run.returncode == 0, run.stdout
    results = {line.split()[0]: line.split(None, 1)[1] for line in lines if not line.startswith("rss_kb")}
    assert set(results) == {"remembered", "other_destination", "no_concatenation_clash", "key_per_topic",
                            "no_double_entry", "expires", "cap_evicts_oldest",
                            "ttl_zero_remembers_nothing", "recent_found", "evicted_gone",
                            "flat_footprint"}
    assert all(v == "ok" for v in results.values()), results
