"""bench/console/measure.py: times the console's API against the same SQL run from psql,
both as the same on-call login, and prints one line per case. Run by bench/console/run,
which sets up the database and the console; arguments: console URL, user, password,
rounds."""
import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request

url, user, password, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
sources = os.path.join(os.path.dirname(__file__), "..", "..", "src", "workers", "console")


def c_string(path, start):
    """The SQL text of the C string literal that starts with `start` in a console source,
    with the macros it splices in (FILTER_SQL, CONSOLE_COUNT_CAP) expanded: the bench runs
    exactly the query the console runs."""
    text = open(os.path.join(sources, path)).read()
    macros = {"CONSOLE_COUNT_CAP": "10001", "CONSOLE_CHART_HOURS": "6"}
    if "#define FILTER_SQL" in text:
        define = text[text.index("#define FILTER_SQL"):text.index("typedef struct")]
        macros["FILTER_SQL"] = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', define))
    out = []
    # Adjacent literals and macros up to the first comma outside a literal.
    for m in re.finditer(r'\s*(?:"((?:[^"\\]|\\.)*)"|([A-Z_]+)|(.))', text[text.index(start):]):
        literal, macro, other = m.groups()
        if literal is not None:
            out.append(literal.replace('\\"', '"').replace("\\\\", "\\"))
        elif macro in macros:
            out.append(macros[macro])
        else:
            break
    assert out, start
    return "".join(out)


session = {}


def api(path):
    req = urllib.request.Request(url + path, headers={"Cookie": session["cookie"]})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as r:
        body = r.read()
    return (time.perf_counter() - t) * 1000, json.loads(body)


def sign_in():
    req = urllib.request.Request(url + "/api/session", method="POST",
                                 data=json.dumps({"user": user, "password": password}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        session["cookie"] = r.headers["Set-Cookie"].split(";")[0]


def psql_times(sql, n):
    """n runs of sql in one psql session as the same login with the console's session
    settings (jit off, console_signin.c), each timed by psql."""
    script = "SET jit = off;\n\\timing on\n\\o /dev/null\n" + (sql.rstrip(";") + ";\n") * n
    env = {**os.environ, "PGUSER": user, "PGPASSWORD": password, "PGHOST": "127.0.0.1"}
    out = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1"], input=script, env=env,
                         capture_output=True, text=True, check=True).stdout
    return [float(t) for t in re.findall(r"Time: ([\d.]+) ms", out)]


def literal(v):
    return "NULL" if v is None else "'" + str(v).replace("'", "''") + "'"


def bind(sql, params):
    for i in range(len(params), 0, -1):
        sql = sql.replace(f"${i}", literal(params[i - 1]))
    return sql


sign_in()
overview_sql = c_string("console_api_status.c", '"SELECT json_build_object(\'now\', now(), \'count_cap\', "')
list_sql = c_string("console_api_dead_letters.c", '"SELECT json_build_object(\'dead_letters\'')
# The entry 900,000 newest first (a deep page), and the plain OFFSET reading of it.
deep = api("/api/dead-letters?state=all&limit=1")[1]["dead_letters"][0]["id"] - 900000
cases = [
    ("overview, with the charts", "/api/overview", bind(overview_sql, ["t"])),
    ("overview, counters only (most refreshes)", "/api/overview?chart=no", bind(overview_sql, ["f"])),
    ("dead letters, first page", "/api/dead-letters?limit=50",
     bind(list_sql, [None] * 6 + ["unresolved", None, "50"])),
    ("dead letters, page at 900,000 (keyset)", f"/api/dead-letters?state=all&limit=50&before={deep}",
     bind(list_sql, [None] * 6 + ["all", str(deep), "50"])),
    ("dead letters, one destination, first page", "/api/dead-letters?destination=bench-d7&limit=50",
     bind(list_sql, [None, "bench-d7"] + [None] * 4 + ["unresolved", None, "50"])),
]
print(f"{'case':45} {'console ms':>11} {'psql ms':>9} {'ratio':>6}")
for name, path, sql in cases:
    api(path)  # warm: the first query of a kind plans and reads pages in
    console = statistics.median(api(path)[0] for _ in range(rounds))
    plain = statistics.median(psql_times(sql, rounds + 1)[1:])
    print(f"{name:45} {console:11.2f} {plain:9.2f} {console / plain:6.2f}")
offset_sql = ("SELECT id FROM wal_delivery.dead_letters ORDER BY id DESC OFFSET 900000 LIMIT 50")
print(f"{'(for scale) the deep page by OFFSET, psql':45} {'':11} "
      f"{statistics.median(psql_times(offset_sql, rounds + 1)[1:]):9.2f}")
