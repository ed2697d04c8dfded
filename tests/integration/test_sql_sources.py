"""The extension's SQL sources (sql/src): each object is created in exactly one file, the
Makefile's list (sql/src/ORDER) names every file once, a released install script is never
changed after the fact, and the upgrade regress test covers every release.

Words used here:
  object key   what makes an object one object: kind and qualified name, plus argument
               types for a function or procedure and the table for a trigger or policy
"""
import re
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "sql" / "src"
EXTENSION_SCHEMA = "wal_delivery"  # objects created without a schema land here

DOLLAR_QUOTE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")


def code_outside_bodies(text):
    """text with comments, string literals and routine bodies blanked out (newlines kept,
    so line numbers still hold). The body of a DO block stays: it is run at install time,
    so what it creates (roles) is created by the script."""
    out = []
    i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if text.startswith("--", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            i = end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif c == "'":
            end = i + 1
            while end < n:
                if text[end] == "'" and text.startswith("''", end):
                    end += 2
                elif text[end] == "'":
                    end += 1
                    break
                else:
                    end += 1
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif c == "$" and DOLLAR_QUOTE.match(text, i) and not re.search(r"[\w$]$", "".join(out[-1:])):
            tag = DOLLAR_QUOTE.match(text, i).group(0)
            end = text.find(tag, i + len(tag))
            end = n if end < 0 else end
            body = text[i + len(tag):end]
            if re.search(r"\bDO\s*$", "".join(out), re.IGNORECASE):
                out.append(" " + code_outside_bodies(body) + " ")
            else:
                out.append(re.sub(r"[^\n]", " ", body) + "  ")
            i = end + len(tag)
        else:
            out.append(c)
            i += 1
    return "".join(out)


TYPE_ALIASES = {
    "int": "integer", "int4": "integer", "int8": "bigint", "int2": "smallint",
    "bool": "boolean", "varchar": "character varying", "float8": "double precision",
    "timestamptz": "timestamp with time zone", "timetz": "time with time zone",
}
MULTI_WORD_TYPES = ("double precision", "character varying", "timestamp with", "timestamp without",
                    "time with", "time without", "bit varying")


def split_top_level(s, sep=","):
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def argument_type(arg):
    """The type of one declared argument, or None for an OUT argument (not part of the
    routine's identity)."""
    arg = re.split(r"\s+(?:DEFAULT\b|=)", arg, maxsplit=1, flags=re.IGNORECASE)[0].strip()
    words = arg.split()
    mode = words[0].upper() if words else ""
    if mode == "OUT":
        return None
    if mode in ("IN", "INOUT", "VARIADIC"):
        words = words[1:]
    rest = " ".join(words).lower()
    if len(words) > 1 and not rest.startswith(MULTI_WORD_TYPES):
        rest = " ".join(words[1:]).lower()  # the first word is the argument's name
    rest = re.sub(r"\s*\[\s*\]", "[]", rest)
    base, brackets = re.match(r"(.*?)((?:\[\])*)$", rest).groups()
    return TYPE_ALIASES.get(base, base) + brackets


def qualified(name, schema=None):
    name = name.strip().strip('"').lower()
    return name if "." in name else f"{schema or EXTENSION_SCHEMA}.{name}"


CREATE = re.compile(
    r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:UNIQUE\s+)?(?:TEMP(?:ORARY)?\s+)?"
    r"(?P<kind>MATERIALIZED\s+VIEW|EVENT\s+TRIGGER|CONSTRAINT\s+TRIGGER|[A-Z]+)\s+"
    r"(?:IF\s+NOT\s+EXISTS\s+)?(?:CONCURRENTLY\s+)?(?P<name>[\w.\"]+)",
    re.IGNORECASE,
)
RELATION_KINDS = {"TABLE", "VIEW", "MATERIALIZED VIEW", "SEQUENCE", "INDEX"}


def object_keys(text):
    """(object key, line) for every object the SQL text creates, and every COMMENT ON."""
    code = code_outside_bodies(text)
    keys = []
    for m in CREATE.finditer(code):
        kind = re.sub(r"\s+", " ", m.group("kind").upper())
        name = m.group("name")
        line = code.count("\n", 0, m.start()) + 1
        after = code[m.end():]
        if kind in ("FUNCTION", "PROCEDURE", "AGGREGATE"):
            args = after[after.index("(") + 1:]
            depth, end = 1, 0
            while depth:
                depth += {"(": 1, ")": -1}.get(args[end], 0)
                end += 1
            types = [t for t in (argument_type(a) for a in split_top_level(args[:end - 1])) if t]
            key = f"routine {qualified(name)}({','.join(types)})"
        elif kind in RELATION_KINDS:
            if kind == "INDEX":
                table = re.match(r"\s*ON\s+(?:ONLY\s+)?([\w.\"]+)", after, re.IGNORECASE).group(1)
                name = qualified(name, qualified(table).split(".")[0])
            key = f"relation {qualified(name)}"
            if kind in ("TABLE", "VIEW", "MATERIALIZED VIEW"):
                keys.append((f"type {qualified(name)}", line))  # its row type
        elif kind in ("TYPE", "DOMAIN"):
            key = f"type {qualified(name)}"
        elif kind in ("TRIGGER", "CONSTRAINT TRIGGER", "POLICY", "RULE"):
            table = re.search(r"\bON\s+([\w.\"]+)", after, re.IGNORECASE).group(1)
            key = f"{kind.split()[-1].lower()} {name.lower()} on {qualified(table)}"
        elif kind in ("ROLE", "USER", "GROUP", "SCHEMA", "EXTENSION", "EVENT TRIGGER"):
            key = f"{kind.lower()} {name.strip(chr(34)).lower()}"
        else:
            key = f"{kind.lower()} {qualified(name)}"
        keys.append((key, line))
    for m in re.finditer(r"\bCOMMENT\s+ON\s+(.*?)\s+IS\b", code, re.IGNORECASE | re.DOTALL):
        keys.append(("comment on " + re.sub(r"\s+", " ", m.group(1)).lower(), code.count("\n", 0, m.start()) + 1))
    return keys


def duplicates(files):
    """{object key: ["file:line", ...]} for every key created more than once."""
    where = defaultdict(list)
    for path, text in files:
        for key, line in object_keys(text):
            where[key].append(f"{path}:{line}")
    return {k: v for k, v in where.items() if len(v) > 1}


def source_files():
    return sorted(SRC.rglob("*.sql"))


def listed_in_order():
    lines = (SRC / "ORDER").read_text().splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def test_each_object_is_created_in_one_source_file_only():
    files = [(str(p.relative_to(ROOT)), p.read_text()) for p in source_files()]
    dup = duplicates(files)
    assert not dup, "created more than once (define each object once, in the file named for its concept):\n" + \
        "\n".join(f"  {k}: {', '.join(v)}" for k, v in sorted(dup.items()))


def test_the_parser_sees_every_kind_of_object():
    keys = {k for p in source_files() for k, _ in object_keys(p.read_text())}
    for expected in [
        "routine wal_delivery.enqueue_payload(text,bytea,text,text,text,jsonb)",
        "routine pg_catalog.wal_enqueue(text,jsonb,text,text,jsonb)",
        "routine pg_catalog.wal_enqueue(text,bytea,text,text,jsonb)",
        "routine wal_delivery.hold_processing_row(bigint,bigint)",       # OUT arguments left out
        "routine wal_delivery.archive_dead_letters(jsonb)",              # a procedure, INOUT
        "relation wal_delivery.outbox", "type wal_delivery.outbox",
        "relation wal_delivery.outbox_ready_to_ship", "relation wal_delivery.backlog",
        "relation wal_delivery.retry_partition_seq", "type wal_delivery.outbox_state",
        "trigger bump_config_version on wal_delivery.topics",
        "trigger bump_config_version on wal_delivery.settings",
        "role wal_delivery_writer", "role wal_delivery_admin",
        "comment on schema wal_delivery",
    ]:
        assert expected in keys
    # Statements that function bodies run are not objects of the install script.
    assert not any("restore_entries" in k for k in keys)
    assert len(keys) > 130, len(keys)


def test_a_duplicate_is_caught_and_an_overload_is_not():
    a = """
CREATE FUNCTION wal_delivery.f(p_x integer, p_y text DEFAULT 'x;y') RETURNS int LANGUAGE sql AS $$
    SELECT 1; -- CREATE TABLE wal_delivery.t (x int);
$$;
CREATE FUNCTION wal_delivery.f(p_x bigint) RETURNS int LANGUAGE sql AS $body$ SELECT 2 $body$;
CREATE TABLE wal_delivery.t (x int);
CREATE INDEX t_x ON wal_delivery.t (x);
DO $$ BEGIN CREATE ROLE r NOLOGIN; END $$;
"""
    b = """
-- CREATE TABLE wal_delivery.t (a comment)
CREATE OR REPLACE FUNCTION wal_delivery.f(int4, OUT r int, text) RETURNS int LANGUAGE sql AS $$ SELECT 3 $$;
CREATE VIEW wal_delivery.t_x AS SELECT 1;
CREATE ROLE r;
"""
    assert duplicates([("a.sql", a)]) == {}
    assert duplicates([("a.sql", a), ("b.sql", b)]) == {
        "routine wal_delivery.f(integer,text)": ["a.sql:2", "b.sql:3"],
        "relation wal_delivery.t_x": ["a.sql:7", "b.sql:4"],
        "role r": ["a.sql:8", "b.sql:5"],
    }


def test_order_lists_every_source_file_once():
    listed = listed_in_order()
    files = [str(p.relative_to(SRC)) for p in source_files()]
    assert sorted(listed) == sorted(set(listed)), "listed twice in sql/src/ORDER"
    assert sorted(listed) == files, "sql/src/ORDER must name exactly the files of sql/src"
    assert listed[-1] == "roles.sql", "roles and grants come last"


def test_released_install_script_is_what_the_sources_build():
    out = subprocess.run(["make", "-s", "--no-print-directory", "check-release"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-4000:]


def test_upgrade_test_covers_every_release():
    releases = sorted(p.name[len("wal_delivery--"):-len(".sql")]
                      for p in (ROOT / "sql" / "releases").glob("wal_delivery--*.sql"))
    assert releases, "no released version in sql/releases/"
    text = (ROOT / "sql" / "upgrade.sql").read_text()
    listed = re.search(r"INSERT INTO releases VALUES (.*);", text).group(1)
    assert sorted(re.findall(r"'([^']+)'", listed)) == releases, \
        "sql/upgrade.sql must update from every version in sql/releases/"


@pytest.mark.parametrize("path", ["sql/updates", "sql/releases"])
def test_scripts_are_named_for_versions(path):
    for p in (ROOT / path).glob("*"):
        assert re.fullmatch(r"wal_delivery--\d+\.\d+(--\d+\.\d+)?\.sql", p.name), p
