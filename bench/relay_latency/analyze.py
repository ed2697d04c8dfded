#!/usr/bin/env python3
"""bench/relay_latency/analyze.py READS COMMITS LABEL IDLE_MS

READS: consume's lines (sent_us produced_us read_us outbox_id); COMMITS: lines
(outbox_id commit_us lane) from the outbox log (track_commit_timestamp). Prints
p50/p90/p99/max of enqueue -> readable (what bench/anchors/debezium reports) and of its
parts: enqueue -> commit (the client's transaction), commit -> produced (the relay: wake-up
and pass), produced -> read (Kafka and the reader); a histogram of commit -> produced; and
how many records waited about the idle interval after their commit. The commit time is
pg_xact_commit_timestamp, taken just before the commit record is flushed: commit -> produced
includes that flush (synchronous_commit on) as well as the wake-up and the pass."""
import sys

reads = [line.split() for line in open(sys.argv[1]) if line.strip()]
commits = {}
for line in open(sys.argv[2]):
    f = line.split()
    if len(f) == 3:
        commits[f[0]] = (int(f[1]), int(f[2]))
label, idle_ms = sys.argv[3], float(sys.argv[4])
if not reads:
    print(f"{label}: no records read")
    sys.exit(1)


def pct(ms, q):
    return ms[max(0, min(len(ms) - 1, int(q * len(ms) + 0.999999) - 1))]


def line(name, ms):
    ms = sorted(ms)
    return (f"  {name:<22} p50 {pct(ms, .5):8.1f}  p90 {pct(ms, .9):8.1f}  "
            f"p99 {pct(ms, .99):8.1f}  max {ms[-1]:8.1f} ms   (n={len(ms)})")


rows = []
for s, p, r, i in reads:
    c = commits.get(i)
    rows.append((int(s), int(p), int(r), c[0] if c else None))
sent = [r[0] for r in rows]
span = (max(sent) - min(sent)) / 1e6
print(f"{label}: {len(rows)} records read over {span:.1f} s (~{len(rows) / max(span, 1e-9):.0f}/s)")
print(line("enqueue -> readable", [(r - s) / 1000 for s, p, r, c in rows]))
known = [x for x in rows if x[3] is not None]
if known:
    print(line("enqueue -> commit", [(c - s) / 1000 for s, p, r, c in known]))
    print(line("commit -> readable", [(r - c) / 1000 for s, p, r, c in known]))
    relay = [(p - c) / 1000 for s, p, r, c in known]  # produced_us has ms resolution
    print(line("commit -> produced", relay))
print(line("produced -> read", [(r - p) / 1000 for s, p, r, c in rows]))
if not known:
    print("  (no commit times: track_commit_timestamp off?)")
    sys.exit(0)
edges = [-1e12, 0, 10, 20, 50, 100, 200, 400, 700, 900, 1100, 1500, 2000, 3000, 5000, 7000, 1e12]
counts = [0] * (len(edges) - 1)
for ms in relay:
    for i in range(len(edges) - 1):
        if edges[i] <= ms < edges[i + 1]:
            counts[i] += 1
            break
print("  histogram commit -> produced (ms):")
for i, c in enumerate(counts):
    if c:
        lo = "-inf" if edges[i] <= -1e12 else f"{edges[i]:g}"
        hi = "inf" if edges[i + 1] >= 1e12 else f"{edges[i + 1]:g}"
        print(f"    [{lo:>5}, {hi:>5}) {c:7d} {100 * c / len(relay):6.2f}% {'#' * max(1, round(60 * c / len(relay)))}")
near = sum(1 for ms in relay if 0.8 * idle_ms <= ms < 1.2 * idle_ms + 100)
over = sum(1 for ms in relay if ms >= 0.8 * idle_ms)
print(f"  commit -> produced about the idle interval ({idle_ms:g} ms: 0.8x to 1.2x + 100 ms): {near} "
      f"({100 * near / len(relay):.2f}%); 0.8x or more: {over} ({100 * over / len(relay):.2f}%)")
