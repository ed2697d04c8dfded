#!/usr/bin/env python3
"""The chaos run (issue 19, "Now break all of it"): the whole system together under faults,
then a verdict and a report. Nothing is mocked: a 3-broker Kafka (KRaft) and Postgres from
tests/env, the relay inside Postgres, every wal-worker role, an S3 server (moto, SigV4
enforced) for archival by pg_cron, and HTTP destinations with scripted behaviour.

    chaos/run [--duration 2m] [--out DIR] [--rate 20] [--seed N] [--no-build] [--keep-env]

Phases: set-up; load (SQL generators) with a calm start, then fault cycles; drain (load
stopped, faults healed, wait until every backlog is empty); collect; verdict; report.
Each phase logs to stderr; everything the run saw lands in --out (default
.cache/chaos/<date-time>): ledger/ (every record a generator enqueued, with its fate),
dest/ (every request each destination got), faults.jsonl, samples.jsonl, workers/ (logs),
db/ (the database's and S3's final word), verdict.json and report/index.html.
The exit status is 0 only when every check of the verdict passed.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from datetime import datetime
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "chaos"))
ENV = ROOT / "tests" / "env"
WORKER = os.environ.get("WAL_WORKER_BIN") or str(ROOT / "bin" / "wal-worker")
PY = sys.executable
TIME_SCALE = 10
PEER_TOKEN = "chaos-peer-token-5d1e"

# ------------------------------------------------------------------ what runs
TOPICS = {
    # name: (processor, subscribers)
    "chaos.orders": (None, ["healthy", "busy", "slow", "down", "throttled", "rejecting"]),
    "chaos.events": (None, ["healthy", "busy", "hanging", "flapping", "throttled"]),
    "chaos.enriched": ("chaos.enrich", ["healthy", "busy", "down", "flapping"]),
}
# name: (what it does, destination settings)
DESTINATIONS = {
    "healthy": ("always 200 (shared consumer): the noisy-neighbour reference", {}),
    "busy": ("always 200, dedicated consumer (its own group)", {"dedicated": True}),
    "slow": ("answers after 600 ms", {}),
    "down": ("503 for 45 s of every cycle, then back: pauses, probes, resumes", {}),
    "throttled": ("429 with Retry-After: 1 for 30% of requests after the calm start", {}),
    "hanging": ("never answers for 18 s of every cycle (timeout 2 s)", {"timeout": "2 seconds"}),
    "rejecting": ("400 for 10% of requests: those records must be dead letters", {}),
    "flapping": ("alternates 8 s of 503 and 8 s of 200 after the calm start", {}),
}
HEALTHY = ["healthy", "busy"]
STEADY = {  # the behaviour each destination has outside its scripted windows
    "slow": {"delay_ms": 600},
    "rejecting": {"status": 400, "ratio": 0.1},
}
WORKERS = [  # (name, role, extra arguments)
    ("consume-1", "consume", []), ("consume-2", "consume", []),
    ("consume-busy", "consume", ["--destination", "busy"]),
    ("retry-1", "retry", []), ("retry-2", "retry", []),
    ("dlq", "dlq", []), ("process", "process", []),
]
INGEST_WORKERS = [("ingest-1", "ingest", []), ("ingest-2", "ingest", [])]  # behind HAProxy
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
PROBE_INTERVAL = 120.0 / TIME_SCALE  # destinations' default probe_interval, scaled
# Compressed retention: main topics 7 days -> 1 hour, retry steps and DLQ 14 days -> 2
# hours; dead letters are archived after 20 s instead of 10 days (pg_cron every minute).
TOPIC_RETENTION, RETRY_DLQ_RETENTION, ARCHIVE_AFTER = "1 hour", "2 hours", "20 seconds"
ARCHIVE_BUCKET, ARCHIVE_PREFIX = "chaos-dead-letters", "chaos"

T0 = None  # load start (epoch seconds); log lines count from it
LOG = None


def log(msg):
    rel = f"{time.time() - T0:7.1f}s" if T0 else "  setup "
    line = f"chaos [{rel}] {msg}"
    print(line, file=sys.stderr, flush=True)
    if LOG:
        LOG.write(line + "\n")
        LOG.flush()


def parse_duration(text):
    m = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s?)?", text.strip())
    if not m or not any(m.groups()):
        raise argparse.ArgumentTypeError(f"a duration like 2m, 150s or 30m, got {text!r}")
    h, mi, s = (int(g or 0) for g in m.groups())
    return h * 3600 + mi * 60 + s


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def jsonl(path):
    return open(path, "a", buffering=1)


# libpq's connection variables: the run's own processes connect where it says. PGBIN and
# PG_CONFIG stay (tests/pg-prefix): they choose the Postgres the environment runs.
LIBPQ_VARS = {"PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGPASSWORD", "PGSERVICE",
              "PGOPTIONS", "PGAPPNAME", "PGSSLMODE", "PGCONNECT_TIMEOUT"}


def child_env(**extra):
    return {**{k: v for k, v in os.environ.items() if k not in LIBPQ_VARS}, **extra}


def build_fingerprint():
    """What the run executes: the extension's library and install script as the server
    finds them, and wal-worker. On a machine where several checkouts `make install`, a
    change during a run (a restarted server loads the new library) invalidates it."""
    import hashlib
    pgbin = os.environ.get("PGBIN") or subprocess.run(["pg_config", "--bindir"], capture_output=True,
                                                     text=True).stdout.strip()
    pg_config = str(Path(pgbin) / "pg_config") if Path(pgbin, "pg_config").exists() else "pg_config"
    def ask(flag):
        return subprocess.run([pg_config, flag], capture_output=True, text=True).stdout.strip()
    files = [Path(ask("--pkglibdir")) / "wal_delivery.so",
             Path(ask("--sharedir")) / "extension" / "wal_delivery--1.0.sql", Path(WORKER)]
    out = {}
    for f in files:
        try:
            out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()[:16]
        except OSError:
            out[str(f)] = None
    return out


# ------------------------------------------------------------------ environment
class Env:
    """A tests/env environment of our own (3 brokers), in its own WAL_ENV_DIR."""

    def __init__(self, env_dir):
        self.dir = env_dir
        self.settings = {}

    def cmd(self, *args, check=True, timeout=300):
        env = child_env(WAL_ENV_DIR=self.dir)
        out = subprocess.run([str(ENV), *args], capture_output=True, text=True, env=env, timeout=timeout)
        if check and out.returncode != 0:
            raise RuntimeError(f"tests/env {' '.join(args)} failed: {out.stderr.strip()[-800:]}")
        return out

    def up(self):
        out = self.cmd("up", "--brokers", "3")
        for line in out.stdout.splitlines():
            k, _, v = line.removeprefix("export ").partition("=")
            self.settings[k] = v.strip("'")

    def track(self, name, pid):
        self.cmd("track", name, str(pid), check=False)

    def broker_pid(self, n):
        return int(Path(self.dir, "kafka", f"n{n}.pid").read_text())

    def kafka_start(self, n):
        """tests/env kafka-start, tried again while the broker cannot bind its port (another
        process took it while the broker was down) or does not come up."""
        for attempt in range(4):
            try:
                return self.cmd("kafka-start", str(n), timeout=240)
            except RuntimeError as e:
                if attempt == 3:
                    raise
                log(f"broker {n} did not start ({str(e)[-120:]}); trying again in 5 s")
                time.sleep(5)

    def broker_alive(self, n):
        try:
            os.kill(self.broker_pid(n), 0)
            return True
        except (OSError, ValueError):
            return False

    def conninfo(self, user="postgres", app="chaos"):
        return (f"host=127.0.0.1 port={self.settings['PGPORT']} dbname=wal_delivery user={user}"
                f" application_name={app}")

    def connect(self, user="postgres", timeout=3):
        return psycopg.connect(self.conninfo(user), autocommit=True, connect_timeout=timeout)

    def connect_when_ready(self, user="postgres", timeout=90):
        deadline = time.time() + timeout
        while True:
            try:
                return self.connect(user)
            except psycopg.OperationalError:
                if time.time() > deadline:
                    raise
                time.sleep(0.3)


# ------------------------------------------------------------------ set-up
SUPERUSER_SQL = """
CREATE EXTENSION IF NOT EXISTS pg_cron;
CREATE EXTENSION IF NOT EXISTS wal_delivery;
CREATE ROLE chaos_admin LOGIN IN ROLE wal_delivery_admin;   -- the DBA (configuration)
CREATE ROLE chaos_app LOGIN IN ROLE wal_delivery_writer;    -- the generators
CREATE SCHEMA chaos;
GRANT USAGE ON SCHEMA chaos TO PUBLIC;   -- the processor runs as the processing role
-- The processing topic's processor: the record with a mark destinations can see.
CREATE FUNCTION chaos.enrich(p bytea) RETURNS bytea LANGUAGE sql IMMUTABLE AS $$
    SELECT convert_to((convert_from(p, 'UTF8')::jsonb
                       || jsonb_build_object('enriched_by', 'chaos.enrich'))::text, 'UTF8')
$$;
-- Every change of a destination's pause row, with the time it happened: the pause and
-- probe timeline of the verdict and the report.
CREATE TABLE chaos.pause_audit (
    at timestamptz NOT NULL DEFAULT clock_timestamp(), destination text, op text,
    old_paused boolean, paused boolean, since timestamptz, old_probes integer, probes integer,
    last_probe_at timestamptz, last_probe_outcome text, probe_holder text,
    next_probe_at timestamptz, reason text);
CREATE FUNCTION chaos.audit_pause() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog AS $$
BEGIN
    INSERT INTO chaos.pause_audit (destination, op, old_paused, paused, since, old_probes, probes,
                                   last_probe_at, last_probe_outcome, probe_holder, next_probe_at, reason)
    VALUES (NEW.destination, TG_OP, CASE WHEN TG_OP = 'UPDATE' THEN OLD.paused END, NEW.paused,
            NEW.since, CASE WHEN TG_OP = 'UPDATE' THEN OLD.probes END, NEW.probes,
            NEW.last_probe_at, NEW.last_probe_outcome, NEW.probe_holder, NEW.next_probe_at, NEW.reason);
    RETURN NULL;
END $$;
CREATE TRIGGER chaos_audit AFTER INSERT OR UPDATE ON wal_delivery.destination_pauses
    FOR EACH ROW EXECUTE FUNCTION chaos.audit_pause();
"""


def configure(env, dest_urls, s3, ingest):
    """Returns the ingest token (None without ingest)."""
    token = None
    with env.connect() as conn:
        conn.execute(SUPERUSER_SQL)
        # The workers' login: a member of wal_delivery_worker (exactly what the workers call)
        # where the extension has that role, else of wal_delivery_admin; never a superuser.
        worker_role = "wal_delivery_worker" if conn.execute(
            "SELECT 1 FROM pg_roles WHERE rolname = 'wal_delivery_worker'").fetchone() else "wal_delivery_admin"
        conn.execute(f"CREATE ROLE chaos_worker LOGIN IN ROLE {worker_role}")
        if ingest:  # the ingest service's login: a member of wal_delivery_ingest only
            conn.execute("CREATE ROLE chaos_ingest LOGIN IN ROLE wal_delivery_ingest")
    # Everything else as the DBA would: a non-superuser member of wal_delivery_admin.
    with env.connect("chaos_admin") as conn:
        conn.execute(
            "UPDATE wal_delivery.settings SET internal_topic_replication_factor = 3,"
            " internal_topic_min_insync_replicas = 2, retry_dlq_retention = %s,"
            " dead_letter_archive_after = %s, archive_s3_endpoint = %s, archive_s3_bucket = %s,"
            " archive_s3_prefix = %s, archive_s3_path_style = true, archive_s3_allow_http = true,"
            " archive_s3_region = 'us-east-1'",
            (RETRY_DLQ_RETENTION, ARCHIVE_AFTER, s3.endpoint, ARCHIVE_BUCKET, ARCHIVE_PREFIX))
        conn.execute("INSERT INTO wal_delivery.archive_credentials (access_key_id, secret_access_key)"
                     " VALUES (%s, %s)", (s3.access_key_id, s3.secret_access_key))
        for name, (processor, _) in TOPICS.items():
            cols = {"name": name, "partitions": 3, "replication_factor": 3, "min_insync_replicas": 2,
                    "retention": TOPIC_RETENTION, "acks": -1}
            if processor:
                cols.update(processor_kind="sql", processor=processor, processing_lease="5 seconds")
            conn.execute(f"INSERT INTO wal_delivery.topics ({', '.join(cols)})"
                         f" VALUES ({', '.join(['%s'] * len(cols))})", list(cols.values()))
        for name, (_, settings) in DESTINATIONS.items():
            cols = {"name": name, "endpoint": dest_urls[name], **settings}
            conn.execute(f"INSERT INTO wal_delivery.destinations ({', '.join(cols)})"
                         f" VALUES ({', '.join(['%s'] * len(cols))})", list(cols.values()))
        for topic, (_, subscribers) in TOPICS.items():
            for d in subscribers:
                conn.execute("INSERT INTO wal_delivery.subscriptions (topic, destination) VALUES (%s, %s)",
                             (topic, d))
        if ingest:
            token = conn.execute("SELECT wal_delivery.create_ingest_token('chaos', %s)",
                                 (list(TOPICS),)).fetchone()[0]
        # The daily archival job, compressed to every minute (pg_cron's finest schedule).
        conn.execute("SELECT wal_delivery.schedule_dead_letter_archival('* * * * *')")
        deadline = time.time() + 120
        while not conn.execute("SELECT version = published_version FROM wal_delivery.config_version").fetchone()[0]:
            if time.time() > deadline:
                raise RuntimeError("the configuration was not published (reconciler) within 120 s")
            time.sleep(0.5)
    return token


# ------------------------------------------------------------------ destinations
class Destinations:
    def __init__(self, env, out):
        self.env, self.out = env, out
        self.procs, self.urls, self.ports = {}, {}, {}
        self.current, self.restarts = {}, []
        self.lock = threading.Lock()
        (out / "dest").mkdir()
        for name in DESTINATIONS:
            self.spawn(name)
            self.urls[name] = f"http://127.0.0.1:{self.ports[name]}/{name}"
        self.base = {n: u.rsplit("/", 1)[0] for n, u in self.urls.items()}
        self.stopping = threading.Event()
        threading.Thread(target=self.watch, daemon=True).start()

    def spawn(self, name):
        p = subprocess.Popen([PY, str(ROOT / "chaos" / "destination.py"), "--port", str(self.ports.get(name, 0)),
                              "--log", str(self.out / "dest" / f"{name}.jsonl")], stdout=subprocess.PIPE, text=True,
                             stderr=open(self.out / "dest" / f"{name}.err", "a"))
        line = p.stdout.readline()
        if not line.startswith("listening on "):
            raise RuntimeError(f"destination {name} did not start: {line!r}")
        self.env.track(f"chaos-dest-{name}", p.pid)
        self.procs[name] = p
        self.ports[name] = int(line.split(":")[-1])

    def watch(self):
        """A destination server that died (it is the harness's, not the system's) is started
        again on its port with its behaviour; the verdict counts it as a harness failure."""
        while not self.stopping.wait(1.0):
            for name, p in list(self.procs.items()):
                if p.poll() is None or self.stopping.is_set():
                    continue
                log(f"HARNESS: destination server {name} exited ({p.returncode}); starting it again")
                self.restarts.append({"t": time.time(), "destination": name, "code": p.returncode})
                try:
                    with self.lock:
                        self.spawn(name)
                    if name in self.current:
                        self.behave(name, self.current[name])
                except Exception as e:
                    log(f"HARNESS: destination {name} could not be started again: {e}")

    def behave(self, name, behaviour):
        """The destination's whole behaviour from now on (the newest behaviour wins)."""
        b = {"status": 200, **behaviour}
        req = urllib.request.Request(self.base[name] + "/_control/behaviour", data=json.dumps(b).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10).read()
        self.current[name] = b

    def steady(self, name):
        self.behave(name, STEADY.get(name, {}))

    def stop(self):
        self.stopping.set()
        for p in self.procs.values():
            p.terminate()
        for p in self.procs.values():
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()


# ------------------------------------------------------------------ workers
class Worker:
    def __init__(self, name, role, args, env, out):
        self.name, self.role, self.args, self.env, self.out = name, role, args, env, out
        self.proc, self.port, self.starts = None, None, 0
        self.listen = free_port() if role == "ingest" else None  # the same across restarts
        self.planned_exit, self.restart_at, self.exit_seen = False, None, False
        self.exits = []  # (time, code, planned)

    def start(self):
        # The admin port stays the same across restarts: a fresh free port could be the one
        # a broker killed a moment ago must bind again.
        self.port = self.port or free_port()
        self.starts += 1
        extra = ["--listen", f"127.0.0.1:{self.listen}"] if self.listen else []
        user = "chaos_ingest" if self.role == "ingest" else "chaos_worker"
        cmd = [WORKER, self.role, *self.args, *extra, "--time-scale", str(TIME_SCALE), "--admin-port", str(self.port),
               "--db", self.env.conninfo(user, f"chaos-{self.name}"),
               "-X", f"bootstrap.servers={self.env.settings['KAFKA_BOOTSTRAP']}",
               "-X", "session.timeout.ms=6000", "-X", "heartbeat.interval.ms=1000"]
        logf = open(self.out / "workers" / f"{self.name}.log", "a")
        logf.write(f"===== chaos: start {self.starts} at {time.time():.3f}: {' '.join(cmd)}\n")
        logf.flush()
        env = child_env(WAL_PEER_TOKEN=PEER_TOKEN)
        self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env)
        logf.close()
        self.planned_exit, self.restart_at, self.exit_seen = False, None, False
        self.env.track(f"chaos-worker-{self.name}", self.proc.pid)

    def ready(self):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False


class Supervisor(threading.Thread):
    """Keeps every worker running, as a service manager would: a worker that exits is
    started again 1 s later (2 s after a planned kill -9). Unplanned exits are recorded."""

    def __init__(self, env, out, specs):
        super().__init__(daemon=True)
        (out / "workers").mkdir()
        self.workers = {n: Worker(n, r, a, env, out) for n, r, a in specs}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.events = jsonl(out / "workers.jsonl")

    def start_all(self):
        for w in self.workers.values():
            w.start()
            self.events.write(json.dumps({"t": time.time(), "worker": w.name, "event": "start"}) + "\n")
        deadline = time.time() + 90
        for w in self.workers.values():
            while not w.ready():
                if w.proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"worker {w.name} did not become ready (log {w.out}/workers/{w.name}.log)")
                time.sleep(0.3)
        self.start()

    def kill9(self, name, restart_after=2.0):
        with self.lock:
            w = self.workers[name]
            w.planned_exit = True
            w.restart_at = time.time() + restart_after
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGKILL)
            starts = w.starts
        return w, starts

    def run(self):
        while not self.stopping.wait(0.3):
            with self.lock:
                now = time.time()
                for w in self.workers.values():
                    code = w.proc.poll()
                    if code is None:
                        continue
                    if not w.exit_seen:
                        w.exit_seen = True
                        w.exits.append((now, code, w.planned_exit))
                        self.events.write(json.dumps({"t": now, "worker": w.name, "event": "exit",
                                                      "code": code, "planned": w.planned_exit}) + "\n")
                        if not w.planned_exit:
                            log(f"UNPLANNED exit of worker {w.name} (code {code}); restarting it in 1 s")
                            w.restart_at = now + 1.0
                    if now >= w.restart_at and not self.stopping.is_set():
                        w.start()
                        self.events.write(json.dumps({"t": now, "worker": w.name, "event": "start"}) + "\n")

    def stop_all(self):
        self.stopping.set()
        with self.lock:
            for w in self.workers.values():
                if w.proc.poll() is None:
                    w.proc.send_signal(signal.SIGTERM)
            for w in self.workers.values():
                try:
                    code = w.proc.wait(20)
                except subprocess.TimeoutExpired:
                    w.proc.kill()
                    code = w.proc.wait()
                self.events.write(json.dumps({"t": time.time(), "worker": w.name, "event": "stop",
                                              "code": code}) + "\n")

    def unplanned_exits(self):
        return [{"worker": w.name, "t": t, "code": c} for w in self.workers.values()
                for t, c, planned in w.exits if not planned]


def ingest_available():
    out = subprocess.run([WORKER, "--help"], capture_output=True, text=True)
    return re.search(r"^\s+ingest\s", out.stdout, re.M) is not None


def start_haproxy(env, out, backends):
    """HAProxy in front of the ingest instances, health-checking /readyz; returns its port."""
    port = free_port()
    servers = "\n".join(f"    server {n} 127.0.0.1:{p} check inter 200ms fall 2 rise 2" for n, p in backends)
    cfg = out / "haproxy.cfg"
    cfg.write_text(f"""global
    maxconn 2000
defaults
    mode http
    timeout connect 1s
    timeout client 30s
    timeout server 30s
    retries 2
    option redispatch
frontend ingest
    bind 127.0.0.1:{port}
    default_backend ingest
backend ingest
    balance roundrobin
    option httpchk GET /readyz
{servers}
""")
    proc = subprocess.Popen([HAPROXY, "-f", str(cfg), "-db"], stdout=subprocess.DEVNULL,
                            stderr=open(out / "haproxy.log", "w"))
    env.track("chaos-haproxy", proc.pid)
    return proc, port


# ------------------------------------------------------------------ faults
class Faults:
    """Runs each fault in its own thread and logs its window (start, end, ok) to
    faults.jsonl. Broker faults take turns (one lock), each waiting for all three brokers
    to be up before it starts, so "two brokers down at once" is the worst Kafka sees."""

    def __init__(self, env, sup, dests, out):
        self.env, self.sup, self.dests = env, sup, dests
        self.file = jsonl(out / "faults.jsonl")
        self.records, self.threads = [], []
        self.broker_lock = threading.Lock()
        self.lock = threading.Lock()

    def window(self, category, kind, target, fn):
        def body():
            rec = {"category": category, "kind": kind, "target": target, "start": time.time()}
            try:
                fn(rec)
                rec["ok"] = True
            except Exception as e:  # the verdict shows a fault that did not run as planned
                rec["ok"], rec["error"] = False, f"{type(e).__name__}: {e}"[:600]
                log(f"fault {kind} {target}: FAILED: {rec['error']}")
            rec.setdefault("end", time.time())
            with self.lock:
                self.file.write(json.dumps(rec) + "\n")
                self.records.append(rec)
            if category == "infra":
                log(f"fault {kind} ({target}): {rec['end'] - rec['start']:.1f} s")
        t = threading.Thread(target=body, daemon=True)
        t.start()
        self.threads.append(t)

    def wait_brokers_up(self, timeout=180):
        deadline = time.time() + timeout
        while not all(self.env.broker_alive(n) for n in (1, 2, 3)):
            if time.time() > deadline:
                raise RuntimeError("a broker is still down from an earlier fault")
            time.sleep(0.5)

    def broker_kill(self, n, down):
        def fn(rec):
            with self.broker_lock:
                self.wait_brokers_up()
                rec["start"] = time.time()
                self.env.cmd("kafka-kill", str(n))
                time.sleep(down)
                self.env.kafka_start(n)
        self.window("infra", "broker kill -9", f"broker {n}", fn)

    def broker_stop(self, n, secs):
        def fn(rec):
            with self.broker_lock:
                self.wait_brokers_up()
                rec["start"] = time.time()
                pid = self.env.broker_pid(n)
                os.kill(pid, signal.SIGSTOP)
                try:
                    time.sleep(secs)
                finally:
                    os.kill(pid, signal.SIGCONT)
        self.window("infra", "broker SIGSTOP", f"broker {n}", fn)

    def two_brokers(self, pair, down):
        def fn(rec):
            with self.broker_lock:
                self.wait_brokers_up()
                rec["start"] = time.time()
                for n in pair:
                    self.env.cmd("kafka-kill", str(n))
                time.sleep(down)
                errors = []

                def start(n):
                    try:
                        self.env.kafka_start(n)
                    except Exception as e:
                        errors.append(str(e))
                ts = [threading.Thread(target=start, args=(n,)) for n in pair]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()
                if errors:
                    raise RuntimeError("; ".join(errors))
        self.window("infra", "two brokers kill -9", "brokers " + "+".join(map(str, pair)), fn)

    def pg_restart(self, down):
        def fn(rec):
            self.env.cmd("pg-stop-immediate")
            time.sleep(down)
            self.env.cmd("pg-start", timeout=240)
        self.window("infra", "postgres immediate restart", "postgres", fn)

    def worker_kill(self, name):
        """kill -9, then the worker must be ready again within 90 s of Kafka being whole: a
        group member can only rejoin while its group's coordinator answers, so the time a
        broker fault overlapping the restart holds (the broker lock is held from the kill
        until the broker is back) does not count against the worker."""
        def fn(rec):
            w, starts = self.sup.kill9(name)
            counted, last = 0.0, time.time()
            while not (w.starts > starts and w.ready()):
                now = time.time()
                if not self.broker_lock.locked():
                    counted += now - last
                last = now
                if counted > 90:
                    raise RuntimeError(f"{name} was not ready again within 90 s of Kafka being whole")
                time.sleep(0.2)
        self.window("infra", f"kill -9 {name.split('-')[0]}", name, fn)

    def dest_window(self, name, kind, behaviour, secs):
        def fn(rec):
            self.dests.behave(name, behaviour)
            time.sleep(secs)
            self.dests.steady(name)
        self.window("destination", kind, name, fn)

    def flapping(self, name, until, period=8.0):
        def fn(rec):
            bad = True
            while time.time() < until - 0.5:
                start = time.time()
                self.dests.behave(name, {"status": 503} if bad else {})
                time.sleep(max(0.0, min(period, until - time.time())))
                if bad:
                    with self.lock:
                        r = {"category": "destination", "kind": "503 (flapping)", "target": name,
                             "start": start, "end": time.time(), "ok": True}
                        self.file.write(json.dumps(r) + "\n")
                        self.records.append(r)
                bad = not bad
            self.dests.steady(name)
            rec["end"] = rec["start"]  # the 503 halves are logged one by one
        self.window("destination-driver", "flapping", name, fn)

    def join(self, timeout):
        deadline = time.time() + timeout
        for t in self.threads:
            t.join(max(0.1, deadline - time.time()))
        return all(not t.is_alive() for t in self.threads)


def cycle_template(rng, ingest):
    """One fault cycle (100 s): destination outages alone first (until 28 s: the
    noisy-neighbour window, nothing else is wrong), then every infrastructure fault in turn.
    Broker faults take turns (each waits until all three brokers are back), so on a busy
    machine, where a broker takes long to restart, they slip later in the cycle."""
    shared, retry = rng.sample(["consume-1", "consume-2"], 2), rng.sample(["retry-1", "retry-2"], 2)
    return [  # (offset s, estimated length s, what)
        (0, 45, ("dest", "down", "503", {"status": 503}, 45)),
        (10, 15, ("dest", "hanging", "hang", {"hang": True}, 15)),
        (30, 8, ("broker_stop", rng.choice([1, 2, 3]), 8)),
        (33, 3, ("worker", shared[0])),
        (37, 3, ("worker", retry[0])),
        (40, 25, ("broker_kill", rng.choice([1, 2, 3]), 8)),
        (44, 3, ("worker", "dlq")),
        (48, 3, ("worker", "process")),
        (52, 8, ("pg", 4)),
        (62, 3, ("worker", "consume-busy")),
        (70, 25, ("two_brokers", sorted(rng.sample([1, 2, 3], 2)), 6)),
        (78, 3, ("worker", shared[1])),
        (82, 3, ("worker", retry[1])),
    ] + ([(66, 3, ("worker", rng.choice(["ingest-1", "ingest-2"])))] if ingest else [])


CYCLE = 100.0


def plan(load_s, calm_s, rng, ingest):
    """[(seconds after load start, what)] for the whole load phase."""
    steps = [(calm_s, ("throttled", load_s - calm_s)), (calm_s, ("flapping", load_s))]
    c0 = calm_s
    while c0 + 50 <= load_s:
        for off, est, what in cycle_template(rng, ingest):
            if c0 + off + est <= load_s:
                steps.append((c0 + off, what))
        c0 += CYCLE
    return sorted(steps, key=lambda s: s[0])


def run_step(faults, what):
    kind = what[0]
    if kind == "dest":
        _, name, label, behaviour, secs = what
        faults.dest_window(name, label, behaviour, secs)
    elif kind == "throttled":
        faults.dest_window("throttled", "429 Retry-After (30%)",
                           {"status": 429, "ratio": 0.3, "headers": {"Retry-After": "1"}}, what[1])
    elif kind == "flapping":
        faults.flapping("flapping", T0 + what[1])
    elif kind == "worker":
        faults.worker_kill(what[1])
    elif kind == "broker_kill":
        faults.broker_kill(what[1], what[2])
    elif kind == "broker_stop":
        faults.broker_stop(what[1], what[2])
    elif kind == "two_brokers":
        faults.two_brokers(what[1], what[2])
    elif kind == "pg":
        faults.pg_restart(what[1])


# ------------------------------------------------------------------ sampling
class Sampler:
    """Samples the database every second into samples.jsonl, and Kafka's consumer lag every
    two seconds into samples-kafka.jsonl (chaos/lag.py); notes when each record of the main
    topics became readable in Kafka into readable.jsonl (chaos/readable.py). Each of those
    two runs in its own process, started again if it dies. A sample that fails while
    something is down is skipped."""

    def __init__(self, env, groups, out):
        self.env, self.groups, self.out = env, groups, out
        self.file = jsonl(out / "samples.jsonl")
        self.kafka_path = out / "samples-kafka.jsonl"
        self.stop = threading.Event()
        self.procs = {}  # name -> (argv, process)
        self.restarts = Counter()
        self.threads = [threading.Thread(target=self.db_loop, daemon=True),
                        threading.Thread(target=self.proc_watch, daemon=True)]

    def db_loop(self):
        conn = None
        while not self.stop.wait(1.0):
            try:
                if conn is None or conn.closed:
                    conn = self.env.connect(timeout=2)
                    conn.execute("SET statement_timeout = '3s'")
                t = time.time()
                backlog = {f"{topic}|{state}": n for topic, state, n in conn.execute(
                    "SELECT topic, state::text, records FROM wal_delivery.backlog")}
                status = {r[0]: {"breaker": r[1], "backlog": r[2], "probes": r[3], "cf": r[4]}
                          for r in conn.execute(
                              "SELECT destination, breaker, backlog, probes, consecutive_failures"
                              " FROM wal_delivery.destination_status")}
                dead = dict(conn.execute("SELECT coalesce(destination, '(' || origin || ')'), count(*)"
                                         " FROM wal_delivery.dead_letters GROUP BY 1").fetchall())
                self.file.write(json.dumps({"t": t, "kind": "db", "backlog": backlog, "status": status,
                                            "dead": dead}) + "\n")
            except (psycopg.Error, OSError):
                try:
                    if conn is not None:
                        conn.close()
                except psycopg.Error:
                    pass
                conn = None

    def start_proc(self, name, argv):
        proc = subprocess.Popen([PY, str(ROOT / "chaos" / f"{name}.py")] + argv, stdout=subprocess.DEVNULL,
                                stderr=open(self.out / f"{name}.err", "a"))
        self.env.track(f"chaos-{name}", proc.pid)
        self.procs[name] = (argv, proc)

    def proc_watch(self):
        while not self.stop.wait(1.0):
            for name, (argv, proc) in list(self.procs.items()):
                if proc.poll() is not None:
                    self.restarts[name] += 1
                    log(f"the {name} sampler exited ({proc.returncode}; librdkafka, see {name}.err);"
                        " restarting it")
                    self.start_proc(name, argv)

    def latest_lag(self, after, timeout=15):
        """{group: total lag} from the first Kafka sample taken after `after`; None if none came."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                lines = self.kafka_path.read_text().splitlines()[-5:]
            except OSError:
                lines = []
            for line in reversed(lines):
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if rec["t"] >= after:
                    return {g: sum(v.values()) for g, v in rec["lag"].items()}
                break
            time.sleep(0.5)
        return None

    def start(self):
        bootstrap = self.env.settings["KAFKA_BOOTSTRAP"]
        self.start_proc("lag", ["--bootstrap", bootstrap, "--groups", json.dumps(self.groups),
                                "--out", str(self.kafka_path)])
        self.start_proc("readable", ["--bootstrap", bootstrap, "--topics", ",".join(TOPICS),
                                     "--out", str(self.out / "readable.jsonl")])
        for t in self.threads:
            t.start()

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join(10)
        for _, proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)


# ------------------------------------------------------------------ drain and collect
def heal(env, faults, dests):
    """Every fault over: brokers running and not stopped, Postgres up, destinations back to
    their steady behaviour."""
    if not faults.join(240):
        log("some faults are still running after 240 s; healing anyway")
    for n in (1, 2, 3):
        if not env.broker_alive(n):
            log(f"broker {n} is down after the faults; starting it")
            try:
                env.kafka_start(n)
            except RuntimeError as e:
                log(f"broker {n} could not be started again: {e}")
        try:
            os.kill(env.broker_pid(n), signal.SIGCONT)
        except OSError:
            pass
    env.connect_when_ready(timeout=120).close()
    for name in DESTINATIONS:
        try:
            dests.steady(name)
        except OSError as e:
            log(f"HARNESS: destination {name} does not answer its control endpoint: {e}")


def drain_state(env, sampler):
    state = {"t": time.time()}
    try:
        with env.connect() as conn:
            state["outbox"] = int(conn.execute(
                "SELECT coalesce(sum(records), 0) FROM wal_delivery.backlog").fetchone()[0])
            state["paused"] = [r[0] for r in conn.execute(
                "SELECT destination FROM wal_delivery.destination_pauses WHERE paused ORDER BY 1")]
    except psycopg.Error as e:
        state["error"] = str(e)
    state["lag"] = sampler.latest_lag(state["t"])
    if state["lag"] is None:
        state["error"] = "no consumer lag sample from Kafka"
    state["drained"] = ("error" not in state and state["outbox"] == 0 and not state["paused"]
                        and len(state["lag"]) == len(sampler.groups) and not any(state["lag"].values()))
    return state


def drain(env, sampler, timeout):
    start, last, streak = time.time(), None, 0
    while time.time() - start < timeout:
        st = drain_state(env, sampler)
        if st != last and (last is None or {k: v for k, v in st.items() if k != "t"} !=
                           {k: v for k, v in last.items() if k != "t"}):
            log(f"drain: outbox {st.get('outbox')}, paused {st.get('paused')}, lag {st.get('lag')}"
                + (f", {st['error'][:120]}" if "error" in st else ""))
        last = st
        streak = streak + 1 if st["drained"] else 0
        if streak >= 3:
            break
        time.sleep(2)
    return {"start": start, "end": time.time(), "drained": streak >= 3, "last": last}


def diagnose(env, out):
    """When the backlogs did not drain: what is stuck, and who should be moving it."""
    db = out / "db"
    db.mkdir(exist_ok=True)
    with env.connect_when_ready(timeout=60) as conn:
        def q(sql):
            cur = conn.execute(sql)
            return [dict(zip([c.name for c in cur.description], r)) for r in cur.fetchall()]
        info = {
            "stuck": q("SELECT topic, state::text, count(*), min(created_at)::text AS oldest, max(attempts) AS attempts,"
                       " max(last_error) AS last_error FROM wal_delivery.outbox WHERE state <> 'stored'"
                       " AND state <> 'dead' GROUP BY 1, 2"),
            "sample": q("SELECT * FROM wal_delivery.outbox WHERE state NOT IN ('stored', 'dead')"
                        " ORDER BY id LIMIT 5"),
            "activity": q("SELECT pid, backend_type, application_name, state, wait_event_type, wait_event,"
                          " now() - xact_start AS xact_age, now() - state_change AS state_age,"
                          " left(query, 300) AS query FROM pg_stat_activity WHERE datname = 'wal_delivery'"),
            "reconcile_status": q("SELECT * FROM wal_delivery.reconcile_status"),
            "config_version": q("SELECT * FROM wal_delivery.config_version"),
            "locks": q("SELECT l.pid, l.locktype, l.mode, l.granted, c.relname FROM pg_locks l"
                       " LEFT JOIN pg_class c ON c.oid = l.relation WHERE NOT l.granted"),
        }
    (db / "diagnosis.json").write_text(json.dumps(info, indent=1, default=str))
    log(f"diagnosis (not drained): {json.dumps(info['stuck'], default=str)[:600]}")


def keep_logs(env, out):
    """The servers' logs, before tests/env down removes them."""
    dest = out / "env"
    dest.mkdir(exist_ok=True)
    for src in [Path(env.dir, "pglog", "postgres.log")] + sorted(Path(env.dir, "kafka").glob("n*.log")):
        try:
            shutil.copy(src, dest / src.name)
        except OSError:
            pass


def producer_replacements(env, out):
    """How often librdkafka's idempotent producer failed fatally and was replaced, from
    the logs: librdkafka 2.0 does so after some broker restarts (fixed upstream in 2.3),
    and the relay, the hand-offs of consume, retry and dlq, and ingest replace it
    (docs/operations.md, "librdkafka versions"). A run against another librdkafka
    (make RDKAFKA=2.8 chaos) shows whether that one still needs the workaround."""
    counts = {"librdkafka": rdkafka_version(), "relay": 0, "handoff": 0, "ingest": 0}
    try:
        counts["relay"] = Path(env.dir, "pglog", "postgres.log").read_text(errors="replace").count(
            "librdkafka fatal error, creating new producers")
    except OSError:
        pass
    for f in (out / "workers").glob("*.log"):
        text = f.read_text(errors="replace")
        counts["handoff"] += text.count("event=handoff_producer_replaced")
        counts["ingest"] += sum("event=kafka_producer_recreated" in line and "reason=fatal_error" in line
                                for line in text.splitlines())
    return counts


def rdkafka_version():
    """The librdkafka wal-worker runs: the one the build linked (RDKAFKA=2.8 links it
    statically) or the system's."""
    linked = os.environ.get("RDKAFKA")
    if linked:
        return linked
    done = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "librdkafka1"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def epoch(col):
    return f"extract(epoch FROM {col})::float8"


def collect(env, s3, out):
    """The database's and S3's final word, into db/."""
    db = out / "db"
    db.mkdir()
    with env.connect_when_ready("chaos_admin", timeout=120) as conn:  # the job's owner
        conn.execute("SELECT cron.unschedule('wal_delivery_archive_dead_letters')")
    with env.connect_when_ready(timeout=120) as conn:
        deadline = time.time() + 60
        while conn.execute("SELECT count(*) FROM cron.job_run_details WHERE status IN"
                           " ('starting', 'running')").fetchone()[0] and time.time() < deadline:
            time.sleep(0.5)

        def dump(name, sql):
            cur = conn.execute(sql)
            cols = [c.name for c in cur.description]
            rows = [dict(zip(cols, r)) for r in cur.fetchall()]
            (db / f"{name}.json").write_text(json.dumps(rows, default=str))
            return rows
        dump("dead_letters", f"SELECT id, origin, topic, idempotency_key, destination, attempts, last_error,"
                             f" {epoch('failed_at')} AS failed_at, resolved_at IS NOT NULL AS resolved"
                             f" FROM wal_delivery.dead_letters ORDER BY id")
        dump("outbox", "SELECT topic, idempotency_key, state::text AS state, attempts FROM wal_delivery.outbox")
        dump("pause_audit", f"SELECT {epoch('at')} AS at, destination, op, old_paused, paused,"
                            f" {epoch('since')} AS since, old_probes, probes, {epoch('last_probe_at')} AS last_probe_at,"
                            f" last_probe_outcome, probe_holder, {epoch('next_probe_at')} AS next_probe_at, reason"
                            f" FROM chaos.pause_audit ORDER BY at")
        dump("cron_runs", f"SELECT status, {epoch('start_time')} AS start_time, {epoch('end_time')} AS end_time,"
                          f" return_message FROM cron.job_run_details ORDER BY runid")
        dump("destination_status", "SELECT * FROM wal_delivery.destination_status ORDER BY destination")
        dump("backlog", "SELECT topic, state::text AS state, records FROM wal_delivery.backlog")
    import gzip
    client = s3.client()
    entries = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=ARCHIVE_BUCKET):
        for o in page.get("Contents", []):
            body = gzip.decompress(client.get_object(Bucket=ARCHIVE_BUCKET, Key=o["Key"])["Body"].read())
            for line in body.decode().splitlines():
                e = json.loads(line)
                entries.append({k: e.get(k) for k in ("id", "origin", "topic", "idempotency_key",
                                                      "destination", "last_error", "attempts")}
                               | {"object": o["Key"]})
    (db / "archive.json").write_text(json.dumps(entries))


def machine():
    info = {"cpus": os.cpu_count(), "kernel": os.uname().release}
    try:
        info["os"] = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines()
                          if "=" in line).get("PRETTY_NAME", "").strip('"')
        mem = Path("/proc/meminfo").read_text().split()[1]
        info["mem_gib"] = round(int(mem) / 1024 / 1024, 1)
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        info["load_avg_at_start"] = os.getloadavg()
    except OSError:
        pass
    jars = list((ROOT / ".cache" / "kafka" / "libs").glob("kafka_2.13-*.jar"))
    if jars:
        info["kafka"] = jars[0].name.removeprefix("kafka_2.13-").removesuffix(".jar")
    return info


# ------------------------------------------------------------------ main
def main():
    global T0, LOG
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=parse_duration, default=parse_duration("2m"),
                    help="length of the load phase (generators and faults), e.g. 2m or 30m; default 2m")
    ap.add_argument("--out", help="directory for everything the run records (default .cache/chaos/<date-time>)")
    ap.add_argument("--rate", type=float, default=20.0, help="records per second over all SQL clients")
    ap.add_argument("--clients", type=int, default=4, help="SQL generator clients")
    ap.add_argument("--http-rate", type=float, default=8.0,
                    help="records per second over the HTTP clients (through wal-worker ingest and HAProxy)")
    ap.add_argument("--no-ingest", action="store_true", help="SQL generators only")
    ap.add_argument("--seed", type=int, default=None, help="seed of the fault schedule and the generators")
    ap.add_argument("--env-dir", help="WAL_ENV_DIR of the run's own environment (default: a fresh /tmp dir)")
    ap.add_argument("--keep-env", action="store_true", help="leave the environment up at the end")
    ap.add_argument("--drain-timeout", type=float, default=None)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1, 1 << 30)
    rng = random.Random(seed)
    out = Path(args.out or ROOT / ".cache" / "chaos" / datetime.now().strftime("%Y%m%d-%H%M%S")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    LOG = open(out / "run.log", "a")
    load_s = float(args.duration)
    calm_s = 15.0 if load_s <= 300 else 60.0
    drain_timeout = args.drain_timeout or (120.0 if load_s <= 300 else 300.0)
    env = Env(args.env_dir or f"/tmp/wal-env-chaos-{uuid.uuid4().hex[:8]}")

    def on_signal(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)

    run = {"seed": seed, "load_s": load_s, "calm_s": calm_s, "cycle_s": CYCLE, "time_scale": TIME_SCALE,
           "probe_interval_s": PROBE_INTERVAL, "rate": args.rate, "clients": args.clients,
           "http_rate": args.http_rate,
           "healthy": HEALTHY, "env_dir": env.dir, "machine": machine(),
           "started": datetime.now().astimezone().isoformat(timespec="seconds"),
           "topics": {t: {"processor": p, "subscribers": s} for t, (p, s) in TOPICS.items()},
           "destinations": {d: {"what": w, "settings": s} for d, (w, s) in DESTINATIONS.items()},
           "workers": [{"name": n, "role": r, "args": a} for n, r, a in WORKERS],
           "retention": {"topics": TOPIC_RETENTION, "retry_dlq": RETRY_DLQ_RETENTION,
                         "dead_letter_archive_after": ARCHIVE_AFTER, "archive_schedule": "* * * * * (pg_cron)"}}
    log(f"out {out}, seed {seed}, load {load_s:.0f} s, env {env.dir}")
    s3 = dests = sup = sampler = gen = haproxy = None
    verdict_ok = False
    try:
        run["build_before"] = build_fingerprint()
        env.up()
        log(f"environment up: Postgres :{env.settings['PGPORT']}, Kafka {env.settings['KAFKA_BOOTSTRAP']}")
        # s3_helpers comes from the integration tests; its conftest needs these set.
        os.environ.update(WAL_ENV_DIR=env.dir, PGPORT=env.settings["PGPORT"], PGHOST="127.0.0.1",
                          PGUSER="postgres", PGDATABASE="wal_delivery")
        sys.path.insert(0, str(ROOT / "tests" / "integration"))
        from s3_helpers import S3Server
        s3 = S3Server(out)
        s3.client().create_bucket(Bucket=ARCHIVE_BUCKET)
        dests = Destinations(env, out)
        for name in DESTINATIONS:
            dests.steady(name)
        ingest = not args.no_ingest and ingest_available()
        run["ingest"] = ingest
        token = configure(env, dests.urls, s3, ingest)
        with env.connect() as conn:
            prefix, dlq_topic = conn.execute("SELECT retry_topic_prefix, dlq_topic FROM wal_delivery.settings").fetchone()
        main_topics = list(TOPICS)
        busy_topics = [t for t, (_, subs) in TOPICS.items() if "busy" in subs]
        groups = {"wal_delivery.shared": main_topics, "wal_delivery.dedicated.busy": busy_topics,
                  "wal_delivery.retry": [f"{prefix}{i}" for i in (1, 2, 3)], "wal_delivery.dlq": [dlq_topic]}
        run.update(groups=groups, retry_topics=groups["wal_delivery.retry"], dlq_topic=dlq_topic,
                   kafka_bootstrap=env.settings["KAFKA_BOOTSTRAP"])
        log("configured: 3 topics (RF 3, min ISR 2), 8 destinations, archival to S3 by pg_cron")
        sup = Supervisor(env, out, WORKERS + (INGEST_WORKERS if ingest else []))
        sup.start_all()
        log(f"workers ready: {', '.join(sup.workers)} (time scale {TIME_SCALE})")
        if ingest:
            haproxy, lb_port = start_haproxy(env, out, [(w.name, w.listen) for w in sup.workers.values()
                                                        if w.role == "ingest"])
            run["haproxy_port"] = lb_port
            log(f"HAProxy on 127.0.0.1:{lb_port} in front of the ingest instances")
        sampler = Sampler(env, groups, out)
        sampler.start()
        faults = Faults(env, sup, dests, out)
        steps = plan(load_s, calm_s, rng, ingest)

        T0 = time.time()
        run.update(t0=T0, load_end=T0 + load_s)
        (out / "run.json").write_text(json.dumps(run, indent=1))
        (out / "ledger").mkdir(exist_ok=True)
        gen = subprocess.Popen([PY, str(ROOT / "chaos" / "generate.py"), "--conninfo", env.conninfo("chaos_app", "chaos-gen"),
                                "--out", str(out / "ledger"), "--topics", ",".join(TOPICS), "--rate", str(args.rate),
                                "--clients", str(args.clients), "--seed", str(seed)]
                               + (["--ingest", f"127.0.0.1:{lb_port}", "--token", token,
                                   "--http-rate", str(args.http_rate)] if ingest else []),
                               stdout=open(out / "generate.out", "w"), stderr=subprocess.STDOUT)
        env.track("chaos-generate", gen.pid)
        log(f"load: {args.clients} SQL clients at {args.rate:g} records/s"
            + (f", 2 HTTP clients at {args.http_rate:g} records/s through HAProxy and ingest" if ingest else "")
            + f"; calm for {calm_s:.0f} s, then faults")
        for at, what in steps:
            delay = T0 + at - time.time()
            if delay > 0:
                time.sleep(delay)
            if what[0] == "dest":
                log(f"destination {what[1]}: {what[2]} for {what[4]} s")
            run_step(faults, what)
        time.sleep(max(0.0, T0 + load_s - time.time()))
        gen.send_signal(signal.SIGTERM)
        gen.wait(120)
        log("load stopped; healing every fault")
        heal(env, faults, dests)
        log(f"draining (at most {drain_timeout:.0f} s)")
        run["drain"] = drain(env, sampler, drain_timeout)
        log(f"drain: {'done' if run['drain']['drained'] else 'NOT DONE'} after "
            f"{run['drain']['end'] - run['drain']['start']:.1f} s")
        if not run["drain"]["drained"]:
            try:
                diagnose(env, out)
            except Exception as e:
                log(f"diagnosis failed: {e}")
        sampler.close()
        run["sampler_restarts"] = sampler.restarts
        sup.stop_all()
        run["unplanned_exits"] = sup.unplanned_exits()
        run["worker_starts"] = {w.name: w.starts for w in sup.workers.values()}
        run["destination_restarts"] = dests.restarts
        run["ended"] = time.time()
        run["build_after"] = build_fingerprint()
        run["producer_replacements"] = producer_replacements(env, out)
        log("producers replaced after a fatal error: " + ", ".join(
            f"{k} {v}" for k, v in run["producer_replacements"].items()))
        (out / "run.json").write_text(json.dumps(run, indent=1))
        try:
            collect(env, s3, out)
            log("collected the database's and S3's final state")
        except Exception as e:  # judge what there is: the missing parts fail their checks
            log(f"COLLECTING FAILED: {type(e).__name__}: {e}")
        import verdict
        checks = verdict.judge(out)
        verdict_ok = all(c["ok"] for c in checks)
        lost = json.loads((out / "verdict.json").read_text())["figures"].get("lost")
        if lost:
            try:
                import trace_lost
                found = trace_lost.trace(env.settings["KAFKA_BOOTSTRAP"], groups, lost, out)
                log(f"lost records traced into lost-trace.json: {len(found['copies'])} copies in the"
                    f" retry steps and the DLQ, committed {json.dumps(found['committed'])}")
            except Exception as e:
                log(f"tracing the lost records failed: {type(e).__name__}: {e}")
        try:
            import report
            page = report.render(out)
        except ImportError:
            page = None
        print()
        for c in checks:
            print(f"{'PASS' if c['ok'] else 'FAIL'} {c['name']} {c['detail']}")
        print(f"\nchaos: {sum(c['ok'] for c in checks)} of {len(checks)} checks passed;"
              f" report: {page}", flush=True)
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}); stopping everything")
    finally:
        for closer in (lambda: gen and gen.poll() is None and gen.kill(),
                       lambda: sampler and sampler.close(),
                       lambda: sup and not sup.stopping.is_set() and sup.stop_all(),
                       lambda: dests and dests.stop(),
                       lambda: haproxy and haproxy.terminate(),
                       lambda: s3 and s3.stop()):
            try:
                closer()
            except Exception as e:
                log(f"clean-up: {e}")
        keep_logs(env, out)
        if args.keep_env:
            log(f"environment kept: WAL_ENV_DIR={env.dir} tests/env down")
        else:
            env.cmd("down", check=False)
    return 0 if verdict_ok else 1


if __name__ == "__main__":
    sys.exit(main())
