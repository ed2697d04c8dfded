"""The C sources follow the committed .clang-format (run `make format` to fix)."""
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_c_sources_are_clang_formatted():
    files = sorted(str(p) for pattern in ("src/ext/*.[ch]", "src/workers/*.[ch]", "src/workers/*/*.[ch]")
                   for p in ROOT.glob(pattern))
    assert len(files) > 40, files
    out = subprocess.run(["clang-format", "--dry-run", "--Werror", *files],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[:3000]
