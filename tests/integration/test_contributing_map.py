"""CONTRIBUTING.md's map (the indented block of "## Layout") matches the tree: every
directory under src/ (src/ext, src/shared, src/workers and each role's directory, at any
depth) is named there by its path, and every directory the map names exists. A new directory that nobody put on
the map, or a map entry for one that is gone (as sql/updates/ once was), fails here.
Reads files only: no database, no Kafka."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP = ("src", "sql", "tests", "bench", "chaos", "demo", "fuzz", "docs", "debian", "kafka", "expected")
# A path of the tree as the map writes it: a top-level directory, then more segments, not
# inside a longer word or path (so "/tmp/pg-x/src/..." is no entry).
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./-]*)" % "|".join(TOP))


def map_section(text):
    """The map: the indented (code) lines of the "## Layout" section."""
    start = text.index("\n## Layout\n")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end >= 0 else len(text)]
    return "\n".join(line for line in section.splitlines() if line.startswith("    "))


def named_directories(section):
    """The directories the map names: every path it writes with a trailing slash."""
    return {m.rstrip(".") for m in PATH.findall(section) if m.rstrip(".").endswith("/")}


def src_directories(root):
    return {p.relative_to(root).as_posix() + "/" for p in (root / "src").rglob("*")
            if p.is_dir() and not p.name.startswith((".", "__"))}


def missing_from_map(root):
    section = map_section((root / "CONTRIBUTING.md").read_text())
    return sorted(src_directories(root) - named_directories(section))


def test_every_directory_under_src_is_on_the_map():
    assert {"src/ext/", "src/shared/", "src/workers/", "src/workers/ingest/"} <= src_directories(ROOT)
    missing = missing_from_map(ROOT)
    assert not missing, f"CONTRIBUTING.md's map (## Layout) does not name: {missing}"


def test_every_directory_on_the_map_exists():
    section = map_section((ROOT / "CONTRIBUTING.md").read_text())
    gone = sorted(d for d in named_directories(section) if not (ROOT / d).is_dir())
    assert not gone, f"CONTRIBUTING.md's map names directories that do not exist: {gone}"


def test_a_directory_left_off_the_map_fails(tmp_path):
    """The check itself: a copy of the map and of src/'s directories, plus one directory
    the map does not name, is caught."""
    (tmp_path / "CONTRIBUTING.md").write_text((ROOT / "CONTRIBUTING.md").read_text())
    for d in src_directories(ROOT):
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
    assert missing_from_map(tmp_path) == []
    (tmp_path / "src" / "workers" / "pager").mkdir()
    assert missing_from_map(tmp_path) == ["src/workers/pager/"]
