#!/usr/bin/env python3
"""The chaos run's verdict: reads what a run recorded (its --out directory) and checks it.

    chaos/verdict.py DIR      prints one line per check (PASS/FAIL name detail); exit 1 on a FAIL

The ledger (ledger/*.jsonl) says which records were acknowledged (COMMIT returned), rolled
back or failed; the destinations' logs (dest/*.jsonl) say what each received and answered;
db/ holds the dead letters (table and S3 archive), the outbox, the pause audit; faults.jsonl
the fault windows; run.json the set-up and the drain. A record is "<topic>:<key>" to
destinations (Idempotency-Key). Writes verdict.json (checks and figures) beside them.
"""
import json
import math
import sys
from collections import Counter, defaultdict
from pathlib import Path

GRACE = 1.0            # s after a pause begins for requests already started to land
PROBE_SLACK = 0.8      # probes must be at least this fraction of probe_interval apart
INFRA_BEFORE, INFRA_AFTER = 2.0, 15.0   # a record committed this close to an infrastructure fault is not "calm"
NOISY_FACTOR, NOISY_SLACK = 2.0, 0.5    # bound: p99 during others' outages <= 2 x calm p99 + 0.5 s
MIN_SAMPLES = 50
REQUIRED_FAULTS = ["broker kill -9", "broker SIGSTOP", "two brokers kill -9", "postgres immediate restart",
                   "kill -9 consume", "kill -9 retry", "kill -9 dlq", "kill -9 process"]


def read_jsonl(path):
    out = []
    if Path(path).exists():
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass  # a line cut by a kill at the very end
    return out


def pct(values, p):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, math.ceil(p / 100 * len(v)) - 1))]


def fmt_s(x):
    return "-" if x is None else f"{x:.2f}s"


class Run:
    """Everything a run recorded, indexed."""

    def __init__(self, d):
        d = Path(d)
        self.dir = d
        self.run = json.loads((d / "run.json").read_text())
        self.t0, self.load_end = self.run["t0"], self.run["load_end"]
        self.subs = {t: v["subscribers"] for t, v in self.run["topics"].items()}
        self.processing = {t for t, v in self.run["topics"].items() if v["processor"]}
        self.ledger = {}
        for f in sorted((d / "ledger").glob("*.jsonl")):
            for r in read_jsonl(f):
                self.ledger[(r["topic"], r["key"])] = r
        self.receipts = {}
        for name in self.run["destinations"]:
            rs = read_jsonl(d / "dest" / f"{name}.jsonl")
            for r in rs:
                topic, _, key = (r.get("id") or "").partition(":")
                r["rec"] = (topic, key)
                r["attempt"] = int(r["a"]) if (r.get("a") or "").isdigit() else None
            self.receipts[name] = sorted(rs, key=lambda r: r["at"])
        db = d / "db"
        def load(n):
            return json.loads((db / f"{n}.json").read_text()) if (db / f"{n}.json").exists() else []
        self.dead = [dict(x, source="table") for x in load("dead_letters")] + \
                    [dict(x, source="s3") for x in load("archive")]
        self.outbox = {(r["topic"], r["idempotency_key"]): r["state"] for r in load("outbox")}
        self.audit = load("pause_audit")
        self.cron = load("cron_runs")
        self.faults = read_jsonl(d / "faults.jsonl")
        self.samples = read_jsonl(d / "samples.jsonl") + read_jsonl(d / "samples-kafka.jsonl")
        self.readable = {}  # record -> when it could first be read from Kafka (chaos/readable.py)
        for r in read_jsonl(d / "readable.jsonl"):
            topic, _, key = r["id"].partition(":")
            if (topic, key) not in self.readable or r["at"] < self.readable[(topic, key)]:
                self.readable[(topic, key)] = r["at"]
        # fates, with in-doubt commits settled by the outbox
        self.acked, self.undone, self.unacked, self.indoubt = {}, set(), set(), Counter()
        for rec, r in self.ledger.items():
            fate = r["fate"]
            if fate == "indoubt":
                committed = rec in self.outbox
                self.indoubt["committed" if committed else "not committed"] += 1
                if committed:
                    self.acked[rec] = r.get("t") or r["s"]
                else:
                    self.undone.add(rec)
            elif fate == "acked":
                self.acked[rec] = r["t"]
            elif fate == "unacked":
                self.unacked.add(rec)  # an HTTP record never answered 2xx: may exist or not
            else:
                self.undone.add(rec)
        self.ok = defaultdict(dict)   # destination -> {record: first 2xx arrival}
        for name, rs in self.receipts.items():
            for r in rs:
                if r.get("s") is not None and 200 <= r["s"] < 300 and r["rec"] not in self.ok[name]:
                    self.ok[name][r["rec"]] = r["at"]
        self.dead_for = defaultdict(list)  # record -> dead letters
        for x in self.dead:
            self.dead_for[(x["topic"], x["idempotency_key"])].append(x)
        self.infra = [f for f in self.faults if f.get("category") == "infra"]
        self.dest_windows = [f for f in self.faults if f.get("category") == "destination"]

    def is_dead(self, rec, dest):
        return any(x["destination"] in (dest, None) and (x.get("last_error") or "").strip()
                   for x in self.dead_for.get(rec, []))

    def pause_windows(self):
        """{destination: [{"start", "end", "probes": [claim times], "outcomes": [...]}]}"""
        out = defaultdict(list)
        end_of_run = self.run.get("ended") or self.load_end
        for a in self.audit:
            d = a["destination"]
            opened = a["paused"] and (a["op"] == "INSERT" or a["old_paused"] is False)
            if opened:
                out[d].append({"start": a["at"], "end": None, "probes": [], "outcomes": [],
                               "reason": a.get("reason")})
            elif out[d] and out[d][-1]["end"] is None:
                w = out[d][-1]
                if a["probes"] is not None and a["old_probes"] is not None and a["probes"] > a["old_probes"]:
                    w["probes"].append(a["at"])
                if a.get("last_probe_outcome") and a["probe_holder"] is None and a["paused"]:
                    w["outcomes"].append((a["at"], a["last_probe_outcome"]))
                if not a["paused"] and a["old_paused"]:
                    w["end"] = a["at"]
                    w["outcomes"].append((a["at"], a.get("last_probe_outcome")))
        for ws in out.values():
            for w in ws:
                if w["end"] is None:
                    w["end"], w["open_at_end"] = end_of_run, True
        return dict(out)

    def infra_near(self, t, before=INFRA_BEFORE):
        return any(f["start"] - before <= t <= f.get("end", f["start"]) + INFRA_AFTER for f in self.infra)


def check(name, ok, detail):
    return {"name": name, "ok": bool(ok), "detail": detail}


def judge(d):
    R = Run(d)
    run, checks, figures = R.run, [], {}
    by_topic = Counter(t for t, _ in R.acked)
    fates = Counter(r["fate"] for r in R.ledger.values())
    http = Counter(r.get("path") for r in R.ledger.values() if r["client"].startswith("h") and r["fate"] == "acked")
    checks.append(check("acknowledged", len(R.acked) > 0 and (not run.get("ingest") or sum(http.values()) > 0),
                        f"{len(R.acked)} records acknowledged ({', '.join(f'{t} {n}' for t, n in sorted(by_topic.items()))});"
                        f" SQL: {fates['rolledback']} rolled back, {fates['failed']} failed before COMMIT,"
                        f" {fates['indoubt']} in doubt at COMMIT ({R.indoubt['committed']} committed)"
                        + (f"; HTTP through HAProxy and ingest: {http['kafka']} answered 201 (Kafka),"
                           f" {http['outbox']} 202 (outbox), {len(R.unacked)} never 2xx" if run.get("ingest") else "")))

    # ---- lost: each acknowledged record at each subscribed destination, or a dead letter
    per_dest = {}
    lost = []
    for name in run["destinations"]:
        per_dest[name] = Counter()
    for rec in R.acked:
        for dest in R.subs.get(rec[0], []):
            c = per_dest[dest]
            c["subscribed"] += 1
            if rec in R.ok[dest]:
                c["delivered"] += 1
            elif R.is_dead(rec, dest):
                c["dead"] += 1
            else:
                c["lost"] += 1
                lost.append(f"{dest}<-{rec[0]}:{rec[1]}")
    pairs = sum(c["subscribed"] for c in per_dest.values())
    dead_pairs = sum(c["dead"] for c in per_dest.values())
    checks.append(check("lost", not lost,
                        f"{len(lost)} of {pairs} (record, destination) pairs lost; "
                        f"{pairs - dead_pairs - len(lost)} delivered, {dead_pairs} dead letters with a reason"
                        + (f"; first: {', '.join(sorted(lost)[:6])}" if lost else "")))

    # ---- durable after commit: every record acknowledged from the outbox is in the outbox
    via_outbox = [r for r in R.acked if R.ledger[r].get("path", "outbox") == "outbox"]
    missing = [r for r in via_outbox if r not in R.outbox]
    states = Counter(R.outbox.get(r) for r in via_outbox)
    checks.append(check("durable_after_commit", not missing,
                        f"{len(via_outbox) - len(missing)} of {len(via_outbox)} records acknowledged by a COMMIT"
                        f" (SQL, and ingest's 202) in the outbox"
                        f" ({', '.join(f'{s} {n}' for s, n in sorted(states.items(), key=str))})"
                        + (f"; missing: {', '.join(':'.join(m) for m in missing[:5])}" if missing else "")))

    # ---- nothing rolled back (or never committed) exists or is delivered
    leaked = []
    for dest, rs in R.receipts.items():
        for r in rs:
            if r["rec"] in R.undone:
                leaked.append(f"{dest} got {':'.join(r['rec'])}")
    leaked += [f"outbox has {':'.join(r)}" for r in R.undone if r in R.outbox]
    leaked += [f"dead letter {':'.join(r)}" for r in R.undone if r in R.dead_for]
    checks.append(check("rolled_back_not_delivered", not leaked,
                        f"{len(R.undone)} records rolled back or never committed; {len(leaked)} seen anywhere"
                        + (f": {', '.join(leaked[:5])}" if leaked else "")))

    # ---- nothing a generator never wrote reached a destination
    unknown = Counter(dest for dest, rs in R.receipts.items() for r in rs if r["rec"] not in R.ledger)
    unacked_seen = len({r["rec"] for rs in R.receipts.values() for r in rs if r["rec"] in R.unacked})
    checks.append(check("no_unknown_deliveries", not unknown,
                        f"every request carried a record of the ledger ({unacked_seen} of the"
                        f" {len(R.unacked)} HTTP records never answered 2xx arrived anyway)" if not unknown else
                        f"requests with records no generator wrote: {dict(unknown)}"))

    # ---- dead letters: every one has its reason; a 400 destination's records are dead letters
    no_reason = [x for x in R.dead if not (x.get("last_error") or "").strip()]
    dead_by = Counter(x["destination"] or f"({x['origin']})" for x in R.dead)
    checks.append(check("dead_letters_have_reasons", not no_reason,
                        f"{len(R.dead)} dead letters ({sum(x['source'] == 's3' for x in R.dead)} archived to S3):"
                        f" {', '.join(f'{d} {n}' for d, n in sorted(dead_by.items()))}"
                        + (f"; {len(no_reason)} without a reason" if no_reason else "")))
    refused, refused_dead, wrong = 0, 0, []
    for dest, rs in R.receipts.items():
        got400 = {r["rec"] for r in rs if r.get("s") == 400}
        for rec in got400:
            if rec in R.ok[dest] or rec not in R.acked:
                continue
            refused += 1
            reasons = [x["last_error"] for x in R.dead_for.get(rec, []) if x["destination"] == dest]
            if any("400" in (e or "") for e in reasons):
                refused_dead += 1
            else:
                wrong.append(f"{dest}<-{':'.join(rec)} ({reasons or 'no dead letter'})")
    checks.append(check("refused_are_dead_letters", refused > 0 and not wrong,
                        f"{refused_dead} of {refused} records answered 400 (and never 2xx) are dead letters"
                        f" with HTTP 400" + (f"; not: {', '.join(wrong[:5])}" if wrong else "")
                        + ("; no record was refused: the 400 destination did not run" if refused == 0 else "")))
    healthy_dead = {d: dead_by[d] for d in run["healthy"] if dead_by[d]}
    checks.append(check("healthy_have_no_dead_letters", not healthy_dead,
                        f"{', '.join(run['healthy'])}: no dead letters" if not healthy_dead else
                        f"dead letters at healthy destinations: {healthy_dead}"))

    # ---- the processing topic's records arrive processed, and only they
    bad_proc, proc_n = [], 0
    for dest, rs in R.receipts.items():
        for r in rs:
            if r.get("s") is None or not 200 <= r["s"] < 300:
                continue
            processing = r["rec"][0] in R.processing
            proc_n += processing
            if processing != bool(r.get("proc")):
                bad_proc.append(f"{dest}<-{':'.join(r['rec'])}")
    proc_dead = sum(1 for x in R.dead if x["origin"] == "processing")
    checks.append(check("processed_payloads", not bad_proc and proc_dead == 0 and proc_n > 0,
                        f"{proc_n} deliveries of {', '.join(sorted(R.processing))} all carry the processor's result,"
                        f" others none; {proc_dead} processing dead letters"
                        + (f"; wrong: {', '.join(bad_proc[:5])}" if bad_proc else "")))

    # ---- duplicates per destination (at least once: counted, not failed)
    dups, near = {}, 0
    for dest, rs in R.receipts.items():
        firsts = set()
        dups[dest] = 0
        for r in rs:
            if r.get("s") is None or not 200 <= r["s"] < 300:
                continue
            if r["rec"] in firsts:
                dups[dest] += 1
                near += R.infra_near(r["at"])
            firsts.add(r["rec"])
        per_dest[dest]["duplicates"] = dups[dest]
        per_dest[dest]["requests"] = len(rs)
    total_ok = sum(len(v) for v in R.ok.values())
    checks.append(check("duplicates", True,
                        f"{sum(dups.values())} duplicate deliveries over {total_ok} records delivered"
                        f" ({near} within {INFRA_AFTER:g}s of an infrastructure fault): "
                        + ", ".join(f"{d} {n} ({100 * n / max(1, len(R.ok[d])):.1f}%)" for d, n in dups.items())))

    # ---- a paused destination receives only probes, at most one per probe interval
    pi = run["probe_interval_s"]
    windows = R.pause_windows()
    pause_lines, violations = [], []
    for dest, ws in sorted(windows.items()):
        total_in = 0
        for w in ws:
            inside = [r for r in R.receipts.get(dest, []) if w["start"] + GRACE < r["at"] < w["end"]]
            total_in += len(inside)
            w["requests"] = [r["at"] for r in inside]
            for r in inside:
                if r["attempt"] is None or r["attempt"] < 2:
                    violations.append(f"{dest}: attempt {r['attempt']} (a main consumer's) at "
                                      f"+{r['at'] - R.t0:.1f}s while paused")
            for a, b in zip(inside, inside[1:]):
                if b["at"] - a["at"] < PROBE_SLACK * pi:
                    violations.append(f"{dest}: two requests {b['at'] - a['at']:.1f}s apart at "
                                      f"+{b['at'] - R.t0:.1f}s while paused (probe interval {pi:g}s)")
            allowed = math.floor((w["end"] - w["start"]) / pi) + 1
            if len(inside) > allowed:
                violations.append(f"{dest}: {len(inside)} requests in a {w['end'] - w['start']:.0f}s pause"
                                  f" (at most {allowed})")
        pause_lines.append(f"{dest} {len(ws)} pause(s), {sum(len(w['probes']) for w in ws)} probes,"
                           f" {total_in} requests while paused")
    figures["pauses"] = windows
    checks.append(check("paused_get_only_probes", not violations,
                        ("; ".join(pause_lines) or "no destination was paused")
                        + (f"; VIOLATIONS: {'; '.join(violations[:6])}" if violations else "")))
    down_w = windows.get("down", [])
    closed = [w for w in down_w if not w.get("open_at_end")]
    checks.append(check("pause_and_resume", bool(closed) and not any(w.get("open_at_end") for ws in windows.values() for w in ws),
                        f"down paused {len(down_w)} time(s) during its outages and resumed {len(closed)} time(s)"
                        f" after a probe; paused at the end: "
                        f"{[d for d, ws in windows.items() if any(w.get('open_at_end') for w in ws)] or 'none'}"))

    # ---- noisy neighbour: healthy destinations' p99 while others fail, against the calm start.
    # Judged on what the delivering workers take, from when a record could first be read
    # from Kafka to its first 2xx at the destination: that is what a destination shares
    # with its failing neighbours (the same consume processes, groups and hand-offs). What
    # comes before (commit, the relay, Kafka's replication) is shared by everything on the
    # machine and slows with it; it is shown beside, not judged here. A record that became
    # readable shortly before an infrastructure fault is still on its way when the fault
    # hits it, so it says nothing about the neighbours: "shortly" is INFRA_BEFORE, or the
    # destination's calm p99 when a busy machine makes that longer.
    lat_all, lat_calm, lat_weather = defaultdict(list), defaultdict(list), defaultdict(list)
    up_calm, up_weather = defaultdict(list), defaultdict(list)
    calm_from, calm_to = R.t0 + 5, R.t0 + run["calm_s"]
    for dest in run["destinations"]:
        for rec, at in R.ok[dest].items():
            t = R.acked.get(rec)
            if t is not None:
                lat_all[dest].append(at - t)
    for dest in run["healthy"]:
        for rec, at in R.ok[dest].items():
            t, r = R.acked.get(rec), R.readable.get(rec)
            if t is not None and r is not None and calm_from <= t <= calm_to and not R.infra_near(r):
                lat_calm[dest].append(at - r)
                up_calm[dest].append(r - t)
        before = max(INFRA_BEFORE, pct(lat_calm[dest], 99) or 0)
        for rec, at in R.ok[dest].items():
            t, r = R.acked.get(rec), R.readable.get(rec)
            if t is not None and r is not None and calm_to < t <= R.load_end and not R.infra_near(r, before):
                lat_weather[dest].append(at - r)
                up_weather[dest].append(r - t)
    noisy_ok, noisy_lines = True, []
    for dest in run["healthy"]:
        c, w = lat_calm[dest], lat_weather[dest]
        if len(c) < MIN_SAMPLES or len(w) < MIN_SAMPLES:
            noisy_ok = False
            noisy_lines.append(f"{dest}: too few samples (calm {len(c)}, during outages {len(w)};"
                               f" {len(R.readable)} records seen readable in Kafka)")
            continue
        bound = NOISY_FACTOR * pct(c, 99) + NOISY_SLACK
        good = pct(w, 99) <= bound
        noisy_ok &= good
        noisy_lines.append(f"{dest} p99 {pct(w, 99):.3f}s during others' outages (n={len(w)})"
                           f" vs {pct(c, 99):.3f}s calm (n={len(c)}), bound {bound:.3f}s"
                           f" (before that, commit -> readable in Kafka p99 {pct(up_weather[dest], 99):.3f}s"
                           f" vs {pct(up_calm[dest], 99):.3f}s calm)")
    checks.append(check("noisy_neighbour", noisy_ok,
                        "; ".join(noisy_lines) + f" [readable in Kafka -> first 2xx; bound: p99 <= {NOISY_FACTOR:g}"
                        f" x calm p99 + {NOISY_SLACK:g}s; records readable within {INFRA_BEFORE:g}s (or the calm"
                        f" p99, if longer) before to {INFRA_AFTER:g}s after an infrastructure fault excluded]"))
    for dest in run["destinations"]:
        v = lat_all[dest]
        per_dest[dest].update({"p50": pct(v, 50), "p95": pct(v, 95), "p99": pct(v, 99), "max": max(v) if v else None})
    figures["noisy"] = {d: {"calm_p99": pct(lat_calm[d], 99), "weather_p99": pct(lat_weather[d], 99),
                            "calm_n": len(lat_calm[d]), "weather_n": len(lat_weather[d]),
                            "upstream_calm_p99": pct(up_calm[d], 99),
                            "upstream_weather_p99": pct(up_weather[d], 99)} for d in run["healthy"]}
    checks.append(check("latency", True, "first delivery after COMMIT, whole run, p50/p99: " + ", ".join(
        f"{d} {fmt_s(per_dest[d]['p50'])}/{fmt_s(per_dest[d]['p99'])}" for d in run["destinations"])))

    # ---- backlogs drained at the end
    dr = run.get("drain") or {}
    last = dr.get("last") or {}
    checks.append(check("backlogs_drained", dr.get("drained"),
                        f"{'drained' if dr.get('drained') else 'NOT drained'} "
                        f"{dr.get('end', 0) - dr.get('start', 0):.0f}s after the load stopped: outbox backlog"
                        f" {last.get('outbox')}, consumer lag {last.get('lag')}, paused {last.get('paused')}"
                        + (f", error {last['error'][:150]}" if last.get("error") else "")))

    # ---- workers: no exit but the planned kills
    unplanned = run.get("unplanned_exits", [])
    kills = [f for f in R.infra if f["kind"].startswith("kill -9")]
    checks.append(check("workers_survived", not unplanned,
                        f"{len(kills)} planned kill -9; unplanned exits: "
                        + (", ".join(f"{u['worker']} code {u['code']} at +{u['t'] - R.t0:.0f}s" for u in unplanned)
                           if unplanned else "none")))

    # ---- every fault ran and recovered
    kinds = Counter(f["kind"] for f in R.infra)
    failed = [f for f in R.faults if not f.get("ok")]
    required = REQUIRED_FAULTS + (["kill -9 ingest"] if run.get("ingest") else [])
    absent = [k for k in required if not any(kk.startswith(k) for kk in kinds)]
    checks.append(check("faults_ran", not failed and not absent,
                        ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items()))
                        + (f"; did not recover: {[(f['kind'], f['target'], f.get('error')) for f in failed][:4]}" if failed else "")
                        + (f"; never ran: {absent}" if absent else "")))

    # ---- archival to S3 by pg_cron
    archived = [x for x in R.dead if x["source"] == "s3"]
    runs = Counter(c["status"] for c in R.cron)
    old_enough = [x for x in R.dead if x["source"] == "table" and x.get("failed_at")
                  and x["failed_at"] < (run.get("ended") or R.load_end) - 90]
    checks.append(check("archived_to_s3", archived or not old_enough,
                        f"{len(archived)} dead letters in {len({x['object'] for x in archived})} S3 objects;"
                        f" pg_cron runs {dict(runs)}"
                        + (f"; {len(old_enough)} old enough were not archived" if old_enough and not archived else "")))

    # ---- the harness's own destination servers ran throughout
    restarts = run.get("destination_restarts", [])
    checks.append(check("harness_destinations", not restarts,
                        "every destination server ran throughout" if not restarts else
                        "destination servers (the harness's) died and were started again: "
                        + ", ".join(f"{r['destination']} at +{r['t'] - R.t0:.0f}s" for r in restarts)))

    # ---- the build under test did not change during the run
    before, after = run.get("build_before") or {}, run.get("build_after") or {}
    changed = [f for f in before if before.get(f) != after.get(f)]
    checks.append(check("same_build", bool(before) and not changed,
                        f"extension library, install script and wal-worker unchanged ({', '.join(before)})"
                        if before and not changed else
                        f"CHANGED during the run (another checkout's make install?): {changed or 'not recorded'};"
                        " a restarted server or worker ran other code, so this run proves nothing about one build"))
    figures["per_destination"] = {d: dict(c) for d, c in per_dest.items()}
    figures["lost"] = lost[:200]
    (Path(d) / "verdict.json").write_text(json.dumps({"checks": checks, "figures": figures}, indent=1, default=str))
    return checks


def main():
    checks = judge(sys.argv[1])
    for c in checks:
        print(f"{'PASS' if c['ok'] else 'FAIL'} {c['name']} {c['detail']}")
    sys.exit(0 if all(c["ok"] for c in checks) else 1)


if __name__ == "__main__":
    main()
