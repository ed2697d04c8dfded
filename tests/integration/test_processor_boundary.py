"""A SQL processor holds settings.processing_role's rights and nothing more, whatever SQL
it runs, with a real `wal-worker process` logged in as a member of wal_delivery_worker
(issue 29, item 1). The attacker is a processor's owner: a login with only
wal_delivery_writer that owns the processor's schema. Its processor tries every way out
it can think of, catches each failure (so the record ships unchanged and nobody would
notice) and writes what it got into a table of its own. Nothing it writes may hold a
destination's signing secret or say that an attempt worked."""
import pytest

from conftest import connect
from consumer_helpers import Worker, add_destination, free_port
from process_helpers import WORKER_ROLE, ensure_worker_role, make_processing_topic
from relay_helpers import ensure_extension, wait_until

SECRET = "whsec_boundary_test_secret_value"

# (name, SQL the processor runs; its text result, if any, is what it got)
ATTEMPTS = [
    ("reset role", "RESET ROLE; got := wal_delivery.worker_config()::text"),
    ("set role worker", "SET ROLE wal_delivery_worker; got := wal_delivery.worker_config()::text"),
    ("set session authorization",
     "SET SESSION AUTHORIZATION DEFAULT; got := wal_delivery.worker_config()::text"),
    ("set_config role", "PERFORM set_config('role', 'none', true); got := wal_delivery.worker_config()::text"),
    ("worker_config as itself", "got := wal_delivery.worker_config()::text"),
    ("read the secrets", "SELECT string_agg(s::text, ',') INTO got FROM wal_delivery.destination_secrets s"),
    ("read a server file", "got := pg_read_file('/etc/hostname')"),
    ("import a large object", "got := lo_import('/etc/hostname')::text"),
    ("pause a destination",
     "PERFORM wal_delivery.pause_destination('boundary', 1, 'evil', interval '1 hour'); got := 'paused'"),
    ("file a dead letter",
     "PERFORM wal_delivery.ingest_dead_letter('t', 0, 0, 'k', 'boundary', 'evil', 0, 'x', '\\x00'::bytea, 1,"
     " 'x', '{}'::jsonb); got := 'filed'"),
    ("replace the wrapper",
     "CREATE OR REPLACE FUNCTION wal_delivery.call_sql_processor(p text, b bytea) RETURNS bytea"
     " LANGUAGE sql AS 'SELECT b'; got := 'replaced'"),
]


def processor_body(loot):
    blocks = "\n".join(
        f"""    BEGIN
        got := NULL;
        {sql};
        INSERT INTO {loot} VALUES ({i}, 'GOT ' || coalesce(got, '<null>'));
    EXCEPTION WHEN OTHERS THEN
        INSERT INTO {loot} VALUES ({i}, 'blocked: ' || SQLERRM);
    END;""" for i, (_, sql) in enumerate(ATTEMPTS))
    return f"""DECLARE got text;
BEGIN
{blocks}
    RETURN b;
END"""


@pytest.fixture
def attacker(unique):
    """A writer login owning schema tenant_<unique>, with a loot table the processing role
    may write (the owner grants it, as it would to make its processor work)."""
    ensure_extension()
    login, schema = f"tenant_owner_{unique}", f"tenant_{unique}"
    with connect() as conn:
        ensure_worker_role(conn)
        conn.execute(f"CREATE ROLE {login} LOGIN IN ROLE wal_delivery_writer")
        conn.execute(f"CREATE SCHEMA {schema} AUTHORIZATION {login}")
    with connect(user=login) as owner:
        owner.execute(f"CREATE TABLE {schema}.loot (attempt int, what text)")
        owner.execute(f"GRANT USAGE ON SCHEMA {schema} TO wal_delivery_processor")
        owner.execute(f"GRANT INSERT ON {schema}.loot TO wal_delivery_processor")
        owner.execute(f"CREATE FUNCTION {schema}.fn(b bytea) RETURNS bytea LANGUAGE plpgsql AS $$"
                      f"{processor_body(schema + '.loot')}$$")
    yield login, schema
    with connect() as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
        conn.execute(f"DROP OWNED BY {login}")
        conn.execute(f"DROP ROLE {login}")


def test_a_processor_gets_nothing_of_the_worker_it_runs_in(tmp_path, attacker, unique):
    login, schema = attacker
    topic = f"boundary.{unique}"
    with connect() as conn:
        add_destination(conn, f"boundary-{unique}", f"http://127.0.0.1:{free_port()}/", [],
                        secret=SECRET)
        make_processing_topic(conn, topic, "sql", f"{schema}.fn")
    with connect(user=login) as owner:
        owner.execute("SELECT wal_enqueue(%s, '{\"order\": 42}'::jsonb, 'boundary-1')", (topic,))
    worker = Worker(tmp_path, "process", conninfo=f"user={WORKER_ROLE} application_name=boundary")
    try:
        with connect() as conn:
            wait_until(lambda: conn.execute(
                "SELECT state FROM wal_delivery.outbox WHERE topic = %s", (topic,)).fetchone()[0]
                in ("processed", "stored"), 60, what="the record processed")
            loot = dict(conn.execute(f"SELECT attempt, what FROM {schema}.loot").fetchall())
            # The record shipped unchanged, as the attacker meant.
            assert conn.execute("SELECT convert_from(processed_payload, 'UTF8') FROM wal_delivery.outbox"
                                " WHERE topic = %s", (topic,)).fetchone()[0] == '{"order": 42}'
    finally:
        worker.stop()
    assert len(loot) == len(ATTEMPTS), loot
    for i, (name, _) in enumerate(ATTEMPTS):
        assert SECRET not in loot[i], f"{name}: the processor read a signing secret"
        assert loot[i].startswith("blocked: "), f"{name} worked: {loot[i][:200]}"


def test_a_processor_that_alters_its_wrapper_stops_processing_instead_of_escaping(
        tmp_path, unique):
    """The processing role owns call_sql_processor, so a processor can ALTER it (SECURITY
    INVOKER) where the processing role may see schema wal_delivery (the default one may
    not; an operator may have granted it). The next row is then refused with a message
    saying so, instead of running its processor with the worker's rights."""
    ensure_extension()
    schema = f"alter_{unique}"
    topic = f"boundary.alter.{unique}"
    with connect() as conn:
        ensure_worker_role(conn)
        conn.execute("GRANT USAGE ON SCHEMA wal_delivery TO wal_delivery_processor")
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO wal_delivery_processor")
        conn.execute(f"CREATE TABLE {schema}.seen (who text)")
        conn.execute(f"GRANT INSERT ON {schema}.seen TO wal_delivery_processor")
        conn.execute(f"""CREATE FUNCTION {schema}.fn(b bytea) RETURNS bytea LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO {schema}.seen VALUES (current_user);
                ALTER FUNCTION wal_delivery.call_sql_processor(text, bytea) SECURITY INVOKER;
                RETURN b;
            END $$""")
        conn.execute(f"GRANT EXECUTE ON FUNCTION {schema}.fn(bytea) TO wal_delivery_processor")
        make_processing_topic(conn, topic, "sql", f"{schema}.fn", processing_max_attempts=1)
        conn.execute("SELECT wal_enqueue(%s, '{}'::jsonb, 'first')", (topic,))
    worker = Worker(tmp_path, "process", conninfo=f"user={WORKER_ROLE} application_name=alter")
    try:
        with connect() as conn:
            wait_until(lambda: conn.execute(
                "SELECT state FROM wal_delivery.outbox WHERE topic = %s AND idempotency_key = 'first'",
                (topic,)).fetchone()[0] in ("processed", "stored"), 60, what="the first record")
            conn.execute("SELECT wal_enqueue(%s, '{}'::jsonb, 'second')", (topic,))
            wait_until(lambda: conn.execute(
                "SELECT state FROM wal_delivery.outbox WHERE topic = %s AND idempotency_key = 'second'",
                (topic,)).fetchone()[0] == "dead", 60, what="the second record refused")
            error = conn.execute("SELECT last_error FROM wal_delivery.dead_letters"
                                 " WHERE topic = %s AND idempotency_key = 'second'", (topic,)).fetchone()[0]
            assert "call_sql_processor was altered" in error, error
            # The second processor never ran, with the worker's rights or any other.
            assert conn.execute(f"SELECT who FROM {schema}.seen").fetchall() == [("wal_delivery_processor",)]
    finally:
        worker.stop()
        with connect() as conn:
            conn.execute("ALTER FUNCTION wal_delivery.call_sql_processor(text, bytea) SECURITY DEFINER")
            conn.execute("REVOKE USAGE ON SCHEMA wal_delivery FROM wal_delivery_processor")
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def tenant_owner_with_schema(login, schema, destination):
    """A processor owner: a writer login owning its own schema; and a destination with a
    secret, so worker_config() has one to steal."""
    with connect() as conn:
        ensure_worker_role(conn)
        conn.execute(f"CREATE ROLE {login} LOGIN IN ROLE wal_delivery_writer")
        conn.execute(f"CREATE SCHEMA {schema} AUTHORIZATION {login}")
        add_destination(conn, destination, f"http://127.0.0.1:{free_port()}/", [], secret=SECRET)


def test_a_processor_cannot_leave_a_setting_behind_in_the_worker_session(tmp_path, unique):
    """A plain SET in a function outlives it, in the session it ran in, even past a SET
    clause of the function's own. A processor owner's processor that ran `SET search_path
    = its_schema, pg_catalog` had the rest of run_sql_processor_row call its
    clock_timestamp() and the worker's next statement its set_config(), both with the
    worker's rights: worker_config() and every signing secret. The attempt is refused
    instead and the setting undone, so no lookalike ever runs, and the worker goes on
    processing the next topic's record in a clean session."""
    ensure_extension()
    login, schema = f"tenant_owner_{unique}", f"tenant_{unique}"
    topic, clean_topic = f"boundary.setting.{unique}", f"boundary.clean.{unique}"
    tenant_owner_with_schema(login, schema, f"boundary-setting-{unique}")
    lookalike = f"""BEGIN
        BEGIN
            INSERT INTO {schema}.loot VALUES (current_user, wal_delivery.worker_config()::text);
        EXCEPTION WHEN OTHERS THEN
            INSERT INTO {schema}.loot VALUES (current_user, 'blocked: ' || SQLERRM);
        END;
        RETURN pg_catalog.%s;
    END"""
    with connect(user=login) as owner:
        owner.execute(f"CREATE TABLE {schema}.loot (who text, what text)")
        owner.execute(f"GRANT USAGE ON SCHEMA {schema} TO PUBLIC")
        owner.execute(f"GRANT INSERT ON {schema}.loot TO PUBLIC")
        owner.execute(f"CREATE FUNCTION {schema}.clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql"
                      f" AS $${lookalike % 'clock_timestamp()'}$$")
        owner.execute(f"CREATE FUNCTION {schema}.set_config(text, text, boolean) RETURNS text"
                      f" LANGUAGE plpgsql AS $${lookalike % 'set_config($1, $2, $3)'}$$")
        owner.execute(f"CREATE FUNCTION {schema}.fn(b bytea) RETURNS bytea LANGUAGE plpgsql AS $$"
                      f" BEGIN SET search_path = {schema}, pg_catalog; RETURN b; END $$")
        # What a processor may do: set what it needs for itself, in its function's SET clause.
        owner.execute(f"CREATE FUNCTION {schema}.clean(b bytea) RETURNS bytea LANGUAGE sql"
                      f" SET search_path = {schema}, pg_catalog SET work_mem = '8MB' AS 'SELECT b'")
        owner.execute(f"GRANT EXECUTE ON FUNCTION {schema}.fn(bytea), {schema}.clean(bytea)"
                      f" TO wal_delivery_processor")
    try:
        with connect() as conn:
            make_processing_topic(conn, topic, "sql", f"{schema}.fn", processing_max_attempts=1)
            make_processing_topic(conn, clean_topic, "sql", f"{schema}.clean")
        with connect(user=login) as owner:
            owner.execute("SELECT wal_enqueue(%s, '{\"order\": 42}'::jsonb, 'setting-1')", (topic,))
        worker = Worker(tmp_path, "process", conninfo=f"user={WORKER_ROLE} application_name=setting")
        try:
            with connect() as conn:
                wait_until(lambda: conn.execute(
                    "SELECT state FROM wal_delivery.outbox WHERE topic = %s", (topic,)).fetchone()[0] == "dead",
                    60, what="the record refused")
                with connect(user=login) as owner:
                    owner.execute("SELECT wal_enqueue(%s, '{\"order\": 43}'::jsonb, 'clean-1')", (clean_topic,))
                wait_until(lambda: conn.execute(
                    "SELECT state FROM wal_delivery.outbox WHERE topic = %s", (clean_topic,)).fetchone()[0]
                    in ("processed", "stored"), 60, what="the next topic's record processed")
                error = conn.execute("SELECT last_error FROM wal_delivery.dead_letters WHERE topic = %s",
                                     (topic,)).fetchone()[0]
                loot = conn.execute(f"SELECT who, what FROM {schema}.loot").fetchall()
        finally:
            worker.stop()
        assert "changed setting search_path of the session it runs in" in error, error
        assert all(SECRET not in what for _, what in loot), "a lookalike read a signing secret"
        assert loot == [], f"a lookalike ran, as {[who for who, _ in loot]}"
    finally:
        with connect() as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
            conn.execute(f"DROP OWNED BY {login}")
            conn.execute(f"DROP ROLE {login}")


def test_nothing_a_processor_queues_runs_at_the_worker_commit(tmp_path, unique):
    """What a processor leaves for the end of the worker's transaction would run there as
    the worker: a deferred constraint trigger on a table of its owner's, and a cursor
    WITH HOLD (materialized at COMMIT). The trigger fires before the processor returns,
    as the processing role; the cursor fails the attempt, undone."""
    ensure_extension()
    login, schema = f"tenant_owner_{unique}", f"tenant_{unique}"
    trigger_topic, cursor_topic = f"boundary.trigger.{unique}", f"boundary.cursor.{unique}"
    tenant_owner_with_schema(login, schema, f"boundary-commit-{unique}")
    steal = f"""BEGIN
            INSERT INTO {schema}.loot VALUES (%s, current_user, wal_delivery.worker_config()::text);
        EXCEPTION WHEN OTHERS THEN
            INSERT INTO {schema}.loot VALUES (%s, current_user, 'blocked: ' || SQLERRM);
        END;"""
    with connect(user=login) as owner:
        owner.execute(f"CREATE TABLE {schema}.loot (how text, who text, what text)")
        owner.execute(f"CREATE TABLE {schema}.seen (x int)")
        owner.execute(f"GRANT USAGE ON SCHEMA {schema} TO PUBLIC")
        owner.execute(f"GRANT INSERT ON {schema}.loot, {schema}.seen TO PUBLIC")
        owner.execute(f"CREATE FUNCTION {schema}.at_commit() RETURNS trigger LANGUAGE plpgsql AS $$"
                      f" BEGIN {steal % (repr('trigger'), repr('trigger'))} RETURN NULL; END $$")
        owner.execute(f"CREATE CONSTRAINT TRIGGER at_commit AFTER INSERT ON {schema}.seen"
                      f" DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {schema}.at_commit()")
        owner.execute(f"CREATE FUNCTION {schema}.in_cursor() RETURNS int LANGUAGE plpgsql AS $$"
                      f" BEGIN {steal % (repr('cursor'), repr('cursor'))} RETURN 1; END $$")
        owner.execute(f"CREATE FUNCTION {schema}.queues_trigger(b bytea) RETURNS bytea LANGUAGE plpgsql AS $$"
                      f" BEGIN INSERT INTO {schema}.seen VALUES (1); RETURN b; END $$")
        owner.execute(f"CREATE FUNCTION {schema}.holds_cursor(b bytea) RETURNS bytea LANGUAGE plpgsql AS $$"
                      f" BEGIN EXECUTE 'DECLARE loot_cursor CURSOR WITH HOLD FOR SELECT {schema}.in_cursor()';"
                      f" RETURN b; END $$")
        owner.execute(f"GRANT EXECUTE ON FUNCTION {schema}.queues_trigger(bytea), {schema}.holds_cursor(bytea)"
                      f" TO wal_delivery_processor")
    try:
        with connect() as conn:
            make_processing_topic(conn, trigger_topic, "sql", f"{schema}.queues_trigger")
            make_processing_topic(conn, cursor_topic, "sql", f"{schema}.holds_cursor", processing_max_attempts=1)
        with connect(user=login) as owner:
            owner.execute("SELECT wal_enqueue(%s, '{}'::jsonb, 'trigger-1')", (trigger_topic,))
            owner.execute("SELECT wal_enqueue(%s, '{}'::jsonb, 'cursor-1')", (cursor_topic,))
        worker = Worker(tmp_path, "process", conninfo=f"user={WORKER_ROLE} application_name=commit")
        try:
            with connect() as conn:
                def state(topic):
                    return conn.execute("SELECT state FROM wal_delivery.outbox WHERE topic = %s",
                                        (topic,)).fetchone()[0]
                wait_until(lambda: state(trigger_topic) in ("processed", "stored"), 60,
                           what="the trigger's record processed")
                wait_until(lambda: state(cursor_topic) == "dead", 60, what="the cursor's record refused")
                error = conn.execute("SELECT last_error FROM wal_delivery.dead_letters WHERE topic = %s",
                                     (cursor_topic,)).fetchone()[0]
                loot = conn.execute(f"SELECT how, who, what FROM {schema}.loot ORDER BY how").fetchall()
        finally:
            worker.stop()
        assert "left cursor loot_cursor WITH HOLD open" in error, error
        assert all(SECRET not in what for _, _, what in loot), "code queued for COMMIT read a signing secret"
        assert [(how, who) for how, who, _ in loot] == [("trigger", "wal_delivery_processor")], loot
    finally:
        with connect() as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
            conn.execute(f"DROP OWNED BY {login}")
            conn.execute(f"DROP ROLE {login}")
