"""The C sources follow the committed .clang-format (run `make format` to fix)."""
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_c_sources_are_clang_formatted():
    # The Makefile's FORMAT_SOURCES is the one list of the files (make format rewrites
    # them; check-format fails when it finds none).
    out = subprocess.run(["make", "-s", "--no-print-directory", "check-format"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, (out.stdout + out.stderr)[:3000]
