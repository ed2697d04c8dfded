"""The fuzz targets (fuzz/, make fuzz): each runs for a short time, with ASan and UBSan,
on its corpus (the hand-written seeds and every crash kept as a regression input) and
must not crash. WAL_FUZZ_SECONDS sets how long each runs (default 10); the crash input,
if any, is named in the failure (fuzz/README.md says how to keep it)."""
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TARGETS = sorted(p.name for p in (ROOT / "fuzz" / "corpus").iterdir() if p.is_dir())
SECONDS = int(os.environ.get("WAL_FUZZ_SECONDS", "10"))


def make(*args, timeout):
    return subprocess.run(["make", "-s", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def fuzz_targets_built():
    out = make("fuzz-build", timeout=1200)
    assert out.returncode == 0, f"make fuzz-build failed:\n{out.stdout[-3000:]}{out.stderr[-5000:]}"


@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_target_finds_no_crash(fuzz_targets_built, target):
    out = make("fuzz", f"FUZZ_TARGETS={target}", f"FUZZ_SECONDS={SECONDS}", timeout=SECONDS + 600)
    assert out.returncode == 0, f"{out.stdout[-2000:]}{out.stderr[-8000:]}"
    assert f"fuzz: {target}:" in out.stdout, out.stdout
