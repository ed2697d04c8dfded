"""`make demo` runs on this machine to its end state, showing records going through every
part (relay, consume, retry, dlq, process, S3 archival with pg_cron), its workers logged in
as a non-superuser; a second demo in its own state directory runs beside it without
disturbing it; `make demo-stop` and Ctrl-C (SIGINT to the demo's process group) each stop
a following demo: its command returns and no process of it is left. Output that is not a
terminal has no ANSI escapes and no "Killed" lines.

The second demo runs only its first part (DEMO_PARTS=20-outbox): enough to start its own
Postgres, Kafka and destination next to the first, at half the time of a full run."""
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[")
FOLLOWING = "Ctrl-C (or make demo-stop) stops the demo."


def processes_of(env_dir, pgid):
    """{pid: command line} of every live process (zombies have ended: they only wait for
    init to reap them) in the demo's process group or whose command line or environment
    names its state directory."""
    found = {}
    marker = env_dir.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if (entry / "stat").read_text().rpartition(")")[2].split()[0] == "Z":
                continue
            cmdline = (entry / "cmdline").read_bytes()
            mine = os.getpgid(int(entry.name)) == pgid or marker in cmdline
            if not mine:
                mine = b"WAL_ENV_DIR=" + marker + b"\0" in (entry / "environ").read_bytes() + b"\0"
        except (OSError, ProcessLookupError):
            continue
        if mine:
            found[int(entry.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    return found


def interruptible():
    """SIGINT at its default in the demo, as in a terminal: a suite started in the background
    of a non-interactive shell (`make test &`) runs with SIGINT ignored, which its children
    inherit, and bash cannot trap a signal that was ignored when it started."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Demo:
    """demo/run in a session of its own (its pid is its process group), output to a file
    (not a terminal), its state in a fresh directory."""

    def __init__(self, tmp_path, name, **env):
        self.env_dir = f"/tmp/wal_delivery-demotest-{name}-{uuid.uuid4().hex[:8]}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "KAFKA_", "NO_COLOR"))}
        self.env.update(WAL_ENV_DIR=self.env_dir, **env)
        self.log = tmp_path / f"demo-{name}.out"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([str(ROOT / "demo" / "run")], env=self.env, cwd=ROOT,
                                         stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=interruptible)

    def output(self):
        return self.log.read_text(errors="replace")

    def wait_following(self, timeout):
        deadline = time.monotonic() + timeout
        while FOLLOWING not in self.output():
            assert self.proc.poll() is None, f"the demo ended early:\n{self.output()[-4000:]}"
            assert time.monotonic() < deadline, f"the demo did not finish:\n{self.output()[-4000:]}"
            time.sleep(1)

    def wait_stopped(self, timeout):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the demo did not stop within {timeout} s; its processes: "
                                 f"{self.processes()}\n{self.output()[-3000:]}") from None

    def processes(self):
        return processes_of(self.env_dir, self.proc.pid)

    def psql(self, sql):
        port = re.search(r"export PGPORT=(\d+)", Path(self.env_dir, "env.sh").read_text()).group(1)
        return subprocess.run(["psql", "-X", "-A", "-t", "-h", "127.0.0.1", "-p", port, "-U", "postgres",
                               "-d", "wal_delivery", "-v", "ON_ERROR_STOP=1", "-c", sql],
                              capture_output=True, text=True, check=True, timeout=30).stdout.strip()

    def assert_gone(self):
        left = self.processes()
        assert not left, f"processes of the demo left behind: {left}"
        assert not os.path.exists(self.env_dir) and not os.path.exists(self.env_dir + ".pid")

    def clean_up(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        subprocess.run([str(ROOT / "demo" / "stop")], env=self.env, capture_output=True, timeout=120)


def assert_end_state(out):
    # Committed records are stored and read back from Kafka with their headers; the
    # rolled-back one appears nowhere.
    for key in ("order-1-created", "order-2-created", "order-2-paid"):
        assert re.search(rf"\| {key} +\| stored ", out), key
        assert f"idempotency-key={key}," in out
    assert 'value={"event": "paid", "order_id": 2}' in out
    assert "order-3-created" not in out
    # ... and delivered to the sample destination by the consumer.
    for key in ("order-1-created", "order-2-created", "order-2-paid"):
        assert re.search(rf"POST /orders  idempotency-key=orders.events:{key} ", out), key
    assert re.search(r'wal_delivered_total\{destination="sample-destination"\} 3', out)
    # A 503 is retried from step 1; a 400 becomes a dead letter on-call can see in SQL.
    assert "order-4-created  x-wal-attempt=2  answered 200" in out
    assert re.search(r"sample-destination\s*\|\s*order-4-refund\s*\|\s*HTTP 400", out)
    # The SQL processor ran before the relay shipped, and the result was delivered.
    assert re.search(r"\| stored \|\s+1 \|.*\| \{.*\"total_with_vat\": 12\.00", out)
    assert re.search(r'POST /invoices  idempotency-key=orders.invoiced:order-5-invoiced  body=\{.*"total_with_vat": 12.00', out)
    # The dead letter was archived to S3 and read back; pg_cron holds the daily job.
    assert re.search(r"wal_delivery_archive_dead_letters \| 17 3 \* \* \* \| CALL wal_delivery.archive_dead_letters\(\)", out)
    assert re.search(r'"archived": 1, "finished": true', out)
    assert re.search(r"dead_letters_left \n-+\n +0\n", out)
    assert re.search(r"s3://demo-dead-letters/wal_delivery/dead_letters/\S+\.ndjson\.gz", out)
    assert "idempotency_key=order-4-refund last_error='HTTP 400'" in out


def assert_lists_every_log(out, env_dir):
    where = out[out.index("== where to look"):]
    for log in ("pglog/postgres.log", "consume.log", "retry.log", "dlq.log", "process.log",
                "destination.jsonl", "s3.log", "kafka/n1.log"):
        assert f"{env_dir}/{log}" in where, log
    assert "make demo-stop" in where


def assert_plain_output(out):
    assert not ANSI.search(out), "ANSI escapes in output that is not a terminal"
    assert not re.search(r"\bKilled\b|\bTerminated\b", out), "a shell's job report in the output"


def test_demo_runs_to_its_end_state_beside_a_second_demo_and_both_stop_cleanly(tmp_path):
    first = Demo(tmp_path, "first")
    second = None
    try:
        first.wait_following(600)
        out = first.output()
        assert_end_state(out)
        assert_lists_every_log(out, first.env_dir)
        # Every worker logged in as a LOGIN role of wal_delivery_worker (the workers' least
        # rights), neither a superuser nor an admin.
        logins = first.psql("SELECT string_agg(DISTINCT a.application_name || ':' || a.usename || ':'"
                            " || r.rolsuper || ':' || pg_has_role(r.oid, 'wal_delivery_worker', 'member')"
                            " || ':' || pg_has_role(r.oid, 'wal_delivery_admin', 'member'), ',')"
                            " FROM pg_stat_activity a JOIN pg_roles r ON r.rolname = a.usename"
                            " WHERE a.application_name LIKE 'wal-worker %'")
        assert sorted(logins.split(",")) == [f"wal-worker {role}:wal_worker:false:true:false"
                                             for role in ("consume", "dlq", "process", "retry")]
        # The demo prints the console's address, and its on-call login signs in there.
        url = re.search(r"the on-call console: (http://127\.0\.0\.1:\d+/)", out).group(1)
        assert url in out[out.index("== where to look"):]
        signin = urllib.request.Request(url + "api/session", method="POST",
                                        data=json.dumps({"user": "oncall_demo", "password": "oncall-demo"}).encode(),
                                        headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(signin, timeout=10) as resp:
            assert json.loads(resp.read())["user"] == "oncall_demo"
        running = first.processes()

        second = Demo(tmp_path, "second", DEMO_PARTS="20-outbox")
        second.wait_following(300)
        assert re.search(r"\| order-2-paid +\| stored ", second.output())
        assert second.env_dir not in out and first.env_dir not in second.output()

        # make demo-stop stops the second demo: its command returns, nothing of it is left.
        stop = subprocess.run(["make", "-s", "demo-stop"], cwd=ROOT, env=second.env,
                              capture_output=True, text=True, timeout=120)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert second.wait_stopped(30) == 0
        second.assert_gone()
        assert_plain_output(second.output() + stop.stdout + stop.stderr)

        # The first demo did not notice: every process of it still runs, and it delivers.
        assert set(running) <= set(first.processes()), "the second demo disturbed the first"
        first.psql("SELECT wal_enqueue('orders.events', '{\"order_id\": 6}'::jsonb, 'order-6-after')")
        deadline = time.monotonic() + 60
        while "orders.events:order-6-after" not in first.output():
            assert time.monotonic() < deadline, "the first demo no longer delivers"
            time.sleep(0.5)

        # Ctrl-C in the first demo's terminal: SIGINT to its process group.
        os.killpg(first.proc.pid, signal.SIGINT)
        assert first.wait_stopped(60) == 0
        first.assert_gone()
        assert_plain_output(first.output())
        assert "== stopping" in first.output()
    finally:
        for demo in (first, second):
            if demo:
                demo.clean_up()
