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
