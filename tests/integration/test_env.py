"""tests/env itself: the harness every other test stands on must start, stop, crash and
restart real servers as it promises, and fail clearly without leaving anything behind."""
import os
import socket
import subprocess
import uuid

import psycopg
import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from conftest import connect, env_cmd


def scratch_env_dir():
    # Under /tmp itself: the Postgres server runs as `postgres` and must reach its data dir.
    return f"/tmp/wal_delivery-test-{uuid.uuid4().hex[:8]}"


def processes_mentioning(text):
    out = subprocess.run(["pgrep", "-f", text], capture_output=True, text=True)
    return out.stdout.split()


def produce_one(bootstrap, topic, timeout_ms=20000):
    """One record into topic, made first if missing: the test broker creates no topic on
    a client's request (auto.create.topics.enable=false, as the reconciler expects)."""
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        cluster = admin.list_topics(timeout=5)
        if topic not in cluster.topics:
            rf = min(3, len(cluster.brokers))
            admin.create_topics([NewTopic(topic, 1, rf)])[topic].result(20)
    except KafkaException:
        pass  # no broker answers, or it exists: the produce below says what happens
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": timeout_ms})
    errors = []
    p.produce(topic, b"x", on_delivery=lambda err, msg: errors.append(err))
    p.flush(timeout_ms / 1000 + 5)
    return errors[0] if errors else "no delivery report"


def test_up_twice_is_harmless():
    out = env_cmd("up")
    assert "already up" in out.stderr
    assert f"export PGPORT={os.environ['PGPORT']}" in out.stdout


def test_down_without_up_is_harmless():
    out = env_cmd("down", env_dir=scratch_env_dir())
    assert out.returncode == 0
    assert "nothing to stop" in out.stderr


def test_port_in_use_fails_clearly_and_leaves_nothing_running():
    env_dir = scratch_env_dir()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        os.environ["WAL_PGPORT"] = str(port)
        try:
            out = env_cmd("up", env_dir=env_dir, check=False)
        finally:
            del os.environ["WAL_PGPORT"]
    assert out.returncode != 0
    assert f"port {port} (WAL_PGPORT) is already in use" in out.stderr
    assert not os.path.exists(env_dir)
    assert processes_mentioning(env_dir) == []


def test_unknown_option_is_refused():
    out = env_cmd("up", "--brokers", "2", env_dir=scratch_env_dir(), check=False)
    assert out.returncode != 0
    assert "--brokers must be 1 or 3" in out.stderr


def test_broker_stop_and_start(kafka_bootstrap):
    topic = "envtest." + uuid.uuid4().hex[:8]
    assert produce_one(kafka_bootstrap, topic) is None
    env_cmd("kafka-stop", "1")
    try:
        err = produce_one(kafka_bootstrap, topic, timeout_ms=3000)
        assert err is not None, "a produce succeeded while the only broker was stopped"
    finally:
        env_cmd("kafka-start", "1")
    assert produce_one(kafka_bootstrap, topic) is None


def test_postgres_kill9_and_restart(unique):
    with connect() as conn:
        conn.execute(f"CREATE TABLE crash_{unique} (n int)")
        conn.execute(f"INSERT INTO crash_{unique} VALUES (42)")
    env_cmd("pg-kill9")
    with pytest.raises(psycopg.OperationalError):
        connect().close()
    env_cmd("pg-start")
    with connect() as conn:
        assert conn.execute(f"SELECT n FROM crash_{unique}").fetchall() == [(42,)]
        conn.execute(f"DROP TABLE crash_{unique}")


def test_three_broker_cluster_keeps_acks_all_with_one_broker_down():
    env_dir = scratch_env_dir()
    try:
        out = env_cmd("up", "--brokers", "3", env_dir=env_dir)
        settings = dict(line.removeprefix("export ").split("=", 1) for line in out.stdout.splitlines())
        bootstrap = settings["KAFKA_BOOTSTRAP"].strip("'")
        assert len(bootstrap.split(",")) == 3
        admin = AdminClient({"bootstrap.servers": bootstrap})
        assert len(admin.list_topics(timeout=10).brokers) == 3

        topic = "rf3." + uuid.uuid4().hex[:8]
        assert produce_one(bootstrap, topic) is None
        meta = admin.list_topics(topic, timeout=10).topics[topic].partitions[0]
        assert len(meta.replicas) == 3

        env_cmd("kafka-stop", "3", env_dir=env_dir)
        # Two of three replicas are in sync, which meets min.insync.replicas=2.
        assert produce_one(bootstrap, topic) is None
    finally:
        env_cmd("down", env_dir=env_dir, check=False)
    assert processes_mentioning(env_dir) == []
