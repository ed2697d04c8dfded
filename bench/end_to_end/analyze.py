#!/usr/bin/env python3
"""Latency split for bench/end_to_end/run: joins the reader's lines with the sink's log.

    analyze.py READER_FILE SINK_LOG LABEL

READER_FILE: "<sent_us> <kafka_us> <read_us> <outbox id>" per record (bench/relay_latency's
consume.c: the enqueue clock, Kafka's record timestamp, when a bare reader read it).
SINK_LOG: "<receive_us> <path> <outbox id> <status>" per request (bench/deliver/sink.c -l).
Paths /w/... are wal-worker consume's requests, /b/... the bare loop's. Every clock is this
machine's. Prints, per consumer, p50/p99/max in ms of each part, over every (record,
destination) copy of the records in READER_FILE, and the copies that never arrived.
"""

import sys


def pct(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100.0 * len(values)))]


def fmt(us):
    return "%7.1f / %7.1f / %7.1f" % (
        pct(us, 50) / 1000,
        pct(us, 99) / 1000,
        max(us) / 1000 if us else 0,
    )


def main():
    reader, sink_log, label = sys.argv[1:4]
    recs = {}
    for line in open(reader):
        sent, kafka, read, oid = line.split()
        recs[oid] = (int(sent), int(kafka), int(read))
    first = {}  # (consumer, path, id) -> first 2xx receive
    for line in open(sink_log):
        parts = line.split()
        if len(parts) != 4 or parts[2] not in recs or not parts[3].startswith("2"):
            continue
        recv, path, oid = int(parts[0]), parts[1], parts[2]
        key = (path[1], path, oid)
        if key not in first or recv < first[key]:
            first[key] = recv
    paths = {}
    for c, path, _ in first:
        paths.setdefault(c, set()).add(path)
    print(f"{label}: {len(recs)} records")
    print("  %-42s %s" % ("ms, p50 / p99 / max", ""))
    sent_kafka = [k - s for s, k, _ in recs.values()]
    kafka_read = [r - k for _, k, r in recs.values()]
    print("  %-42s %s" % ("enqueue -> Kafka record timestamp", fmt(sent_kafka)))
    print("  %-42s %s" % ("Kafka -> a bare reader has it", fmt(kafka_read)))
    p99, p50 = {}, {}
    for c, name in (("b", "bare loop"), ("w", "wal-worker consume")):
        kd, ed, missing = [], [], 0
        for path in sorted(paths.get(c, ())):
            for oid, (s, k, _) in recs.items():
                t = first.get((c, path, oid))
                if t is None:
                    missing += 1
                    continue
                kd.append(t - k)
                ed.append(t - s)
        p99[c] = pct(kd, 99)
        p50[c] = pct(kd, 50)
        print(
            "  %-42s %s   (%d copies to %d destinations, %d missing)"
            % (
                f"Kafka -> destination, {name}",
                fmt(kd),
                len(kd),
                len(paths.get(c, ())),
                missing,
            )
        )
        print("  %-42s %s" % (f"enqueue -> destination, {name}", fmt(ed)))
    if p50.get("w") is not None:
        print(
            "  the worker's own part, p50 (Kafka -> destination minus Kafka -> reader): %.1f ms"
            % ((p50["w"] - pct(kafka_read, 50)) / 1000)
        )
    if p99.get("b") and p99.get("w"):
        r = p99["w"] / p99["b"]
        print(
            "  p99 Kafka -> destination, worker / bare loop: %.2f (goal <= 1.2: %s)"
            % (r, "met" if r <= 1.2 else "NOT met")
        )


main()
