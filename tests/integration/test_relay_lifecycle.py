"""The relay's life with the server and the cluster: each topic's acks is honoured on a
3-broker cluster, a stopping server waits only a bounded time for Kafka, and neither
DROP DATABASE nor a broker restart is blocked by it."""
import os
import time
import uuid
from pathlib import Path

import psycopg
import psycopg.sql
import pytest

from conftest import connect, env_cmd
from relay_helpers import (EnqueueLoad, duplicates, ensure_extension, make_topic, read_topic, report,
                           states, wait_all_stored, wait_load_progress, wait_until)


def scratch_env(*args):
    env_dir = f"/tmp/wal_delivery-test-{uuid.uuid4().hex[:8]}"
    out = env_cmd("up", *args, env_dir=env_dir)
    settings = dict(line.removeprefix("export ").split("=", 1) for line in out.stdout.splitlines())
    return env_dir, {k: v.strip("'") for k, v in settings.items()}


def scratch_connect(settings, dbname="wal_delivery"):
    return psycopg.connect(host=settings["PGHOST"], port=settings["PGPORT"], user="postgres",
                           dbname=dbname, autocommit=True)


def test_acks_are_honoured_per_topic_on_a_three_broker_cluster():
    env_dir, settings = scratch_env("--brokers", "3")
    try:
        with scratch_connect(settings) as conn:
            conn.execute("CREATE EXTENSION wal_delivery")
            # min.insync.replicas 3: losing one broker leaves too few replicas for acks=all.
            make_topic(conn, "acks.all", replication_factor=3, min_insync_replicas=3, acks=-1)
            make_topic(conn, "acks.leader", replication_factor=3, min_insync_replicas=3, acks=1)
            for t in ("acks.all", "acks.leader"):
                conn.execute("SELECT wal_enqueue(%s, 'warm-up'::text, 'warm')", (t,))
            wait_until(lambda: states(conn, "acks.all") == {"stored": 1}
                       and states(conn, "acks.leader") == {"stored": 1}, 60, what="warm-up records")

            env_cmd("kafka-stop", "3", env_dir=env_dir)
            for t in ("acks.all", "acks.leader"):
                conn.execute("SELECT wal_enqueue_batch(%s, %s::text[], %s)",
                             (t, [f"r{i}" for i in range(10)], [f"r{i}" for i in range(10)]))
            # acks=1: the leader's word is enough. acks=all: not enough in-sync replicas.
            wait_until(lambda: states(conn, "acks.leader") == {"stored": 11}, 90,
                       what=f"acks=1 records stored (now {states(conn, 'acks.leader')})")

            # The relay has tried the acks=all records: they carry Kafka's refusal (or,
            # wrongly, they are stored).
            def tried():
                return conn.execute("SELECT count(*) FILTER (WHERE state = 'stored') > 1"
                                    " OR count(*) FILTER (WHERE state = 'pending' AND last_error IS NOT NULL) > 0"
                                    " FROM wal_delivery.outbox WHERE topic = 'acks.all'").fetchone()[0]
            wait_until(tried, 90, what=f"the relay to try the acks=all records (now {states(conn, 'acks.all')})")
            assert states(conn, "acks.all") == {"stored": 1, "pending": 10}
            error = conn.execute("SELECT last_error FROM wal_delivery.outbox WHERE topic = 'acks.all'"
                                 " AND state = 'pending' LIMIT 1").fetchone()[0]
            assert error, "a deferred record carries the reason it was not stored"

            env_cmd("kafka-start", "3", env_dir=env_dir)
            wait_until(lambda: states(conn, "acks.all") == {"stored": 11}, 120,
                       what=f"acks=all records stored after recovery (now {states(conn, 'acks.all')})")
        keys = [f"r{i}" for i in range(10)]
        assert set(keys) <= set(read_topic(settings["KAFKA_BOOTSTRAP"], "acks.all", keys))

        # The production shape: acks=all, min.insync.replicas=2. kill -9 one broker under
        # load; with two replicas left in sync nothing stops and nothing is lost.
        with scratch_connect(settings) as conn:
            make_topic(conn, "durable", partitions=3, replication_factor=3, min_insync_replicas=2)
            wait_until(lambda: conn.execute("SELECT ready FROM wal_delivery.kafka_topics"
                                            " WHERE topic = 'durable'").fetchone(), 30, what="the topic")
        with EnqueueLoad("durable", connect_fn=lambda: scratch_connect(settings), pause=0.002) as load:
            wait_load_progress(load)
            env_cmd("kafka-kill", "2", env_dir=env_dir)
            # Shipping goes on with two brokers: records enqueued after the kill are stored.
            wait_load_progress(load, more=300)
        with scratch_connect(settings) as conn:
            wait_until(lambda: states(conn, "durable") == {"stored": len(load.acked)}, 120,
                       what=f"every acknowledged record stored (now {states(conn, 'durable')})")
        seen = read_topic(settings["KAFKA_BOOTSTRAP"], "durable", load.acked)
        assert set(load.acked) <= set(seen)
        report(f"3 brokers, acks=all, min.insync.replicas=2, kill -9 of one broker under load: "
               f"{len(load.acked)} acknowledged, all in Kafka, {duplicates(seen)} duplicates")
    finally:
        env_cmd("down", env_dir=env_dir, check=False)


def test_a_stopping_server_waits_for_kafka_only_a_bounded_time(unique):
    topic = f"relay.stop.{unique}"
    ensure_extension()
    with connect() as conn:
        make_topic(conn, topic)
        conn.execute("SELECT wal_enqueue(%s, '{}'::jsonb, 'first')", (topic,))
        wait_all_stored(conn, topic, 1)
    env_cmd("kafka-stop", "1")
    try:
        with connect() as conn:
            conn.execute("SELECT wal_enqueue(%s, '{}'::jsonb, 'in-flight')", (topic,))
            wait_until(lambda: conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'wal_delivery relay'"
                " AND query LIKE '%waiting for Kafka%'").fetchone()[0], 20,
                what="the relay to wait for Kafka")
        start = time.time()
        env_cmd("pg-stop")  # SIGTERM to the relay mid-wait
        stopped_in = time.time() - start
        # relay_shutdown_flush is 5 s; the delivery timeout (10 s here) must not be waited out.
        assert stopped_in < 9, f"shutdown took {stopped_in:.1f}s"
    finally:
        env_cmd("kafka-start", "1")
        env_cmd("pg-start")
    with connect() as conn:
        wait_all_stored(conn, topic, 2, timeout=90)


def test_drop_database_is_not_held_up_by_the_relay():
    env_dir, settings = scratch_env("--no-kafka")
    try:
        with scratch_connect(settings) as conn:
            conn.execute("CREATE EXTENSION wal_delivery")
        with scratch_connect(settings, "postgres") as admin:
            admin.execute("SET statement_timeout = '20s'")
            start = time.time()
            with pytest.raises(psycopg.errors.ObjectInUse):
                admin.execute("DROP DATABASE wal_delivery")
            assert time.time() - start < 15, "plain DROP DATABASE hung"
            start = time.time()
            admin.execute("DROP DATABASE wal_delivery WITH (FORCE)")
            assert time.time() - start < 10
            admin.execute("CREATE DATABASE wal_delivery")
        # The relay is restarted by the postmaster and finds its database again.
        with scratch_connect(settings) as conn:
            wait_until(lambda: conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'wal_delivery relay'"
            ).fetchone()[0], 30, what="the relay to reconnect")
    finally:
        env_cmd("down", env_dir=env_dir, check=False)


def relay_context_switches(conn, slot=0):
    """A relay backend's voluntary context switches so far: one each time it goes back to
    sleep, so what a burst of commits adds is how many times they woke it."""
    pids = [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'wal_delivery relay'")]
    # Its process title is its worker name, "wal_delivery relay <slot>".
    pid = next(p for p in pids if Path(f"/proc/{p}/cmdline").read_bytes().rstrip(b"\0 ").endswith(b"relay %d" % slot))
    with open(f"/proc/{pid}/status") as status:
        return int(status.read().split("voluntary_ctxt_switches:")[1].split()[0])


def switches_during_commits(conn, topic, commits, slot=0, before_each=None, until_stored=False):
    """The relay's context switches over `commits` single-record transactions. With
    until_stored, each record is stored before the next commit, so each commit finds the
    relay asleep (however long its passes take on a busy machine): a commit that wakes it
    adds at least one switch."""
    before = relay_context_switches(conn, slot)
    for i in range(commits):  # each its own transaction, as an application's commits
        if before_each:
            before_each(i)
        record = conn.execute("SELECT wal_enqueue(%s, '{}'::jsonb)", (topic,)).fetchone()[0]
        if until_stored:
            wait_until(lambda: conn.execute("SELECT state = 'stored' FROM wal_delivery.outbox WHERE id = %s",
                                            (record,)).fetchone()[0], 30, interval=0.002,
                       what=f"record {record} stored")
        else:
            time.sleep(0.002)
    return relay_context_switches(conn, slot) - before


def ship_warm_up(conn, topic):
    """Makes the topic and ships one record, key 'warm-up', so the relay has its producer
    and the topic's metadata before a test measures anything."""
    make_topic(conn, topic)
    conn.execute("SELECT wal_enqueue(%s, '{}'::jsonb, 'warm-up')", (topic,))
    wait_all_stored(conn, topic, 1)


def scratch_env_on_this_kafka(*settings_sql):
    """A Postgres of its own (no broker of its own) whose relay ships to the suite's Kafka."""
    env_dir, settings = scratch_env("--no-kafka")
    conn = scratch_connect(settings)
    conn.execute("CREATE EXTENSION wal_delivery")
    conn.execute(psycopg.sql.SQL("ALTER SYSTEM SET wal_delivery.kafka_bootstrap_servers = {}")
                 .format(os.environ["KAFKA_BOOTSTRAP"]))
    for statement in settings_sql:
        conn.execute(statement)
    conn.execute("SELECT pg_reload_conf()")
    return env_dir, settings, conn


def test_commits_wake_a_relay_that_can_ship_and_not_one_that_cannot(unique):
    """Each commit that enqueued wakes a relay that can ship. A relay without Kafka settings
    sleeps through them (a reload or its idle interval ends the wait): a busy database's
    commits cost it nothing, and the relay costs the machine nothing."""
    env_dir, settings, conn = scratch_env_on_this_kafka()
    topic = f"relay.wake.{unique}"
    commits = 200
    try:
        with conn:
            ship_warm_up(conn, topic)
            woken = switches_during_commits(conn, topic, commits, until_stored=True)
            assert woken >= commits, f"{commits} commits woke the relay {woken} times"
            wait_all_stored(conn, topic, commits + 1)

            conn.execute("ALTER SYSTEM SET wal_delivery.kafka_bootstrap_servers = ''")
            conn.execute("SELECT pg_reload_conf()")
            wait_until(lambda: conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'wal_delivery relay'"
                " AND wait_event = 'Extension'").fetchone()[0], 20, what="the relay to wait")
            time.sleep(1.5)  # past the pass that the reload's wake-up ran
            woken = switches_during_commits(conn, topic, commits)
            # The idle interval (1 s) and relay 0's maintenance (2 s) wake it, commits or not.
            assert woken < commits / 4, f"{commits} commits woke a relay without Kafka {woken} times"
            assert conn.execute("SELECT wal_delivery.relay_wakeups()").fetchone()[0] >= 2 * commits + 1

            # Given its settings again, it ships what waited (the reload wakes it).
            conn.execute(psycopg.sql.SQL("ALTER SYSTEM SET wal_delivery.kafka_bootstrap_servers = {}")
                         .format(os.environ["KAFKA_BOOTSTRAP"]))
            conn.execute("SELECT pg_reload_conf()")
            wait_all_stored(conn, topic, 2 * commits + 1)
    finally:
        env_cmd("down", env_dir=env_dir, check=False)


def test_a_commit_wakes_the_relay_of_the_lanes_it_wrote_only(unique):
    """With two relays, lanes are dealt out by number (relay = lane % 2): a
    commit whose records are all in relay 1's lanes wakes relay 1 and leaves relay 0 asleep,
    and every record is shipped."""
    env_dir, settings, conn = scratch_env_on_this_kafka("ALTER SYSTEM SET wal_delivery.relay_workers = 2")
    topic = f"relay.lanes.{unique}"
    commits = 200
    try:
        conn.close()
        env_cmd("pg-stop", env_dir=env_dir)  # relay_workers takes a restart
        env_cmd("pg-start", env_dir=env_dir)
        with scratch_connect(settings) as conn:
            wait_until(lambda: conn.execute("SELECT count(*) FROM pg_stat_activity"
                                            " WHERE backend_type = 'wal_delivery relay'").fetchone()[0] == 2,
                       30, what="two relays")
            ship_warm_up(conn, topic)
            time.sleep(1.5)

            def next_id_odd(i):  # an id in lane 1, 3, 5 or 7, all relay 1's
                n = conn.execute("SELECT nextval('wal_delivery.outbox_ids') + 1").fetchone()[0]
                if conn.execute("SELECT wal_delivery.log_lane(%s) %% 2 = 0", (n,)).fetchone()[0]:
                    n = (n // 64 + 1) * 64  # the next run of ids: the next lane
                conn.execute("SELECT setval('wal_delivery.outbox_ids', %s)", (n - 1,))
            before0 = relay_context_switches(conn, 0)
            woken1 = switches_during_commits(conn, topic, commits, slot=1, before_each=next_id_odd,
                                             until_stored=True)
            woken0 = relay_context_switches(conn, 0) - before0
            assert woken1 >= commits, f"{commits} commits woke relay 1 {woken1} times"
            # Relay 0's idle interval (1 s) and maintenance (2 s) wake it, commits or not.
            assert woken0 < commits / 4, f"{commits} commits to relay 1's lanes woke relay 0 {woken0} times"
            wait_all_stored(conn, topic, commits + 1)
            lanes = {r[0] for r in conn.execute("SELECT DISTINCT lane FROM wal_delivery.outbox_log"
                                                " WHERE topic = %s AND idempotency_key <> 'warm-up'", (topic,))}
            assert lanes and all(lane % 2 == 1 for lane in lanes), lanes
    finally:
        env_cmd("down", env_dir=env_dir, check=False)


def relay_passes(conn):
    return conn.execute("SELECT passes, lanes_read FROM wal_delivery.relay_passes()").fetchone()


def test_a_pass_reads_what_woke_it_and_no_record_waits_for_the_idle_interval(unique):
    """A pass reads the lanes the commits that woke it wrote, not all eight, yet every
    record ships at once: with an idle interval of a minute, none waits for it, whether it
    came by the C door, by the SQL path (a topic with writers), or in a transaction that
    was still open while later commits to its lane shipped."""
    env_dir, settings, conn = scratch_env_on_this_kafka(
        "ALTER SYSTEM SET wal_delivery.relay_idle_interval = '60s'")
    topic = f"relay.marks.{unique}"
    guarded = f"relay.marks.sql.{unique}"
    commits = 100
    try:
        with conn:
            make_topic(conn, guarded, writers="{postgres}")
            ship_warm_up(conn, topic)

            def ships(record):
                wait_until(lambda: conn.execute("SELECT state = 'stored' FROM wal_delivery.outbox WHERE id = %s",
                                                (record,)).fetchone()[0], 5, interval=0.005,
                           what=f"record {record} stored without waiting for the idle interval")

            passes0, lanes0 = relay_passes(conn)
            for _ in range(commits):
                ships(conn.execute("SELECT wal_enqueue(%s, '{}'::jsonb)", (topic,)).fetchone()[0])
            passes1, lanes1 = relay_passes(conn)
            assert passes1 - passes0 >= commits / 2, (passes0, passes1)
            # Each pass read the one lane its commit wrote (reading all was 8 per pass).
            assert lanes1 - lanes0 < 2 * (passes1 - passes0), (passes1 - passes0, lanes1 - lanes0)

            # The SQL path does not say which lane it wrote: its commit marks them all.
            ships(conn.execute("SELECT wal_enqueue(%s, '{}'::jsonb)", (guarded,)).fetchone()[0])

            # A record committed after later records of its lane were shipped.
            with scratch_connect(settings) as late:
                late.autocommit = False
                late_id = late.execute("SELECT wal_enqueue(%s, '{}'::jsonb, 'late')", (topic,)).fetchone()[0]
                for _ in range(20):
                    ships(conn.execute("SELECT wal_enqueue(%s, '{}'::jsonb)", (topic,)).fetchone()[0])
                late.commit()
            ships(late_id)
            assert states(conn, topic) == {"stored": commits + 22}
    finally:
        env_cmd("down", env_dir=env_dir, check=False)


def test_commits_that_come_often_share_passes_and_none_waits_for_the_idle_interval(unique):
    """Coalescing (wal_delivery.relay_linger): a trickle of single-record commits, one every
    ~10 ms, shares passes (far fewer passes than commits), yet every record is produced
    within a bound far under the idle interval (a minute), none is lost, and a record
    committed alone after a quiet spell ships at once."""
    env_dir, settings, conn = scratch_env_on_this_kafka(
        "ALTER SYSTEM SET wal_delivery.relay_idle_interval = '60s'",
        "ALTER SYSTEM SET wal_delivery.relay_linger = '50ms'")
    topic = f"relay.linger.{unique}"
    commits = 100
    try:
        with conn:
            ship_warm_up(conn, topic)
            time.sleep(1.5)  # past the passes the warm-up and the reload ran

            passes0, _ = relay_passes(conn)
            committed = {}
            for i in range(commits):  # each its own transaction (autocommit)
                conn.execute("SELECT wal_enqueue(%s, '{}'::jsonb, %s)", (topic, f"t{i}"))
                committed[f"t{i}"] = time.time()
                time.sleep(0.01)
            wait_all_stored(conn, topic, commits + 1, timeout=5)
            passes1, _ = relay_passes(conn)
            assert passes1 - passes0 <= commits / 3, \
                f"{commits} commits ~10 ms apart took {passes1 - passes0} passes: not coalesced"

            # The lone record: the relay has been idle for a second.
            time.sleep(1.0)
            committed["alone"] = time.time()
            lone = conn.execute("SELECT wal_enqueue(%s, '{}'::jsonb, 'alone')", (topic,)).fetchone()[0]
            wait_until(lambda: conn.execute("SELECT state = 'stored' FROM wal_delivery.outbox WHERE id = %s",
                                            (lone,)).fetchone()[0], 2, interval=0.005,
                       what="the lone record stored without waiting for the idle interval")

            produced = {k: [m["create_time"] for m in msgs] for k, msgs in
                        read_topic(os.environ["KAFKA_BOOTSTRAP"], topic, committed).items()}
            assert set(committed) <= set(produced), set(committed) - set(produced)
            # Kafka's CreateTime is the relay's produce time (same clock): within the linger
            # and a pass of its commit, far under the idle interval; 1 s leaves room for a
            # busy machine.
            late = {k: round(min(produced[k]) - t, 3) for k, t in committed.items() if min(produced[k]) - t > 1.0}
            assert not late, f"records produced more than 1 s after their commit: {late}"
    finally:
        env_cmd("down", env_dir=env_dir, check=False)


def test_a_commit_made_during_a_pass_ships_without_a_wakeup_of_its_own(unique):
    """The relay does not listen for commits while it runs a pass: a commit made then only
    leaves its mark, and the relay, before it sleeps again, finds the mark and runs another
    pass. Here the pass is held (its cursor's move waits for a row lock this test holds)
    while a record of another lane commits; with an idle interval of a minute, that record
    still ships at once after the pass is let go."""
    env_dir, settings, conn = scratch_env_on_this_kafka(
        "ALTER SYSTEM SET wal_delivery.relay_idle_interval = '60s'")
    topic = f"relay.inpass.{unique}"
    try:
        with conn:
            ship_warm_up(conn, topic)
            time.sleep(1.5)  # past the passes the warm-up and the reload ran
            with scratch_connect(settings) as blocker:
                blocker.autocommit = False
                blocker.execute("SELECT 1 FROM wal_delivery.relay_cursors FOR UPDATE")
                conn.execute("SELECT wal_enqueue(%s, '{}'::jsonb, 'first')", (topic,))
                wait_until(lambda: conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'wal_delivery relay'"
                    " AND wait_event_type = 'Lock'").fetchone()[0], 20, interval=0.01,
                    what="the relay's pass waiting for the cursor's row lock")
                # Past deadlock_timeout (1 s): its timer, once it has fired inside the lock
                # wait, cannot set the relay's latch after the pass and wake it by chance.
                time.sleep(1.5)
                # In another lane (the next run of 64 ids), which the held pass, reading
                # only the lane its commit marked, does not read.
                conn.execute("SELECT setval('wal_delivery.outbox_ids',"
                             " (nextval('wal_delivery.outbox_ids') / 64 + 1) * 64)")
                second = conn.execute("SELECT wal_enqueue(%s, '{}'::jsonb, 'second')", (topic,)).fetchone()[0]
                blocker.rollback()
            wait_until(lambda: conn.execute("SELECT state = 'stored' FROM wal_delivery.outbox WHERE id = %s",
                                            (second,)).fetchone()[0], 5, interval=0.01,
                       what="the record committed during a pass stored without waiting for the idle interval")
            wait_all_stored(conn, topic, 3)
    finally:
        env_cmd("down", env_dir=env_dir, check=False)
