"""The control plane tells workers about changes: every committed change to the config
tables sends a NOTIFY on wal_delivery_config carrying the new config version; a change
that rolls back sends nothing."""
import psycopg

from conftest import connect


def drain_notifies(conn, timeout=1.0):
    return [n for n in conn.notifies(timeout=timeout, stop_after=None)]


def current_version(conn):
    return conn.execute("SELECT version FROM wal_delivery.config_version").fetchone()[0]


def test_committed_change_notifies_with_new_version(unique):
    with connect() as listener, connect() as admin:
        admin.execute("CREATE EXTENSION IF NOT EXISTS wal_delivery")
        listener.execute("LISTEN wal_delivery_config")
        drain_notifies(listener, 0.2)

        with admin.transaction():
            admin.execute("INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas)"
                          " VALUES (%s, 1, 1)", (f"cp.{unique}",))
            assert drain_notifies(listener, 0.5) == [], "notified before commit"
        got = drain_notifies(listener, 2.0)
        assert [n.channel for n in got] == ["wal_delivery_config"]
        assert int(got[0].payload) == current_version(admin)

        try:
            with admin.transaction():
                admin.execute("UPDATE wal_delivery.topics SET partitions = 9 WHERE name = %s",
                              (f"cp.{unique}",))
                raise RuntimeError("roll back")
        except RuntimeError:
            pass
        assert drain_notifies(listener, 1.0) == [], "a rolled-back change notified"

        admin.execute("DELETE FROM wal_delivery.topics WHERE name = %s", (f"cp.{unique}",))
        got = drain_notifies(listener, 2.0)
        assert int(got[-1].payload) == current_version(admin)


def test_writer_role_cannot_change_config(unique):
    role = f"app_{unique}"
    with connect() as admin:
        admin.execute("CREATE EXTENSION IF NOT EXISTS wal_delivery")
        admin.execute(f"CREATE ROLE {role} LOGIN IN ROLE wal_delivery_writer")
        admin.execute("INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas)"
                      " VALUES (%s, 1, 1)", (f"cpw.{unique}",))
        try:
            with connect(user=role) as app:
                rid = app.execute("SELECT wal_enqueue(%s, %s::jsonb)", (f"cpw.{unique}", '{"a": 1}')).fetchone()[0]
                assert rid > 0
                try:
                    app.execute("UPDATE wal_delivery.topics SET acks = 1")
                    raise AssertionError("the writer changed a topic")
                except psycopg.errors.InsufficientPrivilege:
                    pass
        finally:
            admin.execute("SET wal_delivery.force_delete = on")
            admin.execute("DELETE FROM wal_delivery.topics WHERE name = %s", (f"cpw.{unique}",))
            admin.execute(f"DROP ROLE {role}")
