#!/usr/bin/env python3
"""WAL bytes per record by record type, two runs side by side, from `pg_waldump --stats=record`.

    waldump_types.py A_STATS A_RECORDS B_STATS B_RECORDS [TOP]

Prints the TOP (8) record types whose bytes per record (record and full-page images
together) differ most between A and B, as "type a/record b/record (count a, count b)":
where one side's steady-rate WAL goes that the other's does not.
"""
import re
import sys

ROW = re.compile(r"^(\S+)\s+(\d+)\s+\(\s*[\d.]+\)\s+\d+\s+\(\s*[\d.]+\)\s+\d+\s+\(\s*[\d.]+\)\s+(\d+)\s+\(")


def load(path):
    """{record type: (records, combined bytes)} from pg_waldump's per-record statistics."""
    types = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = ROW.match(line)
            if m:
                types[m.group(1)] = (int(m.group(2)), int(m.group(3)))
    return types


def main():
    a, na, b, nb = load(sys.argv[1]), float(sys.argv[2]), load(sys.argv[3]), float(sys.argv[4])
    top = int(sys.argv[5]) if len(sys.argv) > 5 else 8
    rows = []
    for t in set(a) | set(b):
        ca, ba = a.get(t, (0, 0))
        cb, bb = b.get(t, (0, 0))
        rows.append((abs(ba / na - bb / nb), t, ba / na, bb / nb, ca, cb))
    for _, t, pa, pb, ca, cb in sorted(rows, reverse=True)[:top]:
        print(f"{t} {pa:.1f}/{pb:.1f} B ({ca}, {cb})")


if __name__ == "__main__":
    main()
