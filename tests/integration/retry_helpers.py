"""Running the whole delivery path (main consumers, retry consumers, DLQ ingester) at a
time scale, and reading what destinations saw, for the retry and pause tests."""
import signal

from conftest import connect, record_key
from consumer_helpers import Worker
from relay_helpers import wait_until

TIME_SCALE = 10


class Fleet:
    """Worker processes of any role, all stopped at the end of a test."""

    def __init__(self, tmp_path, kafka_bootstrap):
        self.tmp_path, self.bootstrap, self.workers = tmp_path, kafka_bootstrap, []

    def start(self, role, *args):
        w = Worker(self.tmp_path, role, "--time-scale", str(TIME_SCALE), *args,
                   kafka_bootstrap=self.bootstrap)
        self.workers.append(w)
        return w

    def start_ready(self, *roles):
        """Starts one worker per role, all at once, and waits until each is ready."""
        started = [self.start(role) for role in roles]
        for w in started:
            w.wait_ready()
        return started

    def stop_all(self):
        for w in self.workers:
            w.stop(signal.SIGKILL if w.proc.poll() is None else signal.SIGTERM, timeout=5)


def attempt_of(request):
    return int(request["headers"].get("x-wal-attempt", "0"))


def key_of(request):
    return record_key(request)


def by_key(requests):
    out = {}
    for r in sorted(requests, key=lambda r: r["arrived_at"]):
        out.setdefault(key_of(r), []).append(r)
    return out


def destination_status(name):
    with connect() as conn:
        conn.row_factory = __import__("psycopg").rows.dict_row
        return conn.execute("SELECT * FROM wal_delivery.destination_status WHERE destination = %s",
                            (name,)).fetchone()


def wait_breaker(name, state, timeout=60):
    wait_until(lambda: destination_status(name)["breaker"] == state, timeout,
               what=f"{name}'s breaker to be {state} (now {destination_status(name)})")
    return destination_status(name)


def dead_letters(destination):
    with connect() as conn:
        return conn.execute("SELECT idempotency_key, last_error, attempts, id, resolved_at"
                            " FROM wal_delivery.dead_letters WHERE destination = %s ORDER BY id",
                            (destination,)).fetchall()
