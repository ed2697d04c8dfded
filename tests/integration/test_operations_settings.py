"""docs/operations.md documents every setting the code defines, in one place each: the
server settings table lists exactly the GUCs the extension defines (DefineCustom*Variable
in src/ext), and the workers' command line lists every option wal-worker parses
(src/workers/common/options.c). The settings table is checked against the database by
test_readme_quick_start.py. Reads files only: no database, no Kafka."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = (ROOT / "docs" / "operations.md").read_text()


def section(text, heading):
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def test_the_server_settings_table_lists_exactly_the_gucs_the_extension_defines():
    source = "\n".join(p.read_text() for p in sorted((ROOT / "src" / "ext").glob("*.c")))
    defined = set(re.findall(r'DefineCustom\w+Variable\(\s*"(wal_delivery\.\w+)"', source))
    assert len(defined) >= 10, defined
    table = section(OPERATIONS, "## Server settings (GUCs)")
    documented = re.findall(r"^\| `(wal_delivery\.\w+)` \|", table, re.M)
    assert len(documented) == len(set(documented)), "a GUC is listed twice"
    assert set(documented) == defined, (
        f"undocumented: {sorted(defined - set(documented))}; "
        f"documented but not defined: {sorted(set(documented) - defined)}")


def test_every_worker_option_is_documented():
    source = (ROOT / "src" / "workers" / "common" / "options.c").read_text()
    options = re.findall(r'\{"([a-z-]+)", (?:required|no)_argument', source)
    assert {"db", "admin-port", "destination", "listen", "kafka-deadline"} <= set(options)
    text = section(OPERATIONS, "## Running the workers") + section(
        OPERATIONS, "## The ingest service (`wal-worker ingest`)") + section(
        OPERATIONS, "## The on-call console (`wal-worker console`)")
    missing = [o for o in options if f"`--{o}" not in text]
    assert not missing, f"docs/operations.md does not document: {missing}"
