"""Enqueue keeps the topics and the current log generation per backend
(src/ext/enqueue_cache.c): a change an admin commits in another session is what the
application's next transaction enqueues by, whatever that session had cached or which
snapshot it read under. The same session's own changes: sql/enqueue.sql."""
import psycopg
import pytest

from conftest import connect
from relay_helpers import ensure_extension, make_topic


@pytest.fixture
def topic(unique):
    name = f"cache.{unique}"
    ensure_extension()
    with connect() as admin:
        make_topic(admin, name, max_payload_bytes=1000)
    yield name
    with connect() as admin:
        admin.execute("SET wal_delivery.force_delete = on")
        admin.execute("DELETE FROM wal_delivery.topics WHERE name = %s", (name,))


def enqueue(app, topic, size, key=None):
    return app.execute("SELECT wal_enqueue(%s, repeat('x', %s)::text, %s)", (topic, size, key)).fetchone()[0]


def test_the_next_transaction_enqueues_by_a_topic_change_another_session_committed(topic):
    with connect() as app, connect() as admin:
        enqueue(app, topic, 500)  # the topic is cached in app's backend now
        admin.execute("UPDATE wal_delivery.topics SET max_payload_bytes = 100 WHERE name = %s", (topic,))
        with pytest.raises(psycopg.errors.ProgramLimitExceeded):
            enqueue(app, topic, 500)

        admin.execute("CREATE SCHEMA IF NOT EXISTS cache_test")
        admin.execute("CREATE OR REPLACE FUNCTION cache_test.same(p bytea) RETURNS bytea LANGUAGE sql AS 'SELECT p'")
        admin.execute("UPDATE wal_delivery.topics SET processor_kind = 'sql', processor = 'cache_test.same'"
                      " WHERE name = %s", (topic,))
        processed = enqueue(app, topic, 10, "to-process")
        assert admin.execute("SELECT count(*) FROM wal_delivery.outbox_rows WHERE id = %s",
                             (processed,)).fetchone()[0] == 1

        admin.execute("SET wal_delivery.force_delete = on")
        admin.execute("DELETE FROM wal_delivery.topics WHERE name = %s", (topic,))
        with pytest.raises(psycopg.errors.UndefinedObject):
            enqueue(app, topic, 10)


def test_a_change_committed_during_a_transaction_applies_to_its_next_enqueue(topic):
    """The transaction already holds every lock enqueue takes, so no lock brings the
    change's invalidation in: enqueue takes it itself before it looks."""
    with connect() as app, connect() as admin:
        with app.transaction():
            enqueue(app, topic, 500)
            admin.execute("UPDATE wal_delivery.topics SET max_payload_bytes = 100 WHERE name = %s", (topic,))
            with pytest.raises(psycopg.errors.ProgramLimitExceeded):
                enqueue(app, topic, 500)


def test_a_repeatable_read_snapshot_older_than_a_change_does_not_stay_cached(topic):
    """The first read of a topic in a repeatable-read transaction whose snapshot predates a
    change: kept in the cache, the old row would outlive the transaction."""
    with connect() as app, connect() as admin:
        app.autocommit = False
        app.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        app.execute("SELECT 1")  # the snapshot is taken
        admin.execute("UPDATE wal_delivery.topics SET max_payload_bytes = 100 WHERE name = %s", (topic,))
        # A first lock in the transaction: the change's invalidation is taken in here,
        # before enqueue reads the topic, and the snapshot still shows the old row.
        assert app.execute("SELECT max_payload_bytes FROM wal_delivery.topics WHERE name = %s",
                           (topic,)).fetchone()[0] == 1000
        try:
            enqueue(app, topic, 10)
            app.commit()
        except psycopg.Error:
            app.rollback()
        app.autocommit = True
        with pytest.raises(psycopg.errors.ProgramLimitExceeded):
            enqueue(app, topic, 500)


def test_the_next_transaction_writes_the_generation_another_session_rotated_to(topic):
    with connect() as app, connect() as admin:
        first = enqueue(app, topic, 10)
        old = admin.execute("SELECT gen FROM wal_delivery.outbox_log WHERE id = %s", (first,)).fetchone()[0]
        new = (old + 1) % 3
        try:
            with admin.transaction():
                admin.execute("UPDATE wal_delivery.outbox_generations SET sealed_at = now() WHERE gen = %s", (old,))
                admin.execute("UPDATE wal_delivery.outbox_generations SET started_at = now(), sealed_at = NULL"
                              " WHERE gen = %s", (new,))
            after = enqueue(app, topic, 10, "after-rotation")
            assert admin.execute("SELECT gen FROM wal_delivery.outbox_log WHERE id = %s",
                                 (after,)).fetchone()[0] == new
            # The key is found in the sealed generation by the next session too.
            assert enqueue(app, topic, 10, "after-rotation") == after
        finally:  # back as it was: the other tests' records go to the old generation
            with admin.transaction():
                admin.execute("UPDATE wal_delivery.outbox_generations SET sealed_at = now() WHERE gen = %s", (new,))
                admin.execute("UPDATE wal_delivery.outbox_generations SET sealed_at = NULL WHERE gen = %s", (old,))
                admin.execute(f"TRUNCATE wal_delivery.outbox_log_{new}")
