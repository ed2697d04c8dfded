"""The control plane as a DBA runs it: a fresh non-superuser LOGIN role that is a member of
wal_delivery_admin does every operation docs/operations.md describes (the
config tables, on-call SQL, archive and restore, pg_cron scheduling, every operator view).
Valid rows are accepted; every CHECK constraint and validation trigger of the config
tables refuses a bad value with its documented SQLSTATE, never with a privilege error. A
wal_delivery_writer member and a plain login role get 42501 on all of it."""
import uuid

import psycopg
import pytest

from conftest import connect, env_cmd, needs_pg_cron
from relay_helpers import ensure_extension
from s3_helpers import S3Server

U = uuid.uuid4().hex[:8]
TOPIC = f"adm.{U}"              # a plain topic the admin made
PTOPIC = f"adm.proc.{U}"        # a SQL-processing topic with a pending record (no worker runs)
DEST = f"adm-{U}"               # a destination subscribed to PTOPIC
ADMIN, WRITER, NOBODY = f"adm_admin_{U}", f"adm_writer_{U}", f"adm_nobody_{U}"


def error_of(conn, sql):
    """(SQLSTATE, message) of sql, or None when it succeeds."""
    try:
        conn.execute(sql)
    except psycopg.Error as e:
        return e.sqlstate, str(e.diag.message_primary)
    return None


@pytest.fixture(scope="module")
def roles():
    ensure_extension()
    with connect() as su:
        su.execute("CREATE SCHEMA IF NOT EXISTS adm_test")
        su.execute("CREATE OR REPLACE FUNCTION adm_test.ident(p bytea) RETURNS bytea"
                   " LANGUAGE sql AS $$ SELECT p $$")
        # As docs/operations.md says: the schema of a SQL processor is usable by the admins.
        su.execute("GRANT USAGE ON SCHEMA adm_test TO wal_delivery_admin")
        su.execute(f"CREATE ROLE {ADMIN} LOGIN IN ROLE wal_delivery_admin")
        su.execute(f"CREATE ROLE {WRITER} LOGIN IN ROLE wal_delivery_writer")
        su.execute(f"CREATE ROLE {NOBODY} LOGIN")
    yield
    with connect() as su:
        su.execute("SET wal_delivery.force_delete = on")
        su.execute("DELETE FROM wal_delivery.dead_letters WHERE topic LIKE %s", (f"adm.%{U}",))
        su.execute("DELETE FROM wal_delivery.topics WHERE name LIKE %s", (f"adm.%{U}",))
        su.execute("DELETE FROM wal_delivery.destinations WHERE name LIKE %s", (f"adm-%{U}",))
        for role in (ADMIN, WRITER, NOBODY):
            su.execute(f"DROP OWNED BY {role}")
            su.execute(f"DROP ROLE {role}")


def as_role(role):
    return connect(user=role)


@pytest.fixture(scope="module")
def config(roles):
    """What the admin made: a plain topic, a processing topic with one pending record, a
    destination subscribed to it with a signing secret."""
    with as_role(ADMIN) as adm:
        adm.execute("INSERT INTO wal_delivery.topics (name, partitions, replication_factor,"
                    " min_insync_replicas) VALUES (%s, 1, 1, 1)", (TOPIC,))
        adm.execute("INSERT INTO wal_delivery.topics (name, partitions, replication_factor,"
                    " min_insync_replicas, processor_kind, processor)"
                    " VALUES (%s, 1, 1, 1, 'sql', 'adm_test.ident')", (PTOPIC,))
        adm.execute("INSERT INTO wal_delivery.destinations (name, endpoint, headers)"
                    " VALUES (%s, 'http://127.0.0.1:9/x', '{\"X-Team\": \"billing\"}')", (DEST,))
        adm.execute("INSERT INTO wal_delivery.destination_secrets VALUES (%s, 'whsec_0123456789abcdef')",
                    (DEST,))
        adm.execute("INSERT INTO wal_delivery.subscriptions (topic, destination) VALUES (%s, %s)",
                    (PTOPIC, DEST))
        adm.execute("SELECT wal_enqueue(%s, '{\"n\": 1}'::jsonb, 'pending-one')", (PTOPIC,))
    yield


@pytest.fixture
def admin(config):
    with as_role(ADMIN) as conn:
        yield conn


def test_the_admin_is_a_plain_login_role(admin):
    assert admin.execute("SELECT rolsuper, rolcreaterole, rolbypassrls FROM pg_roles"
                         " WHERE rolname = current_user").fetchone() == (False, False, False)
    assert admin.execute("SELECT pg_has_role(current_user, 'wal_delivery_admin', 'MEMBER')").fetchone()[0]


# ------------------------------------------------------------------ valid rows

VALID = {
    "topic insert, update, delete": [
        "INSERT INTO wal_delivery.topics (name, partitions, replication_factor, min_insync_replicas,"
        " acks, retention, max_payload_bytes, idempotency_window, processing_lease,"
        " processing_max_attempts, processing_backoff, processing_timeout)"
        f" VALUES ('adm.v.{U}', 2, 1, 1, 1, '1 day', 5000, '1 hour', '5 seconds', 3, '0 seconds', '1 second')",
        f"UPDATE wal_delivery.topics SET partitions = 3, processor_kind = 'http',"
        f" processor = 'https://transform.test/x' WHERE name = 'adm.v.{U}'",
        f"UPDATE wal_delivery.topics SET processor_kind = 'sql', processor = 'adm_test.ident'"
        f" WHERE name = 'adm.v.{U}'",
        f"UPDATE wal_delivery.topics SET name = 'adm.w.{U}' WHERE name = 'adm.v.{U}'",
        f"DELETE FROM wal_delivery.topics WHERE name = 'adm.w.{U}'"],
    "destination insert, update, delete": [
        "INSERT INTO wal_delivery.destinations (name, endpoint, method, headers, timeout, max_in_flight,"
        " dedicated, transient_statuses, retry_delays, retry_jitter, pause_after_failures,"
        " probe_interval, verify_tls)"
        f" VALUES ('adm-v-{U}', 'https://x.test/hook', 'PUT', '{{\"A\": \"b\"}}', '2 seconds', 4, true,"
        " '{429,5xx}', '{1 second,2 seconds,3 seconds}', 0, 3, '10 seconds', false)",
        f"UPDATE wal_delivery.destinations SET method = 'PATCH', headers = '{{}}' WHERE name = 'adm-v-{U}'",
        f"DELETE FROM wal_delivery.destinations WHERE name = 'adm-v-{U}'"],
    "signing secret insert, read, update, delete": [
        f"INSERT INTO wal_delivery.destinations (name, endpoint) VALUES ('adm-s-{U}', 'https://x.test/')",
        f"INSERT INTO wal_delivery.destination_secrets VALUES ('adm-s-{U}', 'whsec_aaaaaaaaaaaaaaaa')",
        "SELECT signing_secret FROM wal_delivery.destination_secrets",
        f"UPDATE wal_delivery.destination_secrets SET signing_secret = 'whsec_bbbbbbbbbbbbbbbb'"
        f" WHERE destination = 'adm-s-{U}'",
        f"DELETE FROM wal_delivery.destination_secrets WHERE destination = 'adm-s-{U}'",
        f"DELETE FROM wal_delivery.destinations WHERE name = 'adm-s-{U}'"],
    "subscription insert, delete": [
        f"INSERT INTO wal_delivery.subscriptions (topic, destination) VALUES ('{TOPIC}', '{DEST}')",
        f"DELETE FROM wal_delivery.subscriptions WHERE topic = '{TOPIC}' AND destination = '{DEST}'"],
    "settings update": [
        "UPDATE wal_delivery.settings SET consumer_dedupe_ttl = consumer_dedupe_ttl,"
        " retry_dlq_retention = retry_dlq_retention, dlq_alert_url = dlq_alert_url",
        "UPDATE wal_delivery.settings SET archive_s3_prefix = archive_s3_prefix,"
        " archive_batch_rows = archive_batch_rows, processing_role = processing_role"],
    "archive credentials insert, read, delete": [
        "DELETE FROM wal_delivery.archive_credentials",
        "INSERT INTO wal_delivery.archive_credentials (access_key_id, secret_access_key, session_token)"
        " VALUES ('AKIAEXAMPLE', 'secret/with+chars', 'token')",
        "SELECT secret_access_key FROM wal_delivery.archive_credentials",
        "UPDATE wal_delivery.archive_credentials SET session_token = NULL",
        "DELETE FROM wal_delivery.archive_credentials"],
    "ingest token create, revoke, delete": [
        f"SELECT wal_delivery.create_ingest_token('adm-tok-{U}', ARRAY['{TOPIC}'])",
        f"UPDATE wal_delivery.ingest_tokens SET topics = ARRAY['*'] WHERE name = 'adm-tok-{U}'",
        f"UPDATE wal_delivery.ingest_tokens SET revoked_at = now() WHERE name = 'adm-tok-{U}'",
        f"DELETE FROM wal_delivery.ingest_tokens WHERE name = 'adm-tok-{U}'"],
    "forced delete of a topic with undelivered records": [
        "INSERT INTO wal_delivery.topics (name, partitions, replication_factor, min_insync_replicas,"
        f" processor_kind, processor) VALUES ('adm.f.{U}', 1, 1, 1, 'sql', 'adm_test.ident')",
        f"SELECT wal_enqueue('adm.f.{U}', '{{}}'::jsonb)",
        "BEGIN",
        "SET LOCAL wal_delivery.force_delete = on",
        f"DELETE FROM wal_delivery.topics WHERE name = 'adm.f.{U}'",
        "COMMIT"],
}


@pytest.mark.parametrize("steps", VALID.values(), ids=VALID.keys())
def test_the_admin_manages_the_config_tables(admin, steps):
    before = admin.execute("SELECT version FROM wal_delivery.config_version").fetchone()[0]
    for sql in steps:
        assert error_of(admin, sql) is None, sql
    if not all(s.startswith(("SELECT", "DELETE FROM wal_delivery.archive", "INSERT INTO wal_delivery.archive",
                             "UPDATE wal_delivery.archive")) for s in steps):
        assert admin.execute("SELECT version FROM wal_delivery.config_version").fetchone()[0] > before


# ------------------------------------------------------------------ every check

def topic_insert(column, value):
    return (f"INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas, {column})"
            f" VALUES ('adm.bad.{U}', 1, 1, {value})")


def destination_insert(column, value):
    return (f"INSERT INTO wal_delivery.destinations (name, endpoint, {column})"
            f" VALUES ('adm-bad-{U}', 'https://x.test/', {value})")


def settings(assignments):
    return f"UPDATE wal_delivery.settings SET {assignments}"


# (what, SQL, documented SQLSTATE): each CHECK constraint and validation trigger branch of
# sql/src/config/*.sql and archive.sql.
CHECKS = [
    # topics: check_topic, check_topic_processing_timeout, the table's CHECKs
    ("topic name", "INSERT INTO wal_delivery.topics (name) VALUES ('bad name!')", "42602"),
    ("topic acks 0", topic_insert("acks", 0), "23514"),
    ("topic acks NULL", topic_insert("acks", "NULL"), "23514"),
    ("topic partitions", topic_insert("partitions", 0), "23514"),
    ("topic replication_factor",
     f"INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas)"
     f" VALUES ('adm.bad.{U}', 0, 1)", "23514"),
    ("topic min_insync_replicas",
     f"INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas)"
     f" VALUES ('adm.bad.{U}', 1, 2)", "23514"),
    ("topic retention", topic_insert("retention", "'0 seconds'"), "23514"),
    ("topic max_payload_bytes", topic_insert("max_payload_bytes", 0), "23514"),
    ("topic max_payload_bytes too large", topic_insert("max_payload_bytes", 100000001), "23514"),
    ("topic idempotency_window", topic_insert("idempotency_window", "'-1 day'"), "23514"),
    ("topic processor_kind without processor", topic_insert("processor_kind", "'sql'"), "23514"),
    ("topic processor without processor_kind", topic_insert("processor", "'adm_test.ident'"), "23514"),
    ("topic processor_kind unknown", topic_insert("processor_kind, processor", "'grpc', 'x'"), "23514"),
    ("topic sql processor missing", topic_insert("processor_kind, processor", "'sql', 'adm_test.nope'"),
     "23514"),
    ("topic http processor not a URL", topic_insert("processor_kind, processor", "'http', 'ftp://x'"),
     "23514"),
    ("topic processing_lease", topic_insert("processing_lease", "'0 seconds'"), "23514"),
    ("topic processing_backoff", topic_insert("processing_backoff", "'-1 second'"), "23514"),
    ("topic processing_max_attempts", topic_insert("processing_max_attempts", 0), "23514"),
    ("topic processing_timeout zero", topic_insert("processing_timeout", "'0 seconds'"), "23514"),
    ("topic processing_timeout too long", topic_insert("processing_timeout", "'2 hours'"), "23514"),
    ("topic update to a bad value", f"UPDATE wal_delivery.topics SET acks = 0 WHERE name = '{TOPIC}'",
     "23514"),
    ("topic rename with outbox rows",
     f"UPDATE wal_delivery.topics SET name = 'adm.renamed.{U}' WHERE name = '{PTOPIC}'", "2BP01"),
    ("topic delete with undelivered records", f"DELETE FROM wal_delivery.topics WHERE name = '{PTOPIC}'",
     "2BP01"),
    # destinations: check_destination, keep_retry_partition, the table's CHECKs
    ("destination name", "INSERT INTO wal_delivery.destinations (name, endpoint)"
     " VALUES ('bad name!', 'https://x.test/')", "42602"),
    ("destination transport", destination_insert("transport", "'smtp'"), "23514"),
    ("destination endpoint", f"INSERT INTO wal_delivery.destinations (name, endpoint)"
     f" VALUES ('adm-bad-{U}', 'ftp://x.test/')", "23514"),
    ("destination method", destination_insert("method", "'GET'"), "23514"),
    ("destination headers not an object", destination_insert("headers", "'[]'"), "23514"),
    ("destination headers not strings", destination_insert("headers", "'{\"A\": 1}'"), "23514"),
    ("destination timeout", destination_insert("timeout", "'10 minutes'"), "23514"),
    ("destination max_in_flight", destination_insert("max_in_flight", 0), "23514"),
    ("destination transient_statuses", destination_insert("transient_statuses", "'{abc}'"), "23514"),
    ("destination retry_delays", destination_insert("retry_delays", "'{1 second}'"), "23514"),
    ("destination retry_jitter", destination_insert("retry_jitter", 2), "23514"),
    ("destination pause_after_failures", destination_insert("pause_after_failures", 0), "23514"),
    ("destination probe_interval", destination_insert("probe_interval", "'0 seconds'"), "23514"),
    ("destination update to a bad value",
     f"UPDATE wal_delivery.destinations SET method = 'GET' WHERE name = '{DEST}'", "23514"),
    ("destination retry_partition change",
     f"UPDATE wal_delivery.destinations SET retry_partition = retry_partition + 100000"
     f" WHERE name = '{DEST}'", "23514"),
    ("destination delete with undelivered records",
     f"DELETE FROM wal_delivery.destinations WHERE name = '{DEST}'", "2BP01"),
    # destination_secrets
    ("signing secret too short", f"UPDATE wal_delivery.destination_secrets SET signing_secret = 'short'"
     f" WHERE destination = '{DEST}'", "23514"),
    ("signing secret of a missing destination",
     f"INSERT INTO wal_delivery.destination_secrets VALUES ('adm-none-{U}', 'whsec_0123456789abcdef')",
     "23503"),
    # subscriptions
    ("subscription to a missing topic", f"INSERT INTO wal_delivery.subscriptions (topic, destination)"
     f" VALUES ('adm.none.{U}', '{DEST}')", "23503"),
    ("subscription of a missing destination", f"INSERT INTO wal_delivery.subscriptions (topic, destination)"
     f" VALUES ('{TOPIC}', 'adm-none-{U}')", "23503"),
    # settings: check_settings, the table's CHECKs
    ("settings retention", settings("retry_dlq_retention = '0 seconds'"), "23514"),
    ("settings archive after", settings("dead_letter_archive_after = '-1 day'"), "23514"),
    ("settings dedupe ttl", settings("consumer_dedupe_ttl = '-1 second'"), "23514"),
    ("settings archive after retention", settings("dead_letter_archive_after = '15 days'"), "23514"),
    ("settings retry_topic_prefix", settings("retry_topic_prefix = 'bad prefix'"), "23514"),
    ("settings dlq_topic", settings("dlq_topic = ''"), "23514"),
    ("settings replication factor", settings("internal_topic_replication_factor = 0"), "23514"),
    ("settings min insync replicas", settings("internal_topic_min_insync_replicas = 9"), "23514"),
    ("settings dlq_alert_url", settings("dlq_alert_url = 'ftp://alerts.test/'"), "23514"),
    ("settings processing_role missing", settings(f"processing_role = 'adm_none_{U}'"), "23514"),
    ("settings processing_role superuser", settings("processing_role = 'postgres'"), "23514"),
    ("settings processing_role not the workers'", settings(f"processing_role = '{NOBODY}'"), "23514"),
    # settings: check_archive_settings
    ("archive endpoint", settings("archive_s3_endpoint = 'ftp://s3.test'"), "23514"),
    ("archive endpoint with a path", settings("archive_s3_endpoint = 'https://s3.test/bucket'"), "23514"),
    ("archive endpoint http", settings("archive_s3_endpoint = 'http://s3.test', archive_s3_allow_http = false"),
     "23514"),
    ("archive bucket", settings("archive_s3_bucket = 'Bad_Bucket'"), "23514"),
    ("archive region", settings("archive_s3_region = 'eu west'"), "23514"),
    ("archive prefix leading slash", settings("archive_s3_prefix = '/dl'"), "23514"),
    ("archive prefix empty segment", settings("archive_s3_prefix = 'a//b'"), "23514"),
    ("archive prefix dot segment", settings("archive_s3_prefix = 'a/./b'"), "23514"),
    ("archive prefix dot-dot segment", settings("archive_s3_prefix = 'a/../b'"), "23514"),
    ("archive prefix dot-dot alone", settings("archive_s3_prefix = '..'"), "23514"),
    ("archive timeout", settings("archive_s3_timeout = '0 seconds'"), "23514"),
    ("archive max run time", settings("archive_max_run_time = '0 seconds'"), "23514"),
    ("archive batch rows", settings("archive_batch_rows = 0"), "23514"),
    ("archive batch bytes", settings("archive_batch_bytes = 10"), "23514"),
    # ingest_tokens: check_ingest_token, the table's CHECK
    ("ingest token name", "SELECT wal_delivery.create_ingest_token('bad name!', ARRAY['*'])", "42602"),
    ("ingest token topics", f"SELECT wal_delivery.create_ingest_token('adm-badtok-{U}', ARRAY['bad topic!'])",
     "23514"),
    ("ingest token hash length", "INSERT INTO wal_delivery.ingest_tokens (name, token_sha256)"
     f" VALUES ('adm-badtok-{U}', '\\x00')", "23514"),
    # archive_credentials: the table's CHECKs
    ("archive credentials key id", "INSERT INTO wal_delivery.archive_credentials"
     " (access_key_id, secret_access_key) VALUES ('', 'secret')", "23514"),
    ("archive credentials secret", "INSERT INTO wal_delivery.archive_credentials"
     " (access_key_id, secret_access_key) VALUES ('AKIA', 'with space')", "23514"),
    ("archive credentials singleton", "INSERT INTO wal_delivery.archive_credentials"
     " (singleton, access_key_id, secret_access_key) VALUES (false, 'AKIA', 'secret')", "23514"),
]


@pytest.mark.parametrize("sql,sqlstate", [c[1:] for c in CHECKS], ids=[c[0] for c in CHECKS])
def test_every_check_refuses_the_admin_with_its_sqlstate(admin, sql, sqlstate):
    got = error_of(admin, sql)
    assert got is not None, f"accepted: {sql}"
    assert got[0] == sqlstate, got


def test_the_settings_row_is_not_the_admins_to_insert_or_delete(admin):
    """The one settings row is created with the extension; the admin only updates it."""
    assert error_of(admin, "DELETE FROM wal_delivery.settings")[0] == "42501"
    assert error_of(admin, "INSERT INTO wal_delivery.settings (singleton) VALUES (false)")[0] == "42501"


# ------------------------------------------------------------------ on-call

@pytest.fixture
def dead_letters(config):
    """Two delivery dead letters for DEST, added as the dlq worker would."""
    with connect() as su:
        ids = [r[0] for r in su.execute(
            "INSERT INTO wal_delivery.dead_letters (origin, topic, idempotency_key, destination,"
            " payload, attempts, last_error) SELECT 'delivery', %s, 'k' || i, %s, '\\x7b7d',"
            " 4, 'HTTP 400' FROM generate_series(1, 3) i RETURNING id", (PTOPIC, DEST)).fetchall()]
    yield ids
    with connect() as su:
        su.execute("DELETE FROM wal_delivery.dead_letters WHERE id = ANY(%s)", (ids,))


def test_the_admin_runs_the_on_call_sql(admin, dead_letters):
    first, second, third = dead_letters
    assert admin.execute("SELECT count(*) FROM wal_delivery.unresolved_dead_letters WHERE id = ANY(%s)",
                         (dead_letters,)).fetchone()[0] == 3
    inspected = admin.execute("SELECT wal_delivery.inspect_dead_letter(%s)", (first,)).fetchone()[0]
    assert inspected["payload"] == "{}" and inspected["destination"] == DEST
    assert admin.execute("SELECT wal_delivery.replay_dead_letter(%s)", (first,)).fetchone()[0] == \
        f"queued for retry step 1 of {DEST}"
    assert admin.execute("SELECT wal_delivery.resolve_dead_letter(%s, 'handled by hand')",
                         (second,)).fetchone() is not None
    assert admin.execute("SELECT wal_delivery.resolve_dead_letters('bad batch', p_topic => %s,"
                         " p_destination => %s)", (PTOPIC, DEST)).fetchone()[0] == 2
    assert admin.execute("SELECT wal_delivery.replay_dead_letters(p_destination => %s,"
                         " p_failed_after => now() - interval '1 day')", (DEST,)).fetchone()[0] == 0
    admin.execute("UPDATE wal_delivery.dead_letters SET resolution = 'noted' WHERE id = %s", (third,))
    # The pause: what the retry workers do, and on-call's resume.
    assert admin.execute("SELECT wal_delivery.pause_destination(%s, 1, 'HTTP 503', '1 minute')",
                         (DEST,)).fetchone()[0] is True
    assert admin.execute("SELECT breaker FROM wal_delivery.destination_status WHERE destination = %s",
                         (DEST,)).fetchone()[0] == "open"
    assert admin.execute("SELECT wal_delivery.resume_destination(%s)", (DEST,)).fetchone()[0] is True
    # Purging by hand, outside a transaction block.
    admin.execute("CALL wal_delivery.purge_finished(1000, 1)")


VIEWS = ["outbox", "dead_letters", "config_version", "backlog", "unresolved_dead_letters",
         "config_status", "kafka_topics", "reconcile_status", "destination_pauses",
         "destination_step_stats", "destination_status", "processing_status", "my_records",
         "topics", "destinations", "destination_secrets", "subscriptions", "settings",
         "archive_credentials", "ingest_tokens"]


@pytest.mark.parametrize("view", VIEWS)
def test_the_admin_reads_every_operator_view(admin, view):
    # Every column of every row, as JSON: a parked row's available_at is 'infinity',
    # which Postgres returns and Python's datetime cannot hold.
    admin.execute(f"SELECT to_jsonb(v) FROM wal_delivery.{view} v").fetchall()


def test_the_admin_reads_what_the_workers_read(admin):
    config = admin.execute("SELECT wal_delivery.worker_config()").fetchone()[0]
    assert DEST in [d["name"] for d in config["destinations"]]
    assert admin.execute("SELECT count(*) FROM wal_delivery.desired_kafka_topics() WHERE topic = %s",
                         (TOPIC,)).fetchone()[0] == 1
    assert admin.execute("SELECT wal_delivery.library_version()").fetchone()[0]


def test_the_admin_archives_and_restores_dead_letters(admin, dead_letters, tmp_path):
    server = S3Server(tmp_path)
    bucket = f"adm-{U}"
    try:
        server.client().create_bucket(Bucket=bucket)
        admin.execute("DELETE FROM wal_delivery.archive_credentials")
        admin.execute("INSERT INTO wal_delivery.archive_credentials (access_key_id, secret_access_key)"
                      " VALUES (%s, %s)", (server.access_key_id, server.secret_access_key))
        admin.execute("UPDATE wal_delivery.settings SET archive_s3_endpoint = %s, archive_s3_bucket = %s,"
                      " archive_s3_path_style = true, archive_s3_allow_http = true,"
                      " archive_s3_prefix = 'adm'", (server.endpoint, bucket))
        with connect() as su:  # only the dlq worker and the database write dead letters
            su.execute("UPDATE wal_delivery.dead_letters SET failed_at = now() - interval '11 days'"
                       " WHERE id = ANY(%s)", (dead_letters,))
        summary = admin.execute("CALL wal_delivery.archive_dead_letters()").fetchone()[0]
        assert summary["finished"] and summary["archived"] >= 3, summary
        (key,) = [k for k in summary["objects"] if admin.execute(
            "SELECT wal_delivery.fetch_archive_object(%s) LIKE %s", (k, f"%{DEST}%")).fetchone()[0]]
        restored = admin.execute("SELECT * FROM wal_delivery.restore_dead_letters(%s)", (key,)).fetchone()
        assert restored[0] >= 3
        assert admin.execute("SELECT count(*) FROM wal_delivery.dead_letters WHERE id = ANY(%s)",
                             (dead_letters,)).fetchone()[0] == 3
    finally:
        admin.execute("DELETE FROM wal_delivery.archive_credentials")
        admin.execute("UPDATE wal_delivery.settings SET archive_s3_endpoint = NULL, archive_s3_bucket = NULL,"
                      " archive_s3_allow_http = false, archive_s3_prefix = DEFAULT")
        server.stop()


@needs_pg_cron
def test_create_extension_grants_pg_cron_to_the_admin_when_pg_cron_is_there():
    """A scratch server, so the extension can be created after pg_cron without dropping the
    shared one; the admin then schedules the job."""
    env_dir = f"/tmp/wal_delivery-test-{uuid.uuid4().hex[:8]}"
    out = env_cmd("up", "--no-kafka", env_dir=env_dir)
    env = dict(line.removeprefix("export ").split("=", 1) for line in out.stdout.splitlines())
    env = {k: v.strip("'") for k, v in env.items()}

    def scratch(user="postgres"):
        return psycopg.connect(host=env["PGHOST"], port=env["PGPORT"], user=user,
                               dbname="wal_delivery", autocommit=True)
    try:
        with scratch() as su:
            su.execute("CREATE EXTENSION pg_cron")
            su.execute("CREATE EXTENSION wal_delivery")
            assert su.execute("SELECT has_schema_privilege('wal_delivery_admin', 'cron', 'USAGE')").fetchone()[0]
            su.execute("CREATE ROLE scratch_admin LOGIN IN ROLE wal_delivery_admin")
        with scratch("scratch_admin") as adm:
            job = adm.execute("SELECT wal_delivery.schedule_dead_letter_archival()").fetchone()[0]
            assert adm.execute("SELECT username FROM cron.job WHERE jobid = %s", (job,)).fetchone() == \
                ("scratch_admin",)
    finally:
        env_cmd("down", env_dir=env_dir, check=False)


@needs_pg_cron
def test_the_admin_schedules_the_archive_job_with_pg_cron(admin):
    with connect() as su:
        su.execute("CREATE EXTENSION IF NOT EXISTS pg_cron")
        su.execute("REVOKE USAGE ON SCHEMA cron FROM wal_delivery_admin")
    # pg_cron installed after wal_delivery: the refusal says what to grant.
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
        admin.execute("SELECT wal_delivery.schedule_dead_letter_archival()")
    assert "GRANT USAGE ON SCHEMA cron TO wal_delivery_admin" in refused.value.diag.message_hint
    with connect() as su:
        su.execute("GRANT USAGE ON SCHEMA cron TO wal_delivery_admin")
    job = admin.execute("SELECT wal_delivery.schedule_dead_letter_archival('17 3 * * *')").fetchone()[0]
    try:
        assert admin.execute("SELECT username, command, schedule FROM cron.job WHERE jobid = %s",
                             (job,)).fetchone() == (ADMIN, "CALL wal_delivery.archive_dead_letters()",
                                                    "17 3 * * *")
        again = admin.execute("SELECT wal_delivery.schedule_dead_letter_archival('0 4 * * *')").fetchone()[0]
        assert again == job, "scheduling again changes the schedule of the same job"
    finally:
        admin.execute("SELECT cron.unschedule('wal_delivery_archive_dead_letters')")


# ------------------------------------------------------------------ the others

DENIED = [
    "SELECT * FROM wal_delivery.topics",
    f"INSERT INTO wal_delivery.topics (name) VALUES ('adm.denied.{U}')",
    f"UPDATE wal_delivery.topics SET partitions = 5 WHERE name = '{TOPIC}'",
    f"DELETE FROM wal_delivery.topics WHERE name = '{TOPIC}'",
    f"INSERT INTO wal_delivery.destinations (name, endpoint) VALUES ('adm-denied-{U}', 'https://x.test/')",
    f"UPDATE wal_delivery.destinations SET method = 'PUT' WHERE name = '{DEST}'",
    f"DELETE FROM wal_delivery.destinations WHERE name = '{DEST}'",
    "SELECT * FROM wal_delivery.destination_secrets",
    f"INSERT INTO wal_delivery.destination_secrets VALUES ('{DEST}', 'whsec_0123456789abcdef')",
    f"INSERT INTO wal_delivery.subscriptions (topic, destination) VALUES ('{TOPIC}', '{DEST}')",
    "DELETE FROM wal_delivery.subscriptions",
    "UPDATE wal_delivery.settings SET consumer_dedupe_ttl = '1 hour'",
    "SELECT * FROM wal_delivery.settings",
    "SELECT * FROM wal_delivery.archive_credentials",
    "INSERT INTO wal_delivery.archive_credentials (access_key_id, secret_access_key) VALUES ('a', 'b')",
    *[f"SELECT * FROM wal_delivery.{v}" for v in VIEWS if v not in (
        "topics", "destinations", "destination_secrets", "subscriptions", "settings", "archive_credentials",
        "my_records", "ingest_tokens")],
    "UPDATE wal_delivery.dead_letters SET resolution = 'x'",
    "SELECT wal_delivery.inspect_dead_letter(1)",
    "SELECT wal_delivery.replay_dead_letter(1)",
    "SELECT wal_delivery.replay_dead_letters()",
    "SELECT wal_delivery.resolve_dead_letter(1, 'x')",
    "SELECT wal_delivery.resolve_dead_letters('x')",
    f"SELECT wal_delivery.resume_destination('{DEST}')",
    f"SELECT wal_delivery.pause_destination('{DEST}', 1, 'x', '1 minute')",
    "CALL wal_delivery.archive_dead_letters()",
    "SELECT wal_delivery.restore_dead_letters('x')",
    "SELECT wal_delivery.fetch_archive_object('x')",
    "SELECT wal_delivery.schedule_dead_letter_archival()",
    "SELECT wal_delivery.worker_config()",
    "SELECT * FROM wal_delivery.claim_for_processor(1)",
    "SELECT * FROM wal_delivery.run_sql_processor('{1}', '{1}')",
    "SELECT * FROM wal_delivery.claim_ready_to_ship(1)",
    "CALL wal_delivery.purge_finished(1, 1)",
    "SELECT * FROM wal_delivery.ingest_tokens",
    "SELECT wal_delivery.create_ingest_token('x', ARRAY['*'])",
]


@pytest.mark.parametrize("role", [WRITER, NOBODY], ids=["writer", "plain login"])
@pytest.mark.parametrize("sql", DENIED)
def test_the_writer_and_a_plain_role_are_denied(config, role, sql):
    with as_role(role) as conn:
        got = error_of(conn, sql)
    assert got is not None and got[0] == "42501", got


def test_the_writer_still_enqueues_and_reads_its_own_records(config):
    with as_role(WRITER) as conn:
        conn.execute("SELECT wal_enqueue(%s, '{}'::jsonb, 'by-writer')", (TOPIC,))
        assert conn.execute("SELECT idempotency_key FROM wal_delivery.my_records").fetchall() == \
            [("by-writer",)]
