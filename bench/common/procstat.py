"""CPU time of groups of processes, from /proc/<pid>/stat (utime + stime), for the
benchmarks (bench/anchors/debezium/run, bench/relay_latency/run).

    procstat.py snap FILE NAME=SPEC...     write a snapshot of each group to FILE (JSON)
    procstat.py diff BEFORE AFTER           print "NAME MS" per group: CPU ms between the two

SPEC is tree:PID (PID and every process below it; the root's cutime/cstime are counted
too, so children that exit between the snapshots are not lost: a child's full time lands
in its parent's cutime when it is reaped) or pids:PID[,PID...] (just those processes;
one that is gone at the second snapshot counts its last seen time). A JVM's threads are
inside its process's times; threads:PID:PREFIX[|PREFIX...] counts only the threads of PID
whose name (comm, at most 15 characters) starts with one of the prefixes, e.g. a Kafka
broker's request work apart from its JIT compiler and garbage collector threads.
"""
import json
import os
import sys

TICK_MS = 1000.0 / os.sysconf("SC_CLK_TCK")


def read_stat(pid):
    """(ppid, utime + stime, cutime + cstime) in ticks, or None if pid is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    # comm is in parentheses and may hold spaces: split after the last ')'
    fields = data[data.rindex(")") + 2:].split()
    # fields[0] is state (field 3); utime is field 14 -> index 11
    return int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


def all_stats():
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            s = read_stat(int(name))
            if s is not None:
                out[int(name)] = s
    return out


def thread_ticks(pid, prefixes):
    """{tid: utime + stime} of pid's threads whose comm starts with one of prefixes."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().rstrip("\n")
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                data = f.read()
        except OSError:
            continue  # the thread ended meanwhile
        if comm.startswith(prefixes):
            fields = data[data.rindex(")") + 2:].split()
            out[int(tid)] = int(fields[11]) + int(fields[12])
    return out


def group_ticks(spec, stats):
    """Per-process (or per-thread) ticks of one group: {pid: ticks}."""
    kind, _, arg = spec.partition(":")
    if kind == "threads":
        pid, _, prefixes = arg.partition(":")
        return thread_ticks(int(pid), tuple(p for p in prefixes.split("|") if p))
    if kind == "pids":
        return {int(p): stats[int(p)][1] for p in arg.split(",") if p and int(p) in stats}
    if kind == "tree":
        root = int(arg)
        if root not in stats:
            return {}
        children = {}
        for pid, (ppid, _, _) in stats.items():
            children.setdefault(ppid, []).append(pid)
        out = {root: stats[root][1] + stats[root][2]}
        todo = list(children.get(root, []))
        while todo:
            pid = todo.pop()
            out[pid] = stats[pid][1]
            todo.extend(children.get(pid, []))
        return out
    raise SystemExit(f"procstat.py: bad spec {spec!r} (tree:PID, pids:PID,... or threads:PID:PREFIX)")


def snap(path, specs):
    stats = all_stats()
    groups = {}
    for item in specs:
        name, _, spec = item.partition("=")
        groups[name] = {"spec": spec, "ticks": group_ticks(spec, stats)}
    with open(path, "w") as f:
        json.dump(groups, f)


def diff(before_path, after_path):
    with open(before_path) as f:
        before = json.load(f)
    with open(after_path) as f:
        after = json.load(f)
    for name, b in before.items():
        a = after.get(name, {"ticks": {}})
        b_ticks = {int(k): v for k, v in b["ticks"].items()}
        a_ticks = {int(k): v for k, v in a["ticks"].items()}
        total = 0
        for pid in set(b_ticks) | set(a_ticks):
            if pid in a_ticks:
                total += a_ticks[pid] - b_ticks.get(pid, 0)
            # gone: in a tree its time moved into the root's cutime; for pids, nothing more known
        print(f"{name} {total * TICK_MS:.0f}")


def main(argv):
    if len(argv) >= 3 and argv[1] == "snap":
        snap(argv[2], argv[3:])
    elif len(argv) == 4 and argv[1] == "diff":
        diff(argv[2], argv[3])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
