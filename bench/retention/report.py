#!/usr/bin/env python3
"""bench/retention/report.py LOGS: the tables bench/retention/run prints, from what the run
left in LOGS: cycles.tsv and events.tsv (from the database), maint.tsv (B's DDL, timed by
psql), lat_<design>.* (pgbench per-transaction logs), postgres.log, params.env."""
import glob
import os
import re
import statistics
import sys
from datetime import datetime, timezone
from collections import defaultdict

LOGS = sys.argv[1]
DESIGNS = ["A", "A-tuned", "B-keys", "B-lookup"]
APP = {"A": "A", "At": "A-tuned", "Bk": "B-keys", "Bl": "B-lookup"}
SCHEMA = {"wal_delivery": "A", "bench_a2": "A-tuned", "bench_bk": "B-keys", "bench_bl": "B-lookup"}

params = {}
with open(os.path.join(LOGS, "params.env")) as f:
    for line in f:
        k, _, v = line.strip().partition("=")
        params[k] = v
STEADY_FROM = int(params.get("STEADY_FROM", "2"))
designs = [d for d in DESIGNS if d in params.get("DESIGNS", " ".join(DESIGNS)).split()]


def tsv(name):
    path = os.path.join(LOGS, name)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line.rstrip("\n").split("\t") for line in f if line.strip()]


def pct(values, p):
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100.0 * (len(v) - 1))))]


def med(values):
    return statistics.median(values) if values else float("nan")


# ---------------------------------------------------------------- cycles
# at_epoch cycle design total_bytes extra_bytes rows pending oldest_s dead live parts autovacuums longest_xact_s
cycles = defaultdict(dict)  # cycle -> design -> row
bounds = {}  # cycle -> end epoch
for r in tsv("cycles.tsv"):
    at, c, d = float(r[0]), int(r[1]), r[2]
    vals = [None if x == "" else float(x) for x in r[3:]]
    keys = ["bytes", "extra", "heap", "rows", "pending", "oldest", "dead", "live", "parts", "autovac", "longest_xact"]
    cycles[c][d] = dict(zip(keys, vals))
    bounds[c] = at if c not in bounds else min(bounds[c], at)
ncycles = max(cycles) if cycles else 0


def cycle_of(t):
    for c in range(1, ncycles + 1):
        if bounds[c - 1] < t <= bounds[c]:
            return c
    return None


# ---------------------------------------------------------------- enqueue latency logs
# client_id transaction_no latency_us script_no epoch_s epoch_us
per_sec = {d: defaultdict(int) for d in designs}
lat = {d: defaultdict(list) for d in designs}  # design -> cycle -> [ms]
for d in designs:
    tag = {v: k for k, v in APP.items()}[d]
    for path in glob.glob(os.path.join(LOGS, f"lat_{tag}.*")):
        with open(path) as f:
            for line in f:
                p = line.split()
                if len(p) < 6:
                    continue
                t = int(p[4]) + int(p[5]) / 1e6
                per_sec[d][int(p[4])] += 1
                c = cycle_of(t)
                if c is not None:
                    lat[d][c].append(int(p[2]) / 1000.0)


def tps_seconds(d, c_from, c_to):
    """Transactions per second for every whole second inside cycles c_from..c_to."""
    lo, hi = bounds[c_from - 1], bounds[c_to]
    return [per_sec[d].get(s, 0) for s in range(int(lo) + 1, int(hi))]


# ---------------------------------------------------------------- purge / DDL timings
events = defaultdict(list)  # design -> [(epoch, kind, ms, info)]
for r in tsv("events.tsv"):  # at_epoch design kind ms n
    events[r[1]].append((float(r[0]), r[2], float(r[3]), r[4]))
errors = defaultdict(list)
for r in tsv("maint.tsv"):  # epoch design kind ms status
    if r[4] != "ok":
        errors[r[1]].append(f"{r[2]}: {r[4]}")
        continue
    events[r[1]].append((float(r[0]), r[2], float(r[3]), ""))

MAINT_KINDS = ("purge", "purge_keys", "create", "attach", "detach", "finalize", "drop")


def longest(d, c=None, kinds=MAINT_KINDS):
    best = (0.0, "-")
    for t, k, ms, _ in events[d]:
        if k in kinds and (c is None or cycle_of(t) == c) and ms > best[0]:
            best = (ms, k)
    return best


# ---------------------------------------------------------------- postgres.log
waits = defaultdict(list)  # design -> [(ms, role, lock, state)]
av = defaultdict(list)  # design -> [elapsed s]
av_cancel = defaultdict(int)
wait_re = re.compile(r"\[\d+\] (\S*) ?LOG:  process \d+ (acquired|still waiting for) (\w+) on (.+?) after ([\d.]+) ms")
av_re = re.compile(r'automatic vacuum of table "[^.]+\.([^.]+)\.([^"]+)"')
cancel_re = re.compile(r'automatic vacuum of table "[^.]+\.([^.]+)\.')
def in_steady(line):
    """Whether a server log line (%m prefix, UTC) falls into the steady-state cycles."""
    p = line.split(" ", 3)
    if len(p) < 3 or p[2] != "UTC":
        return True
    try:
        t = datetime.strptime(p[0] + " " + p[1], "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return True
    return bounds[min(STEADY_FROM, ncycles) - 1] < t <= bounds[ncycles] + 5


pg_log = os.path.join(LOGS, "postgres.log")
if os.path.exists(pg_log):
    with open(pg_log, errors="replace") as f:
        current = None
        pending_cancel = False
        for line in f:
            m = wait_re.search(line)
            if m:
                app, state, mode, what, ms = m.groups()
                parts = app.split("_")
                if len(parts) >= 3 and parts[0] == "bench" and parts[1] in APP and in_steady(line):
                    waits[APP[parts[1]]].append((float(ms), parts[2], f"{mode} on {what}", state))
                continue
            if "canceling autovacuum task" in line:
                pending_cancel = True
                continue
            m = av_re.search(line)
            if m and "LOG:" in line:
                current = SCHEMA.get(m.group(1)) if in_steady(line) else None
                continue
            if pending_cancel:
                m = cancel_re.search(line)
                if m and SCHEMA.get(m.group(1)):
                    av_cancel[SCHEMA[m.group(1)]] += 1
                pending_cancel = False
            if current and "elapsed:" in line:
                m = re.search(r"elapsed: ([\d.]+) s", line)
                if m:
                    av[current].append(float(m.group(1)))
                current = None


def ratio(x, y, fmt="{:.2f}"):
    try:
        r = x / y
    except (TypeError, ZeroDivisionError):
        return "-" if fmt else None
    return fmt.format(r) if fmt else r


def mb(x):
    return x / 1048576.0 if x is not None else float("nan")


# ---------------------------------------------------------------- per cycle
print(f"\n## per cycle (each {params['CYCLE_S']} s; sizes and counts at the end of the cycle; "
      f"cycles < {STEADY_FROM} fill the window)\n")
hdr = ("cycle", "t_s", "design", "enq_tps", "p99_ms", "max_ms", "size_MB", "heap_MB", "key_MB", "rows", "pending",
       "dead_tup", "parts", "oldest_s", "autovac", "longest_purge/ddl")
fmt = "{:>5} {:>5} {:<9} {:>7} {:>7} {:>7} {:>8} {:>7} {:>6} {:>7} {:>7} {:>8} {:>5} {:>8} {:>7}  {}"
print(fmt.format(*hdr))
for c in range(1, ncycles + 1):
    for d in designs:
        row = cycles[c].get(d)
        if not row:
            continue
        secs = tps_seconds(d, c, c)
        ms, kind = longest(d, c)
        print(fmt.format(
            c, f"{bounds[c] - bounds[0]:.0f}", d, f"{med(secs):.0f}",
            f"{pct(lat[d][c], 99):.1f}", f"{max(lat[d][c], default=float('nan')):.0f}",
            f"{mb(row['bytes']):.1f}", f"{mb(row['heap']):.1f}", f"{mb(row['extra']):.1f}", f"{row['rows']:.0f}", f"{row['pending']:.0f}",
            f"{row['dead']:.0f}", f"{row['parts']:.0f}", f"{(row['oldest'] or 0):.1f}", f"{row['autovac']:.0f}",
            f"{ms:.0f} ms {kind}" if ms else "-"))

# ---------------------------------------------------------------- summary
steady = list(range(STEADY_FROM, ncycles + 1))
if not steady:
    steady = list(range(1, ncycles + 1))
s_from, s_to = steady[0], steady[-1]
half = steady[len(steady) // 2]
summary = {}
for d in designs:
    secs = tps_seconds(d, s_from, s_to)
    all_lat = [x for c in steady for x in lat[d][c]]
    sizes = [cycles[c][d]["bytes"] for c in steady if d in cycles[c]]
    deads = [cycles[c][d]["dead"] for c in steady if d in cycles[c]]
    rows = [cycles[c][d]["rows"] for c in steady if d in cycles[c]]
    purge = [ms for t, k, ms, _ in events[d] if k in MAINT_KINDS and cycle_of(t) in steady]
    w = sorted(waits[d], reverse=True)
    summary[d] = dict(
        tps=med(secs), p50=pct(all_lat, 50), p99=pct(all_lat, 99), p999=pct(all_lat, 99.9), lmax=max(all_lat, default=0),
        size_med=med(sizes), size_end=sizes[-1] if sizes else float("nan"),
        size_mid=cycles[half][d]["bytes"] if d in cycles[half] else float("nan"),
        size_max=max(sizes, default=float("nan")),
        rows_med=med(rows), dead_med=med(deads), dead_max=max(deads, default=float("nan")),
        longest=longest(d), purge_p99=pct(purge, 99), nmaint=len(purge),
        waits=w, av=av[d], av_cancel=av_cancel[d], errors=errors[d],
        longest_xact=max((cycles[c][d]["longest_xact"] or 0) for c in steady if d in cycles[c]),
        pending_max=max((cycles[c][d]["pending"] for c in steady if d in cycles[c]), default=0),
    )

WRITERS = ("writer", "slow")
MAINT = ("purge", "maint")


def waitline(s, roles):
    """How many waits ended (acquired) and the longest, counting ones still going."""
    w = [x for x in s["waits"] if x[1] in roles]
    if not w:
        return "0"
    n = sum(1 for x in w if x[3] == "acquired")
    return f"{n}, {w[0][0]:.0f} ms {w[0][1]}"


print(f"\n## steady state (cycles {s_from}-{s_to})\n")
lines = [
    ("enqueue tps, median of 1 s buckets", lambda s: f"{s['tps']:.0f}"),
    ("enqueue latency p50 / p99 / p99.9 ms", lambda s: f"{s['p50']:.1f} / {s['p99']:.1f} / {s['p999']:.1f}"),
    ("enqueue latency max ms", lambda s: f"{s['lmax']:.0f}"),
    ("longest purge or DDL statement ms", lambda s: f"{s['longest'][0]:.0f} ({s['longest'][1]})"),
    ("purge/DDL statements, p99 ms", lambda s: f"{s['nmaint']}, {s['purge_p99']:.0f}"),
    (f"writers' lock waits >= {params['LOCK_LOG_MS']} ms: n, longest", lambda s: waitline(s, WRITERS)),
    (f"purge/DDL lock waits >= {params['LOCK_LOG_MS']} ms: n, longest", lambda s: waitline(s, MAINT)),
    ("size MB: median / mid-run / end / max", lambda s: (
        f"{mb(s['size_med']):.1f} / {mb(s['size_mid']):.1f} / {mb(s['size_end']):.1f} / {mb(s['size_max']):.1f}")),
    ("rows held, median", lambda s: f"{s['rows_med']:.0f}"),
    ("bytes per row held, median", lambda s: f"{s['size_med'] / s['rows_med']:.0f}" if s['rows_med'] else "-"),
    ("n_dead_tup median / max", lambda s: f"{s['dead_med']:.0f} / {s['dead_max']:.0f}"),
    ("autovacuum runs, total s, cancelled", lambda s: f"{len(s['av'])}, {sum(s['av']):.1f}, {s['av_cancel']}"),
    ("relay backlog max (pending rows)", lambda s: f"{s['pending_max']:.0f}"),
    ("maintenance errors", lambda s: f"{len(s['errors'])}"),
]
w0 = max(len(row[0]) for row in lines)
print(f"{'':<{w0}}  " + "  ".join(f"{d:>24}" for d in designs))
for label, fn in lines:
    print(f"{label:<{w0}}  " + "  ".join(f"{fn(summary[d]):>24}" for d in designs))

if "A" in summary:
    a = summary["A"]
    print()
    for d in designs:
        if d == "A":
            continue
        s = summary[d]
        print(f"ratio {d}/A: enqueue tps {ratio(s['tps'], a['tps'])}   p99 latency {ratio(s['p99'], a['p99'])}   "
              f"size (median) {ratio(s['size_med'], a['size_med'])}   size (end) {ratio(s['size_end'], a['size_end'])}   "
              f"bytes/row {ratio(ratio(s['size_med'], s['rows_med'], None), ratio(a['size_med'], a['rows_med'], None))}")

print()
for d in designs:
    s = summary[d]
    for ms, role, what, state in [x for x in s["waits"] if x[3] == "acquired"][:2]:
        print(f"lock wait {d}: {role} {state} {what} after {ms:.0f} ms")
    for e in s["errors"][:5]:
        print(f"maintenance error {d}: {e}")
    rows_mid, rows_end = cycles[half][d]["rows"], cycles[s_to][d]["rows"]
    if s["size_mid"] and s["size_end"] and rows_mid and rows_end:
        print(f"growth {d} from mid-run (cycle {half}) to the end: size {(s['size_end'] / s['size_mid'] - 1) * 100:+.0f}%, "
              f"rows held {(rows_end / rows_mid - 1) * 100:+.0f}%")
