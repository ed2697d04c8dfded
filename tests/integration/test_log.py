"""The workers' logger (common/log.c), driven by tests/c/log_check.c: whatever a value
holds (a key with a line break and a forged field, quotes, libpq's multi-line errors,
control bytes), one event is one line and its fields parse back as written. Needs no
Postgres or Kafka."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# logfmt: key=value or key="value with \" escapes"
FIELD = re.compile(r'([a-z_0-9]+)=("(?:[^"\\]|\\.)*"|[^ "]*)(?: |$)')


def parse_logfmt(line):
    prefix, rest = line.split(" ", 1)
    fields, pos = {}, 0
    while pos < len(rest):
        m = FIELD.match(rest, pos)
        assert m, f"not logfmt at {rest[pos:]!r} in {line!r}"
        key, value = m.group(1), m.group(2)
        assert key not in fields, f"field {key} twice in {line!r}"
        if value.startswith('"'):
            value = re.sub(r'\\(.)', lambda e: {"n": "\n", "r": "\r", "t": "\t"}.get(e.group(1), e.group(1)),
                           re.sub(r'\\x([0-9a-f]{2})', lambda e: chr(int(e.group(1), 16)), value[1:-1]))
        fields[key] = value
        pos = m.end()
    return fields


def test_every_value_is_escaped_and_one_event_is_one_line(tmp_path):
    binary = tmp_path / "log_check"
    built = subprocess.run(["cc", "-Wall", "-Wextra", "-Werror", "-Isrc/workers", "-Isrc", "tests/c/log_check.c",
                            "src/workers/common/log.c", "src/shared/utf8.c", "-o", str(binary)],
                           cwd=ROOT, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=30)  # fails on bad UTF-8
    assert run.returncode == 0
    lines = run.stderr.splitlines()
    assert len(lines) == 14, lines
    events = {}
    for line in lines:
        fields = parse_logfmt(line)
        assert fields["role"] == "check"
        events[fields["event"]] = fields
    assert "forged" not in events
    assert events["hostile_key"]["key"] == "k\nlevel=error event=forged"
    assert events["hostile_key"]["level"] == "info"
    assert events["hostile_quoted"]["key"] == 'a" event=forged b="'
    assert events["libpq_error"]["error"] == 'FATAL:  database "x" does not exist\nDETAIL: second line\r\n'
    assert events["bare_with_space"]["value"] == "two words"
    assert events["control_bytes"]["value"] == "a\x01\x1b[31mred\x7f"
    assert events["empty"]["value"] == ""
    assert events["null"]["value"] == "(null)"
    assert events["precision"]["value"] == "abc"
    n = events["numbers"]
    assert (n["i"], n["l"], n["z"], n["i64"], n["g"], n["f"], n["pct"]) == \
        ("-7", "12345678901", "42", "-9000000000", "0.5", "3", "100%")
    assert events["plain"]["value"] == "simple"
    # A line about a record ends with its topic, key and trace id, escaped like any value.
    about = events["about_record"]
    assert (about["destination"], about["error"]) == ("billing", 'a" event=forged b="')
    assert (about["topic"], about["key"], about["trace_id"]) == \
        ("orders.events", "k\nlevel=error event=forged", "4bf92f3577b34da6a3ce929d0e0e4736")
    untraced = events["untraced_record"]
    assert (untraced["topic"], untraced["key"]) == ("orders.events", "k 1") and "trace_id" not in untraced
    # Huge values are cut with their length; the line stays whole and parseable.
    huge = events["huge_values"]
    assert huge["a"] == "k" * 512 + "...(19999 bytes)" and huge["b"] == huge["a"]
    assert all(len(line) <= 4200 for line in lines)
    # Bytes that are not UTF-8 are escaped; valid multi-byte characters stay as they are.
    assert events["not_utf8"]["value"] == "a\xff\xc3(b" and events["not_utf8"]["text"] == "ok é \xe2\x82"
