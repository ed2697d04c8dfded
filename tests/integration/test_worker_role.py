"""wal_delivery_worker, the role the delivery workers log in through, has their least
rights: it reads the config document and calls the workers' routines, and is refused
(42501) everything else: the config tables, secrets, S3 credentials, the outbox, enqueue."""
import psycopg
import pytest

from conftest import connect
from consumer_helpers import WORKER_LOGIN, ensure_worker_login

REFUSED = [
    "SELECT * FROM wal_delivery.topics",
    "INSERT INTO wal_delivery.topics (name) VALUES ('worker.made')",
    "UPDATE wal_delivery.settings SET dlq_alert_url = NULL",
    "SELECT * FROM wal_delivery.destinations",
    "SELECT * FROM wal_delivery.destination_secrets",
    "SELECT * FROM wal_delivery.archive_credentials",
    "SELECT * FROM wal_delivery.outbox",
    "SELECT * FROM wal_delivery.dead_letters",
    "SELECT wal_enqueue('t', '{}'::jsonb)",
    "SELECT wal_delivery.resume_destination('d')",
    "SELECT wal_delivery.replay_dead_letter(1)",
    "CALL wal_delivery.archive_dead_letters()",
    # delivery_stats: the workers add counts through add_delivery_stats only
    "SELECT * FROM wal_delivery.delivery_stats",
    "SELECT * FROM wal_delivery.delivery_rates",
    "DELETE FROM wal_delivery.delivery_stats",
    "INSERT INTO wal_delivery.delivery_stats (minute, topic, destination) VALUES (now(), 't', 'd')",
]


@pytest.fixture(scope="module")
def worker():
    ensure_worker_login()
    with connect(user=WORKER_LOGIN) as conn:
        yield conn


@pytest.mark.parametrize("sql", REFUSED)
def test_the_worker_role_is_refused_what_workers_do_not_do(worker, sql):
    with pytest.raises(psycopg.Error) as err:
        worker.execute(sql)
    assert err.value.sqlstate == "42501", err.value


def test_the_worker_role_reads_its_config_and_is_no_superuser(worker):
    doc = worker.execute("SELECT wal_delivery.worker_config()").fetchone()[0]
    assert {"version", "settings", "destinations"} <= set(doc)
    assert worker.execute("SELECT current_setting('is_superuser')").fetchone()[0] == "off"
    assert worker.execute("SELECT count(*) FROM wal_delivery.destination_pauses").fetchone()[0] >= 0


def test_the_worker_role_adds_delivery_counts_and_reads_none_back(worker):
    """add_delivery_stats takes counts from the worker's login (SECURITY DEFINER): the
    count lands in the table although the worker may not read it."""
    with connect() as su:
        su.execute("INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas)"
                   " VALUES ('wr.stats', 1, 1) ON CONFLICT DO NOTHING")
        su.execute("INSERT INTO wal_delivery.destinations (name, endpoint)"
                   " VALUES ('wr-stats', 'http://127.0.0.1:9/x') ON CONFLICT DO NOTHING")
        su.execute("DELETE FROM wal_delivery.delivery_stats WHERE topic = 'wr.stats'")
    counts = ('[{"minute": %d, "topic": "wr.stats", "destination": "wr-stats", "delivered": 4,'
              ' "failed": 2, "dead_lettered": 1}]')
    minute = worker.execute("SELECT extract(epoch FROM now())::bigint").fetchone()[0]
    assert worker.execute("SELECT wal_delivery.add_delivery_stats(%s)",
                          (counts % minute,)).fetchone()[0] == 1
    with connect() as su:
        assert su.execute("SELECT delivered, failed, dead_lettered FROM wal_delivery.delivery_stats"
                          " WHERE topic = 'wr.stats'").fetchall() == [(4, 2, 1)]
        su.execute("DELETE FROM wal_delivery.delivery_stats WHERE topic = 'wr.stats'")
        su.execute("DELETE FROM wal_delivery.subscriptions WHERE topic = 'wr.stats'")
        su.execute("DELETE FROM wal_delivery.destinations WHERE name = 'wr-stats'")
        su.execute("DELETE FROM wal_delivery.topics WHERE name = 'wr.stats'")
