#!/usr/bin/env python3
"""The chaos run's report: a static HTML page with PNG figures beside it (matplotlib),
every time axis in seconds since the load started, fault windows shaded.

    chaos/report.py DIR       writes DIR/report/index.html (run chaos/verdict.py DIR first)

Figures: records in; delivered per destination; backlog per stage (outbox, consumer lag
per group, retry steps, DLQ, dead letters); each destination's outages, pauses and probes;
latency percentiles (COMMIT to first 2xx). Then the verdict table, the destinations'
figures and the fault log.
"""
import html
import json
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import verdict as V  # noqa: E402

FAULT_COLOURS = {"broker kill -9": "#ff7f0e", "broker SIGSTOP": "#9467bd", "two brokers kill -9": "#8c1c13",
                 "postgres immediate restart": "#d62728", "kill -9": "#7f7f7f"}
DEST_COLOURS = {"503": "#d62728", "hang": "#9467bd", "429": "#bcbd22", "flapping": "#ff9896"}


def fault_colour(kind):
    for k, c in FAULT_COLOURS.items():
        if kind.startswith(k):
            return c
    return "#7f7f7f"


def shade(ax, R, legend=False):
    for f in R.infra:
        ax.axvspan(f["start"] - R.t0, f.get("end", f["start"]) - R.t0, color=fault_colour(f["kind"]),
                   alpha=0.18, lw=0)
    ax.axvline(R.run["calm_s"], color="#2ca02c", lw=0.8, ls=":")
    ax.axvline(R.load_end - R.t0, color="black", lw=0.8, ls="--")
    if legend:
        handles = [Patch(color=c, alpha=0.3, label=k) for k, c in FAULT_COLOURS.items()]
        ax.add_artist(ax.legend(handles=handles, loc="upper left", fontsize=7, ncol=5, framealpha=0.8))


def per_second(times, t0, width=1.0):
    counts = defaultdict(int)
    for t in times:
        counts[int((t - t0) // width)] += 1
    if not counts:
        return [], []
    xs = list(range(min(counts), max(counts) + 1))
    return [x * width for x in xs], [counts[x] / width for x in xs]


def fig_records(R, out):
    fig, ax = plt.subplots(figsize=(12, 3.6))
    by_topic = defaultdict(list)
    for rec, t in R.acked.items():
        by_topic[rec[0]].append(t)
    for topic, ts in sorted(by_topic.items()):
        ax.plot(*per_second(ts, R.t0, 2.0), lw=1, label=f"{topic} acknowledged")
    http = [t for rec, t in R.acked.items() if R.ledger[rec]["client"].startswith("h")]
    if http:
        ax.plot(*per_second(http, R.t0, 2.0), lw=1, color="grey", ls="--", label="of which HTTP (ingest 201/202)")
    undone = [R.ledger[r]["s"] for r in R.undone]
    ax.plot(*per_second(undone, R.t0, 2.0), lw=1, color="black", ls=":", label="rolled back / failed")
    shade(ax, R, legend=True)
    ax.set_ylabel("records/s")
    ax.set_xlabel("s since load start (green: end of calm start, dashed: load stops)")
    ax.set_title("Records in (acknowledged: COMMIT returned, or ingest answered 2xx), per topic")
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(out / "records.png", dpi=90)
    plt.close(fig)


def fig_delivered(R, out):
    names = list(R.run["destinations"])
    fig, axes = plt.subplots(len(names), 1, figsize=(12, 1.35 * len(names) + 0.8), sharex=True)
    for ax, name in zip(axes, names):
        rs = R.receipts.get(name, [])
        ok = [r["at"] for r in rs if r.get("s") is not None and 200 <= r["s"] < 300]
        bad = [r["at"] for r in rs if r.get("s") is None or not 200 <= r["s"] < 300]
        ax.plot(*per_second(ok, R.t0, 2.0), lw=0.9, color="#2ca02c", label="2xx")
        ax.plot(*per_second(bad, R.t0, 2.0), lw=0.9, color="#d62728", label="other / no answer")
        shade(ax, R, legend=(ax is axes[0]))
        ax.set_ylabel(name, rotation=0, ha="right", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[-1].legend(fontsize=7, loc="upper right")
    axes[-1].set_xlabel("s since load start")
    axes[0].set_title("Requests per second at each destination (green 2xx, red refused, failed or hung)")
    fig.tight_layout()
    fig.savefig(out / "delivered.png", dpi=90)
    plt.close(fig)


def fig_backlog(R, out):
    db = [s for s in R.samples if s["kind"] == "db"]
    kf = [s for s in R.samples if s["kind"] == "kafka"]
    fig, axes = plt.subplots(4, 1, figsize=(12, 9), sharex=True)
    ax = axes[0]
    for state in ("pending", "processing", "processed"):
        ax.plot([s["t"] - R.t0 for s in db],
                [sum(n for k, n in s["backlog"].items() if k.endswith("|" + state)) for s in db], lw=1, label=state)
    ax.set_ylabel("outbox rows")
    ax.set_title("Outbox backlog (not yet stored in Kafka)")
    ax.legend(fontsize=7, loc="upper right")
    ax = axes[1]
    for group in R.run.get("groups", {}):
        if group == "wal_delivery.retry":
            continue
        ax.plot([s["t"] - R.t0 for s in kf], [sum(s["lag"].get(group, {}).values()) for s in kf], lw=1,
                label=group)
    ax.set_ylabel("messages")
    ax.set_title("Consumer lag per group (main topics; DLQ)")
    ax.legend(fontsize=7, loc="upper right")
    ax = axes[2]
    for i, topic in enumerate(R.run.get("retry_topics", [])):
        ax.plot([s["t"] - R.t0 for s in kf], [s["lag"].get("wal_delivery.retry", {}).get(topic, 0) for s in kf],
                lw=1, label=f"step {i + 1} ({topic}) lag")
    ax.set_ylabel("messages")
    ax.set_title("Retry steps: messages waiting (group wal_delivery.retry)")
    ax.legend(fontsize=7, loc="upper right")
    ax = axes[3]
    ax.plot([s["t"] - R.t0 for s in db], [sum(s["dead"].values()) for s in db], lw=1, color="black",
            label="dead_letters rows (archival removes them)")
    ax.set_ylabel("rows")
    ax.set_title("Dead letters in the table")
    ax.legend(fontsize=7, loc="upper left")
    for ax in axes:
        shade(ax, R)
        ax.tick_params(labelsize=7)
    axes[-1].set_xlabel("s since load start")
    fig.tight_layout()
    fig.savefig(out / "backlog.png", dpi=90)
    plt.close(fig)


def fig_pauses(R, windows, out):
    names = list(R.run["destinations"])
    fig, ax = plt.subplots(figsize=(12, 0.55 * len(names) + 1.5))
    for y, name in enumerate(names):
        for f in R.dest_windows:
            if f["target"] != name:
                continue
            colour = next((c for k, c in DEST_COLOURS.items() if k in f["kind"]), "#cccccc")
            ax.barh(y, f["end"] - f["start"], left=f["start"] - R.t0, height=0.8, color=colour, alpha=0.35, lw=0)
        for w in windows.get(name, []):
            ax.barh(y, w["end"] - w["start"], left=w["start"] - R.t0, height=0.35, color="#1f77b4", lw=0)
            for p in w["probes"]:
                ax.plot(p - R.t0, y, marker="|", color="black", ms=14, mew=1.5)
            for at in w.get("requests", []):
                ax.plot(at - R.t0, y + 0.3, marker="v", color="#d62728", ms=4)
    shade(ax, R)
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("s since load start")
    ax.set_title("Destinations: scripted outages (wide: red 503, purple hang, olive 429), pauses (blue),"
                 " probe claims (|), requests received while paused (v)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "pauses.png", dpi=90)
    plt.close(fig)


def fig_latency(R, out, bucket=5.0):
    fig, axes = plt.subplots(2, 1, figsize=(12, 6.5), sharex=True)
    series = {}
    for name in R.run["destinations"]:
        b = defaultdict(list)
        for rec, at in R.ok[name].items():
            t = R.acked.get(rec)
            if t is not None:
                b[int((t - R.t0) // bucket)].append(at - t)
        series[name] = b
    ax = axes[0]
    for name, style in zip(R.run["healthy"], ("-", "--")):
        b = series[name]
        xs = sorted(b)
        for p, colour in ((50, "#2ca02c"), (95, "#ff7f0e"), (99, "#d62728")):
            ax.plot([x * bucket for x in xs], [V.pct(b[x], p) for x in xs], ls=style, color=colour, lw=1,
                    label=f"{name} p{p}")
    ax.set_yscale("log")
    ax.set_ylabel("s (log)")
    ax.set_title(f"Healthy destinations: COMMIT to first 2xx, by commit time ({bucket:g} s buckets)")
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    ax = axes[1]
    for name, b in series.items():
        xs = sorted(b)
        ax.plot([x * bucket for x in xs], [V.pct(b[x], 99) for x in xs], lw=1, label=f"{name} p99")
    ax.set_yscale("log")
    ax.set_ylabel("s (log)")
    ax.set_title("p99 per destination (retried and paused destinations take the retry delays)")
    ax.legend(fontsize=7, ncol=4, loc="upper left")
    for ax in axes:
        shade(ax, R)
        ax.tick_params(labelsize=7)
    axes[-1].set_xlabel("s since load start (commit time)")
    fig.tight_layout()
    fig.savefig(out / "latency.png", dpi=90)
    plt.close(fig)


def fmt(x):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.3f}"
    return str(x)


def render(d):
    d = Path(d)
    R = V.Run(d)
    v = json.loads((d / "verdict.json").read_text())
    out = d / "report"
    out.mkdir(exist_ok=True)
    windows = R.pause_windows()
    for name, ws in windows.items():  # requests received while paused, as the verdict counts them
        for w in ws:
            w["requests"] = [r["at"] for r in R.receipts.get(name, []) if w["start"] + V.GRACE < r["at"] < w["end"]]
    fig_records(R, out)
    fig_delivered(R, out)
    fig_backlog(R, out)
    fig_pauses(R, windows, out)
    fig_latency(R, out)
    run, e = R.run, html.escape
    m = run.get("machine", {})
    ok_all = all(c["ok"] for c in v["checks"])
    rows = "\n".join(f"<tr class={'pass' if c['ok'] else 'fail'}><td>{'PASS' if c['ok'] else 'FAIL'}</td>"
                     f"<td>{e(c['name'])}</td><td>{e(c['detail'])}</td></tr>" for c in v["checks"])
    pd = v["figures"]["per_destination"]
    cols = ["subscribed", "delivered", "dead", "lost", "duplicates", "requests", "p50", "p95", "p99", "max"]
    drows = "\n".join(
        f"<tr><td>{e(n)}</td><td>{e(run['destinations'][n]['what'])}</td>"
        + "".join(f"<td>{fmt(pd.get(n, {}).get(c, 0 if c in ('lost', 'dead') else None))}</td>" for c in cols)
        + "</tr>" for n in run["destinations"])
    frows = "\n".join(
        f"<tr class={'pass' if f.get('ok') else 'fail'}><td>{e(f['category'])}</td><td>{e(f['kind'])}</td>"
        f"<td>{e(str(f['target']))}</td><td>{f['start'] - R.t0:.1f}</td><td>{f.get('end', f['start']) - f['start']:.1f}</td>"
        f"<td>{e(f.get('error', ''))}</td></tr>"
        for f in sorted(R.faults, key=lambda f: f["start"]) if f["category"] != "destination-driver")
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>wal_delivery chaos run {e(run['started'])}</title>
<style>body{{font-family:sans-serif;margin:1.5em;max-width:1250px}} table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}} .pass td:first-child{{color:#1a7f37;font-weight:bold}}
.fail td:first-child{{color:#c00;font-weight:bold}} .fail{{background:#fff0f0}} img{{max-width:100%}} h2{{margin-top:1.6em}}</style></head>
<body><h1>wal_delivery chaos run: {'every check passed' if ok_all else 'FAILED checks'}</h1>
<p>Started {e(run['started'])}; load {run['load_s']:.0f} s ({run['calm_s']:.0f} s calm, then fault cycles of
{run['cycle_s']:.0f} s), {run['clients']} SQL clients at {run['rate']:g} records/s, time scale {run['time_scale']}
(probe interval {run['probe_interval_s']:g} s), seed {run['seed']}. Retention compressed: topics
{e(run['retention']['topics'])}, retry and DLQ {e(run['retention']['retry_dlq'])}, dead letters archived after
{e(run['retention']['dead_letter_archive_after'])} (pg_cron every minute).<br>
Machine: {e(str(m.get('os')))}, {m.get('cpus')} CPU ({e(str(m.get('cpu')))}), {m.get('mem_gib')} GiB, load average at
start {e(str(m.get('load_avg_at_start')))}; Kafka {e(str(m.get('kafka')))} (3 brokers, KRaft); Postgres 15.
Generated {datetime.now().isoformat(timespec='seconds')}.</p>
<h2>Verdict</h2><table><tr><th></th><th>check</th><th>detail</th></tr>{rows}</table>
<h2>Records in</h2><img src="records.png">
<h2>Delivered per destination</h2><img src="delivered.png">
<h2>Backlog per stage</h2><img src="backlog.png">
<h2>Pauses and probes</h2><img src="pauses.png">
<h2>Latency</h2><img src="latency.png">
<h2>Destinations</h2><table><tr><th>destination</th><th>behaviour</th>{''.join(f'<th>{c}</th>' for c in cols)}</tr>{drows}</table>
<p>subscribed: (acknowledged record, destination) pairs; delivered: answered 2xx at least once; dead: a dead letter
(table or S3) instead; duplicates: 2xx answers beyond the first per record; latency in seconds, COMMIT to first 2xx.</p>
<h2>Fault log</h2><table><tr><th>category</th><th>fault</th><th>target</th><th>start (s)</th><th>length (s)</th><th>error</th></tr>{frows}</table>
</body></html>"""
    (out / "index.html").write_text(page)
    return out / "index.html"


if __name__ == "__main__":
    print(render(sys.argv[1]))
