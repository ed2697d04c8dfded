"""The writer's door: what a writer LOGIN role may call and see, the header names enqueue
keeps for the relay and the workers, and the record limit that keeps every accepted
record deliverable through a hand-off to retry step 1."""
import re
import signal
import time
import uuid

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition

from conftest import ROOT, Destination, connect
from consumer_helpers import Worker, add_destination, wait_published
from process_helpers import WORKER_ROLE, ensure_worker_role, make_processing_topic
from relay_helpers import ensure_extension, make_topic, relay_pids, wait_all_stored, wait_new_relay, wait_until

DOOR = {
    "wal_enqueue(text,jsonb,text,text,jsonb)",
    "wal_enqueue(text,bytea,text,text,jsonb)",
    "wal_enqueue(text,text,text,text,jsonb)",
    "wal_enqueue_batch(text,jsonb[],text[],text[],jsonb[])",
    "wal_enqueue_batch(text,bytea[],text[],text[],jsonb[])",
    "wal_enqueue_batch(text,text[],text[],text[],jsonb[])",
}
# Everyone's: the log's order index and the outbox and backlog views compute them
# (sql/src/roles.sql).
PURE = {
    "wal_delivery.log_order(smallint,xid8)",
    "wal_delivery.log_acked(xid8,bigint,wal_delivery.relay_cursors)",
    "wal_delivery.log_in_unacked_range(smallint,xid8,wal_delivery.relay_cursors)",
}


@pytest.fixture
def writers(unique):
    """Makes LOGIN members of wal_delivery_writer; drops them at the end."""
    ensure_extension()
    made = []

    def make():
        role = f"writer_{unique}_{len(made)}"
        with connect() as admin:
            admin.execute(f"CREATE ROLE {role} LOGIN IN ROLE wal_delivery_writer")
        made.append(role)
        return role

    yield make
    with connect() as admin:
        for role in made:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")


def c_reserved_headers():
    source = (ROOT / "src" / "shared" / "record_contract.c").read_text()
    body = re.search(r"record_reserved_headers\[\]\s*=\s*\{(.*?)\};", source, re.S).group(1)
    return re.findall(r'"([^"]+)"', body)


def headers_written_by(path, call):
    source = (ROOT / path).read_text()
    return set(re.findall(re.escape(call) + r'\([^,]+,\s*"([^"]+)"', source))


def test_sql_reads_the_reserved_header_names_of_the_contract_and_they_cover_every_written_header():
    with connect() as conn:
        ensure_extension()
        sql = conn.execute("SELECT wal_delivery.reserved_header_names()").fetchone()[0]
    c = c_reserved_headers()
    assert len(c) == len(set(c)) and len(sql) == len(set(sql))
    assert sorted(sql) == sorted(c)
    # Every header the relay and the hand-offs write is in the list.
    written = (headers_written_by("src/ext/kafka_producer.c", "rd_kafka_header_add")
               | headers_written_by("src/workers/common/handoff.c", "add_header"))
    assert written and written <= set(sql), f"not reserved: {written - set(sql)}"


def test_a_writer_login_may_execute_the_door_and_nothing_else(writers):
    role = writers()
    with connect(user=role) as app:
        callable_ = {r[0] for r in app.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc p"
            " JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'"
            " JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'wal_delivery'"
            " WHERE has_function_privilege(p.oid, 'EXECUTE')")}
        assert callable_ == DOOR | PURE
        readable = {r[0] for r in app.execute(
            "SELECT c.oid::regclass::text FROM pg_class c WHERE c.relnamespace = 'wal_delivery'::regnamespace"
            " AND c.relkind IN ('r', 'v', 'm', 'p', 'f', 'S')"
            " AND (has_any_column_privilege(c.oid, 'SELECT,INSERT,UPDATE,REFERENCES')"
            "      OR (c.relkind <> 'S' AND has_table_privilege(c.oid, 'DELETE,TRUNCATE,TRIGGER')))")}
        assert readable == {"wal_delivery.my_records"}
        for call in ("SELECT wal_delivery.enqueue_payload('x', '\\x00'::bytea, 'evil', NULL, NULL, NULL)",
                     "SELECT wal_delivery.check_record('x', 1, NULL, '\\x00'::bytea, 'k', NULL, NULL)"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute(call)


def test_logins_acting_as_the_writer_role_see_only_their_own_records(writers, unique):
    topic = f"door.{unique}"
    with connect() as admin:
        make_topic(admin, topic)
    first, second = writers(), writers()
    try:
        ids = {}
        for role in (first, second):
            with connect(user=role) as app:
                app.execute("SET ROLE wal_delivery_writer")
                ids[role] = app.execute("SELECT wal_enqueue(%s, '{}'::jsonb, %s)", (topic, role)).fetchone()[0]
        for role in (first, second):
            with connect(user=role) as app:
                app.execute("SET ROLE wal_delivery_writer")
                assert app.execute("SELECT id, idempotency_key FROM wal_delivery.my_records").fetchall() \
                    == [(ids[role], role)]
                # Keys are per topic: the other writer's key answers with its id (docs/operations.md).
                other = first if role == second else second
                assert app.execute("SELECT wal_enqueue(%s, '{}'::jsonb, %s)", (topic, other)).fetchone()[0] \
                    == ids[other]
    finally:
        with connect() as admin:
            admin.execute("SET wal_delivery.force_delete = on")
            admin.execute("DELETE FROM wal_delivery.topics WHERE name = %s", (topic,))


def find_in_partition(bootstrap, topic, partition, key, timeout=60):
    """The first message of one partition with this Kafka key, or None."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "t-" + uuid.uuid4().hex,
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, partition, 0)])
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error() and m.key() == key:
                return m
    finally:
        c.close()
    return None


def largest_accepted_payload(conn, topic, key, headers, high):
    """The largest payload wal_enqueue accepts with this key and headers, each try rolled back."""
    def accepted(size):
        try:
            with conn.transaction(force_rollback=True):
                conn.execute("SELECT wal_enqueue(%s, repeat('x', %s)::text, %s, headers => %s)",
                             (topic, size, key, headers))
            return True
        except psycopg.errors.ProgramLimitExceeded:
            return False
    low = 0
    assert accepted(low)
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if accepted(mid) else (low, mid - 1)
    return low


@pytest.mark.usefixtures("clean_destinations")
def test_the_largest_record_enqueue_accepts_is_handed_off_to_retry_step_1(tmp_path, kafka_bootstrap, unique):
    # Long names everywhere the hand-off repeats them: topic, key (twice), destination.
    topic = f"door.big.{unique}." + "t" * 150
    key = f"{unique}-" + "k" * 189
    name = f"d-{unique}-" + "n" * 80
    headers = '{"trace-id": "' + "h" * 100 + '"}'
    dest = Destination(tmp_path)
    dest.behave(status=503)
    worker = None
    try:
        with connect() as conn:
            ensure_extension()
            make_topic(conn, topic)  # max_payload_bytes 1000000, the default
            size = largest_accepted_payload(conn, topic, key, headers, 1_000_000)
            conn.execute("SELECT wal_enqueue(%s, repeat('x', %s)::text, %s, headers => %s)",
                         (topic, size, key, headers))
            wait_all_stored(conn, topic, 1)
            add_destination(conn, name, dest.url, [topic], timeout="30 seconds")
            wait_published(conn)
            partition = conn.execute("SELECT retry_partition FROM wal_delivery.destinations WHERE name = %s",
                                     (name,)).fetchone()[0]
        worker = Worker(tmp_path, "consume", kafka_bootstrap=kafka_bootstrap)
        dest.wait_for(1, timeout=60)
        got = find_in_partition(kafka_bootstrap, "wal_delivery.retry.1", partition, key.encode())
        assert got is not None, f"not handed off to retry step 1; worker log:\n{worker.output()[-3000:]}"
        assert len(got.value()) == size and dict(got.headers())["destination"] == name.encode()
    finally:
        if worker:
            worker.stop(signal.SIGTERM, timeout=10)
        dest.stop()
        with connect() as conn:
            conn.execute("SET wal_delivery.force_delete = on")
            conn.execute("DELETE FROM wal_delivery.destinations WHERE name = %s", (name,))
            conn.execute("DELETE FROM wal_delivery.topics WHERE name = %s", (topic,))


# Functions the door's SQL (enqueue_payload, check_record and what they call) uses
# unqualified; a writer's search_path that put these in front of pg_catalog would run
# them, as the door's owner, if that SQL ran under the caller's search_path.
SHADOWED = ["octet_length(bytea)", "octet_length(text)", "gen_random_uuid()", "nextval(regclass)",
            "quote_ident(text)", "jsonb_typeof(jsonb)", "lower(text)", "cardinality(anyarray)",
            "array_ndims(anyarray)", "convert_to(text, name)", "jsonb_each(jsonb)"]


def test_a_writers_search_path_cannot_change_what_the_door_runs(writers, unique):
    """Every way through the door (the C path, a repeated key, the SQL path of a topic with
    a processor, a record the SQL refuses, a batch) under a search_path that shadows the
    functions the door's SQL calls: the shadows never run, records land as the writer's."""
    evil, procs = f"evil_{unique}", f"door_proc_{unique}"
    log_topic, proc_topic = f"door.log.{unique}", f"door.proc.{unique}"
    role = writers()
    with connect() as admin:
        admin.execute(f"CREATE SCHEMA {evil}")
        for sig in SHADOWED:
            name, args = sig.split("(", 1)
            params = ", ".join(f"a{i} {t.strip()}" for i, t in enumerate(args.rstrip(")").split(",")) if t.strip())
            returns = "SETOF record" if name == "jsonb_each" else "text"
            admin.execute(f"CREATE FUNCTION {evil}.{name}({params}) RETURNS {returns} LANGUAGE plpgsql AS"
                          f" $$BEGIN RAISE EXCEPTION 'hijacked: {sig}'; END$$")
        admin.execute(f"GRANT USAGE ON SCHEMA {evil} TO {role}")
        admin.execute(f"CREATE SCHEMA {procs}")
        admin.execute(f"CREATE FUNCTION {procs}.same(p bytea) RETURNS bytea LANGUAGE sql AS 'SELECT p'")
        make_topic(admin, log_topic)
        make_topic(admin, proc_topic, processor_kind="sql", processor=f"{procs}.same")
    try:
        with connect(user=role) as app:
            app.execute(f"SET search_path = {evil}, pg_catalog")
            one = app.execute("SELECT wal_enqueue(%s, '{\"n\": 1}'::jsonb, 'k1')", (log_topic,)).fetchone()[0]
            assert app.execute("SELECT wal_enqueue(%s, '{\"n\": 1}'::jsonb, 'k1')", (log_topic,)).fetchone()[0] == one
            with pytest.raises(psycopg.errors.IntegrityError, match="different record"):
                app.execute("SELECT wal_enqueue(%s, '{\"n\": 2}'::jsonb, 'k1')", (log_topic,))
            generated = app.execute("SELECT wal_enqueue(%s, 'text body')", (log_topic,)).fetchone()[0]
            processed = app.execute("SELECT wal_enqueue(%s, '\\x01'::bytea, 'p1', 'mk')", (proc_topic,)).fetchone()[0]
            assert app.execute("SELECT wal_enqueue(%s, '\\x01'::bytea, 'p1', 'mk')", (proc_topic,)).fetchone()[0] \
                == processed
            with pytest.raises(psycopg.errors.IntegrityError, match="different record"):
                app.execute("SELECT wal_enqueue(%s, '\\x02'::bytea, 'p1')", (proc_topic,))
            batch = app.execute("SELECT wal_enqueue_batch(%s, ARRAY['{}'::jsonb, '{\"n\": 1}'::jsonb], ARRAY['b1', 'k1'])",
                                (log_topic,)).fetchone()[0]
            assert batch[1] == one
            proc_batch = app.execute("SELECT wal_enqueue_batch(%s, ARRAY['a', 'b'], ARRAY['p2', NULL])",
                                     (proc_topic,)).fetchone()[0]
            with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
                app.execute("SELECT wal_enqueue(%s, '{}'::jsonb, 'bad', headers => '{\"outbox-id\": \"1\"}')",
                            (log_topic,))
            assert "hijacked" not in str(refused.value)
            with pytest.raises(psycopg.errors.UndefinedObject):
                app.execute("SELECT wal_enqueue(%s, '{}'::jsonb)", (f"door.none.{unique}",))
            # The door left the session as it found it.
            assert app.execute("SELECT current_user, current_setting('search_path')").fetchone() \
                == (role, f"{evil}, pg_catalog")
        with connect() as admin:
            rows = admin.execute(
                "SELECT id, topic, idempotency_key, enqueued_by::regrole::text FROM wal_delivery.outbox"
                " WHERE topic IN (%s, %s) ORDER BY id", (log_topic, proc_topic)).fetchall()
            ids = {r[0] for r in rows}
            assert ids == {one, generated, processed, batch[0], *proc_batch}, rows
            assert {r[3] for r in rows} == {role}
            assert {"p1", "p2"} <= {r[2] for r in rows if r[1] == proc_topic}
    finally:
        with connect() as admin:
            admin.execute("SET wal_delivery.force_delete = on")
            admin.execute("DELETE FROM wal_delivery.topics WHERE name IN (%s, %s)", (log_topic, proc_topic))
            admin.execute(f"DROP SCHEMA {evil}, {procs} CASCADE")



@pytest.fixture
def database_owner(unique):
    """A writer login that owns the test database and a schema, with a table `ran` any
    role may write: its lookalike functions record there who ran them. The database's
    owner and search_path are put back after the test, and the background workers
    restarted so they take them."""
    ensure_extension()
    login = schema = f"db_owner_{unique}"
    with connect() as conn:
        database, old_owner = conn.execute(
            "SELECT datname, datdba::regrole::text FROM pg_database WHERE datname = current_database()").fetchone()
        conn.execute(f"CREATE ROLE {login} LOGIN IN ROLE wal_delivery_writer")
        conn.execute(f"CREATE SCHEMA {schema} AUTHORIZATION {login}")
        conn.execute(f'ALTER DATABASE "{database}" OWNER TO {login}')
    with connect(user=login) as owner:
        owner.execute(f"CREATE TABLE {schema}.ran (fn text, who text, super text)")
        owner.execute(f"GRANT USAGE ON SCHEMA {schema} TO PUBLIC")
        owner.execute(f"GRANT INSERT ON {schema}.ran TO PUBLIC")

    def lookalike(signature, returns):
        name, args = signature.split("(", 1)
        passed = ", ".join(a.split()[0] for a in args.rstrip(")").split(", ") if a)
        with connect(user=login) as owner:
            owner.execute(f"CREATE FUNCTION {schema}.{signature} RETURNS {returns} LANGUAGE plpgsql AS $$"
                          f" BEGIN INSERT INTO {schema}.ran VALUES ('{name}', current_user,"
                          f" current_setting('is_superuser')); RETURN pg_catalog.{name}({passed}); END $$")

    def set_search_path():
        with connect(user=login) as owner:
            owner.execute(f'ALTER DATABASE "{database}" SET search_path = {schema}, pg_catalog')

    def ran():
        with connect() as conn:
            return conn.execute(f"SELECT fn, who, super FROM {schema}.ran").fetchall()
    yield login, schema, lookalike, set_search_path, ran
    with connect() as conn:
        conn.execute(f'ALTER DATABASE "{database}" RESET search_path')
        conn.execute(f'ALTER DATABASE "{database}" OWNER TO {old_owner}')
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
        conn.execute(f"DROP OWNED BY {login}")
        conn.execute(f"DROP ROLE {login}")
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type LIKE 'wal_delivery%'")


def test_a_writer_that_owns_the_database_cannot_run_code_in_the_relay(database_owner, unique):
    """Applications often own their database. Its owner, no superuser, may set the
    database's search_path (ALTER DATABASE ... SET), which every new session takes,
    background workers too: the relay, a superuser, would then call the owner's
    pg_current_snapshot() and pg_visible_in_snapshot() for its unqualified names. The
    background workers pin search_path, so a record still ships and no lookalike runs."""
    login, _, lookalike, set_search_path, ran = database_owner
    topic = f"owner.{unique}"
    lookalike("pg_current_snapshot()", "pg_snapshot")
    lookalike("pg_visible_in_snapshot(x xid8, s pg_snapshot)", "boolean")
    lookalike("pg_snapshot_xmax(s pg_snapshot)", "xid8")
    with connect() as conn:
        make_topic(conn, topic)
        old_relays = relay_pids(conn)
    set_search_path()
    with connect() as conn:
        # New relays, which take the database's settings when they connect.
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type LIKE 'wal_delivery%'")
    wait_new_relay(old_relays)
    with connect(user=login) as owner:
        owner.execute("SELECT pg_catalog.wal_enqueue(%s, '{}'::jsonb, 'owner-1')", (topic,))
    with connect() as conn:
        wait_all_stored(conn, topic, 1)
    assert ran() == [], f"the database owner's lookalikes ran: {ran()[:5]}"


def test_a_writer_that_owns_the_database_cannot_run_code_in_a_worker(tmp_path, database_owner, unique):
    """The same database search_path in `wal-worker process`'s session would have its
    statement_timeout set through the owner's set_config(), with the worker's rights
    (worker_config(), every signing secret). The workers pin search_path in the options
    of every connection, which outrank the database's settings."""
    login, schema, lookalike, set_search_path, ran = database_owner
    topic = f"owner.process.{unique}"
    lookalike("set_config(n text, v text, l boolean)", "text")
    with connect(user=login) as owner:
        owner.execute(f"CREATE FUNCTION {schema}.same(b bytea) RETURNS bytea LANGUAGE sql AS 'SELECT b'")
        owner.execute(f"GRANT EXECUTE ON FUNCTION {schema}.same(bytea) TO wal_delivery_processor")
    with connect() as conn:
        ensure_worker_role(conn)
        make_processing_topic(conn, topic, "sql", f"{schema}.same")
    set_search_path()
    with connect(user=login) as owner:
        owner.execute("SELECT pg_catalog.wal_enqueue(%s, '{}'::jsonb, 'owner-2')", (topic,))
    worker = Worker(tmp_path, "process", conninfo=f"user={WORKER_ROLE} application_name=owner")
    try:
        with connect() as conn:
            wait_until(lambda: conn.execute("SELECT state FROM wal_delivery.outbox WHERE topic = %s",
                                            (topic,)).fetchone()[0] in ("processed", "stored"),
                       60, what="the record processed")
    finally:
        worker.stop()
    assert ran() == [], f"the database owner's lookalikes ran: {ran()[:5]}"
