"""The consumers' offset tracker (common/offset_tracker), driven by
tests/c/offset_tracker_check.c: the low watermark it commits, and offsets a consumer
jumps over within a partition counted in wal_consumer_offsets_skipped_total and logged
once per jump (event=offsets_skipped), which a re-read or a new assignment is not. Needs
no Postgres or Kafka."""
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["tests/c/offset_tracker_check.c", "src/workers/common/offset_tracker.c",
           "src/workers/common/log.c", "src/workers/common/metrics.c",
           "src/workers/common/text_buffer.c", "src/shared/utf8.c"]


def test_offsets_a_consumer_never_read_are_counted_and_logged(tmp_path):
    out = tmp_path / "offset_tracker_check"
    built = subprocess.run(["cc", "-O2", "-Wall", "-Wextra", "-Werror", "-Isrc/workers", "-Isrc", *SOURCES,
                            "-lrdkafka", "-lpthread", "-lm", "-o", str(out)],
                           cwd=ROOT, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    run = subprocess.run([str(out)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    got = {k: int(v) for k, v in (line.split() for line in run.stdout.splitlines())}
    assert got == {"contiguous_committable": 11, "contiguous_committable_after_done": 13,
                   "contiguous_skipped": 0, "gap_skipped": 3, "gap_committable": 26,
                   "reread_skipped": 0, "reassigned_skipped": 0}
    events = [line for line in run.stderr.splitlines() if "event=offsets_skipped" in line]
    assert len(events) == 1 and "topic=gap partition=0 from=21 to=23 count=3" in events[0], run.stderr
