"""Dead-letter archival to S3 against a real S3-compatible server (moto's, which checks
every request's SigV4 signature): objects hold every field needed to replay, are read
back with an independent client (boto3) and restored; failures (unreachable, wrong keys,
missing bucket, a 5xx or a killed server halfway) mark nothing that S3 did not confirm;
statement_timeout cancels a stalled upload; pg_cron runs the job."""
import base64
import gzip
import json
import re
import signal
import threading
import time
import uuid

import psycopg
import pytest

from conftest import connect, needs_pg_cron
from relay_helpers import ensure_extension, wait_until
from s3_helpers import FaultyRelay, S3Server, SelfSignedHttps, free_port

PREFIX = "archtest"
KEY_RE = re.compile(r"^archtest/(\d{4}/\d{2}/\d{2})/dead-letters-(\d+)-(\d+)\.ndjson\.gz$")
# Bookkeeping columns that are not part of an archive entry.
NOT_ARCHIVED = {"archived_at", "archive_object", "restored_at"}


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("s3"))
    yield server
    server.stop()


def configure(conn, endpoint, bucket, **settings):
    values = {"archive_s3_endpoint": endpoint, "archive_s3_bucket": bucket,
              "archive_s3_prefix": PREFIX, "archive_s3_path_style": True,
              "archive_s3_allow_http": True, "archive_batch_rows": 10000,
              "archive_keeps_rows": False, "archive_s3_timeout": "2 minutes",
              "dead_letter_archive_after": "10 days", "archive_batch_bytes": 67108864,
              "archive_max_run_time": "30 minutes", **settings}
    sets = ", ".join(f"{k} = %s" for k in values)
    conn.execute(f"UPDATE wal_delivery.settings SET {sets}", list(values.values()))


@pytest.fixture
def bucket(s3, unique):
    """A fresh bucket, archival configured for it with the server's keys."""
    name = f"dl-{unique}"
    s3.client().create_bucket(Bucket=name)
    ensure_extension()
    with connect() as conn:
        conn.execute("DELETE FROM wal_delivery.dead_letters WHERE topic LIKE 'archtest.%'")
        conn.execute("DELETE FROM wal_delivery.archive_credentials")
        conn.execute("INSERT INTO wal_delivery.archive_credentials (access_key_id, secret_access_key)"
                     " VALUES (%s, %s)", (s3.access_key_id, s3.secret_access_key))
        configure(conn, s3.endpoint, name)
    yield name
    with connect() as conn:
        conn.execute("DELETE FROM wal_delivery.dead_letters WHERE topic LIKE 'archtest.%'")
        conn.execute("DELETE FROM wal_delivery.archive_credentials")
        conn.execute("UPDATE wal_delivery.settings SET archive_s3_endpoint = NULL, archive_s3_bucket = NULL,"
                     " archive_s3_allow_http = false, archive_keeps_rows = false")


def add_dead_letters(conn, topic, count, age="11 days", resolved=False):
    """count dead letters that failed `age` ago, with every optional field filled and a
    binary payload (bytes that are not UTF-8 included); returns their ids."""
    rows = conn.execute(
        """INSERT INTO wal_delivery.dead_letters
               (origin, topic, idempotency_key, destination, outbox_id, message_key, headers,
                content_type, payload, attempts, last_error, failed_at, resolved_at, resolution,
                kafka_topic, kafka_partition, kafka_offset)
           SELECT 'delivery', %(topic)s, %(topic)s || '-key-' || %(batch)s || '-' || i, 'dest-' || (i %% 3), 1000 + i,
                  'msg-' || i, jsonb_build_object('x-trace', 'tr-' || i, 'x-quote', 'a"b\\c'),
                  'application/octet-stream',
                  decode(md5(i::text), 'hex') || '\\x00ff0a0d'::bytea || convert_to('é €' || i, 'UTF8'),
                  i %% 5 + 1, 'HTTP 400: bad "thing"' || E'\\n' || 'line ' || i,
                  now() - %(age)s::interval - i * interval '1 second',
                  CASE WHEN %(resolved)s THEN now() END, CASE WHEN %(resolved)s THEN 'handled' END,
                  'wal_delivery.dlq', i %% 2, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint + i
             FROM generate_series(1, %(count)s) i
           RETURNING id""", {"topic": topic, "count": count, "age": age, "resolved": resolved,
                             "batch": uuid.uuid4().hex[:8]}).fetchall()
    return [r[0] for r in rows]


def snapshot(conn, topic):
    """{id: (every column as JSON, payload bytes)} for topic's dead letters."""
    rows = conn.execute("SELECT id, to_jsonb(d) - 'payload', payload FROM wal_delivery.dead_letters d"
                        " WHERE topic = %s", (topic,)).fetchall()
    return {r[0]: (r[1], bytes(r[2])) for r in rows}


def download(s3, bucket):
    """{key: [entries]} of every object in bucket, read with boto3."""
    client = s3.client()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    out = {}
    for key in keys:
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        out[key] = [json.loads(line) for line in gzip.decompress(body).decode().splitlines()]
    return out


def archive(conn):
    return conn.execute("CALL wal_delivery.archive_dead_letters()").fetchone()[0]


def test_archive_has_every_field_and_restore_brings_entries_back_for_replay(s3, bucket, db, unique):
    topic = f"archtest.{unique}"
    old = add_dead_letters(db, topic, 25)
    recent = add_dead_letters(db, topic, 3, age="1 day")
    resolved = add_dead_letters(db, topic, 2, resolved=True)
    before = snapshot(db, topic)
    db.execute("UPDATE wal_delivery.settings SET archive_batch_rows = 10")

    summary = archive(db)

    assert summary["finished"] is True
    assert (summary["batches"], summary["archived"]) == (3, 25)
    objects = download(s3, bucket)
    assert sorted(objects) == sorted(summary["objects"])
    archived_ids = []
    for key, entries in objects.items():
        day, first, last = KEY_RE.match(key).groups()
        ids = [e["id"] for e in entries]
        assert (int(first), int(last)) == (ids[0], ids[-1]) and ids == sorted(ids)
        assert day == entries[0]["failed_at"][:10].replace("-", "/")
        archived_ids += ids
        for e in entries:
            columns, payload = before[e["id"]]
            assert e["archive_format"] == 1
            assert base64.b64decode(e["payload_base64"]) == payload
            fields = {k: v for k, v in e.items()
                      if k not in NOT_ARCHIVED | {"archive_format", "payload_base64"}}
            assert fields == {k: v for k, v in columns.items() if k not in NOT_ARCHIVED}
    assert sorted(archived_ids) == sorted(old), "every old unresolved entry, each once"
    # archive_objects names each confirmed object with its day and ids (the console's
    # archive page), so on-call finds a day's object without listing the bucket.
    listed = {r[0]: r[1:] for r in db.execute(
        "SELECT object, to_char(day, 'YYYY/MM/DD'), first_id, last_id, entries"
        " FROM wal_delivery.archive_objects WHERE object = ANY(%s)", (list(objects),))}
    assert listed == {key: (KEY_RE.match(key).group(1), entries[0]["id"], entries[-1]["id"], len(entries))
                      for key, entries in objects.items()}
    # Deleted after the upload (the default); newer and resolved entries stay, unarchived.
    assert set(snapshot(db, topic)) == set(recent + resolved)

    for key, entries in objects.items():
        got = db.execute("SELECT * FROM wal_delivery.restore_dead_letters(%s)", (key,)).fetchone()
        assert got == (len(entries), 0, 0)
        again = db.execute("SELECT * FROM wal_delivery.restore_dead_letters(%s)", (key,)).fetchone()
        assert again == (0, 0, len(entries)), "a second restore adds nothing"

    after = snapshot(db, topic)
    assert set(after) == set(before)
    for i in old:
        columns, payload = after[i]
        assert payload == before[i][1]
        assert columns["restored_at"] is not None and columns["resolved_at"] is None
        assert {k: v for k, v in columns.items() if k not in NOT_ARCHIVED} == \
            {k: v for k, v in before[i][0].items() if k not in NOT_ARCHIVED}
    # Back among the unresolved for on-call to replay, and not archived again at once.
    unresolved = {r[0] for r in db.execute(
        "SELECT id FROM wal_delivery.unresolved_dead_letters WHERE topic = %s", (topic,))}
    assert set(old) <= unresolved
    assert archive(db)["archived"] == 0


def test_a_retried_run_writes_the_same_objects_and_kept_rows_point_at_them(s3, bucket, db, unique):
    topic = f"archtest.{unique}"
    ids = add_dead_letters(db, topic, 12)
    db.execute("UPDATE wal_delivery.settings SET archive_keeps_rows = true, archive_batch_rows = 5")

    first = archive(db)
    assert (first["batches"], first["archived"]) == (3, 12)
    objects = download(s3, bucket)
    marks = dict(db.execute("SELECT id, archive_object FROM wal_delivery.dead_letters"
                            " WHERE topic = %s AND archived_at IS NOT NULL", (topic,)).fetchall())
    assert set(marks) == set(ids)
    for i, key in marks.items():
        assert i in [e["id"] for e in objects[key]], "each kept row names the object holding it"
    etags = {o["Key"]: o["ETag"] for o in s3.client().list_objects_v2(Bucket=bucket)["Contents"]}

    # As if the marks had been lost after the uploads: the rerun overwrites, never adds.
    db.execute("UPDATE wal_delivery.dead_letters SET archived_at = NULL, archive_object = NULL"
               " WHERE topic = %s", (topic,))
    second = archive(db)
    assert sorted(second["objects"]) == sorted(first["objects"])
    listing = s3.client().list_objects_v2(Bucket=bucket)["Contents"]
    assert {o["Key"]: o["ETag"] for o in listing} == etags, "same keys, same bytes"

    # Restoring an object whose rows were kept makes them live again, once.
    key = first["objects"][0]
    assert db.execute("SELECT * FROM wal_delivery.restore_dead_letters(%s)", (key,)).fetchone() == (0, 5, 0)
    assert db.execute("SELECT * FROM wal_delivery.restore_dead_letters(%s)", (key,)).fetchone() == (0, 0, 5)
    assert db.execute("SELECT count(*) FROM wal_delivery.dead_letters WHERE topic = %s", (topic,)).fetchone()[0] == 12


def test_virtual_host_addressing(s3, bucket, db, unique):
    topic = f"archtest.{unique}"
    add_dead_letters(db, topic, 2)
    # bucket.localhost resolves to the loopback address without DNS.
    configure(db, f"http://localhost:{s3.port}", bucket, archive_s3_path_style=False)
    summary = archive(db)
    assert summary["archived"] == 2
    assert list(download(s3, bucket)) == summary["objects"]


@pytest.mark.parametrize("path_style", [True, False], ids=["path style", "virtual-host style"])
@pytest.mark.parametrize("prefix", [".", "..", "./dl", "dl/..", "a/./b", "a/../b", "../other-bucket"])
def test_a_prefix_with_a_dot_segment_is_refused_and_nothing_leaves(s3, bucket, db, unique, path_style, prefix):
    """libcurl would resolve "." and ".." before sending: the object would land under
    another key, with path style even in another bucket. The setting refuses them (23514);
    a key that has one anyway is refused at the request (22023), in both styles."""
    topic = f"archtest.{unique}"
    add_dead_letters(db, topic, 2)
    endpoint = s3.endpoint if path_style else f"http://localhost:{s3.port}"
    configure(db, endpoint, bucket, archive_s3_path_style=path_style)
    state, message, hint = error_of(db, f"UPDATE wal_delivery.settings SET archive_s3_prefix = '{prefix}'")
    assert state == "23514" and message.startswith("archive_s3_prefix must"), message
    assert '"."' in message and '".."' in message
    assert db.execute("SELECT archive_s3_prefix FROM wal_delivery.settings").fetchone()[0] == PREFIX
    # Names with dots that are not whole segments are fine.
    db.execute("UPDATE wal_delivery.settings SET archive_s3_prefix = 'dl.v1/..x/x..'")
    db.execute(f"UPDATE wal_delivery.settings SET archive_s3_prefix = '{PREFIX}'")

    key = f"{PREFIX}/{prefix}/dead-letters-1-2.ndjson.gz"
    state, message, hint = error_of(db, f"SELECT * FROM wal_delivery.restore_dead_letters('{key}')")
    assert state == "22023" and "path segment" in message, message
    assert archive(db)["archived"] == 2, "the setting unchanged, archival goes on"
    assert all(k.startswith(f"{PREFIX}/") for k in download(s3, bucket))


def error_of(conn, sql):
    with pytest.raises(psycopg.Error) as err:
        conn.execute(sql)
    return err.value.sqlstate, err.value.diag.message_primary, err.value.diag.message_hint or ""


def unarchived(conn, topic):
    return conn.execute("SELECT count(*) FROM wal_delivery.dead_letters WHERE topic = %s"
                        " AND archived_at IS NULL", (topic,)).fetchone()[0]


def test_unreachable_wrong_keys_and_missing_bucket_are_named_and_mark_nothing(s3, bucket, db, unique):
    topic = f"archtest.{unique}"
    add_dead_letters(db, topic, 4)
    db.execute("UPDATE wal_delivery.settings SET archive_keeps_rows = true")

    closed = f"http://127.0.0.1:{free_port()}"
    configure(db, closed, bucket, archive_keeps_rows=True)
    state, message, hint = error_of(db, "CALL wal_delivery.archive_dead_letters()")
    assert state == "08006" and message.startswith(f"could not reach the S3 endpoint {closed}")
    assert "archive_s3_endpoint" in hint
    assert unarchived(db, topic) == 4

    configure(db, s3.endpoint, bucket, archive_keeps_rows=True)
    db.execute("UPDATE wal_delivery.archive_credentials SET secret_access_key = 'not-the-secret'")
    state, message, hint = error_of(db, "CALL wal_delivery.archive_dead_letters()")
    assert (state, message) == ("28000", f'S3 refused the credentials for bucket "{bucket}": HTTP 403 SignatureDoesNotMatch')
    assert "archive_credentials" in hint
    assert unarchived(db, topic) == 4
    db.execute("UPDATE wal_delivery.archive_credentials SET secret_access_key = %s", (s3.secret_access_key,))

    # A session token S3 does not know is a credential error like the others.
    db.execute("UPDATE wal_delivery.archive_credentials SET session_token = 'not-a-session-token'")
    state, message, hint = error_of(db, "CALL wal_delivery.archive_dead_letters()")
    assert state == "28000" and message.startswith(f'S3 refused the credentials for bucket "{bucket}"'), message
    assert "session token" in hint
    assert unarchived(db, topic) == 4
    db.execute("UPDATE wal_delivery.archive_credentials SET session_token = NULL")

    configure(db, s3.endpoint, "no-such-bucket", archive_keeps_rows=True)
    state, message, hint = error_of(db, "CALL wal_delivery.archive_dead_letters()")
    assert (state, message) == ("42704", f'S3 bucket "no-such-bucket" does not exist at {s3.endpoint}')
    assert unarchived(db, topic) == 4
    state, message, _ = error_of(db, "SELECT * FROM wal_delivery.restore_dead_letters('archtest/none.ndjson.gz')")
    assert state == "42704"

    configure(db, s3.endpoint, bucket, archive_keeps_rows=True)
    state, message, _ = error_of(db, "SELECT * FROM wal_delivery.restore_dead_letters('archtest/none.ndjson.gz')")
    assert (state, message) == ("42704", f'archive object "archtest/none.ndjson.gz" does not exist in bucket "{bucket}"')
    assert archive(db)["archived"] == 4, "the next run, with the problem fixed, archives them"
    assert download(s3, bucket)


def check_marks_match_objects(conn, topic, objects):
    """Every row marked archived is in the object it names; returns how many are marked."""
    marks = conn.execute("SELECT id, archive_object FROM wal_delivery.dead_letters"
                         " WHERE topic = %s AND archived_at IS NOT NULL", (topic,)).fetchall()
    for i, key in marks:
        assert key in objects, f"row {i} marked archived in {key}, which S3 does not have"
        assert i in [e["id"] for e in objects[key]]
    return len(marks)


def test_a_5xx_halfway_keeps_the_confirmed_batches_and_the_next_run_finishes(s3, bucket, db, unique):
    topic = f"archtest.{unique}"
    add_dead_letters(db, topic, 10)
    relay = FaultyRelay(s3.port, fail_puts={2})
    try:
        configure(db, relay.endpoint, bucket, archive_keeps_rows=True, archive_batch_rows=4)
        state, message, hint = error_of(db, "CALL wal_delivery.archive_dead_letters()")
        assert state == "38000" and "HTTP 503" in message and "SlowDown" in message
        objects = download(s3, bucket)
        assert len(objects) == 1, "the first batch was confirmed and committed"
        assert check_marks_match_objects(db, topic, objects) == 4

        summary = archive(db)
        assert (summary["archived"], summary["batches"]) == (6, 2)
        objects = download(s3, bucket)
        assert len(objects) == 3
        assert check_marks_match_objects(db, topic, objects) == 10
    finally:
        relay.stop()


def test_killing_the_server_mid_run_marks_only_what_it_confirmed(tmp_path, s3, bucket, db, unique):
    topic = f"archtest.{unique}"
    add_dead_letters(db, topic, 9)
    doomed = S3Server(tmp_path)
    relay = FaultyRelay(doomed.port, stall_puts={2}, stall_seconds=3)
    try:
        doomed.client().create_bucket(Bucket="doomed")
        db.execute("DELETE FROM wal_delivery.archive_credentials")
        db.execute("INSERT INTO wal_delivery.archive_credentials (access_key_id, secret_access_key)"
                   " VALUES (%s, %s)", (doomed.access_key_id, doomed.secret_access_key))
        configure(db, relay.endpoint, "doomed", archive_keeps_rows=True, archive_batch_rows=3)
        failure = {}

        def run():
            with connect() as conn:
                try:
                    conn.execute("CALL wal_delivery.archive_dead_letters()")
                except psycopg.Error as e:
                    failure["state"] = e.sqlstate
        runner = threading.Thread(target=run)
        runner.start()
        wait_until(lambda: relay.puts >= 2, 30, what="the second upload")
        confirmed = download(doomed, "doomed")
        doomed.proc.send_signal(signal.SIGKILL)
        doomed.proc.wait()
        runner.join(60)
        assert failure.get("state") == "08006", "the run fails on the lost server"
        assert len(confirmed) == 1
        assert check_marks_match_objects(db, topic, confirmed) == 3
    finally:
        relay.stop()
        doomed.stop()
    # The next run, against a working server, archives the rest.
    db.execute("UPDATE wal_delivery.archive_credentials SET access_key_id = %s, secret_access_key = %s",
               (s3.access_key_id, s3.secret_access_key))
    configure(db, s3.endpoint, bucket, archive_keeps_rows=True, archive_batch_rows=3)
    assert archive(db)["archived"] == 6
    assert unarchived(db, topic) == 0


def test_statement_timeout_and_archive_timeout_stop_a_stalled_upload(s3, bucket, db, unique):
    topic = f"archtest.{unique}"
    add_dead_letters(db, topic, 3)
    relay = FaultyRelay(s3.port, stall_puts={1, 2}, stall_seconds=30)
    try:
        configure(db, relay.endpoint, bucket)
        db.execute("SET statement_timeout = '2s'")
        started = time.monotonic()
        state, message, _ = error_of(db, "SELECT wal_delivery.archive_dead_letter_batch()")
        assert (state, message) == ("57014", "canceling statement due to statement timeout")
        assert time.monotonic() - started < 8, "cancelled within the progress callback's second"
        db.execute("RESET statement_timeout")
        assert unarchived(db, topic) == 3

        configure(db, relay.endpoint, bucket, archive_s3_timeout="1 second")
        state, message, hint = error_of(db, "SELECT wal_delivery.archive_dead_letter_batch()")
        assert state == "08006" and "timed out after 1000 ms" in message and "archive_s3_timeout" in hint
        assert unarchived(db, topic) == 3
    finally:
        relay.stop()


@needs_pg_cron
def test_pg_cron_runs_the_archive_job(s3, bucket, db, unique):
    topic = f"archtest.{unique}"
    add_dead_letters(db, topic, 5)
    db.execute("CREATE EXTENSION IF NOT EXISTS pg_cron")
    job = db.execute("SELECT wal_delivery.schedule_dead_letter_archival('* * * * *')").fetchone()[0]
    try:
        # pg_cron starts jobs on the minute.
        run = wait_until(lambda: db.execute(
            "SELECT status, return_message FROM cron.job_run_details WHERE jobid = %s"
            " AND status IN ('succeeded', 'failed') ORDER BY runid DESC LIMIT 1", (job,)).fetchone(),
            100, interval=1, what="a finished run of the archive job")
        assert run[0] == "succeeded", run
        assert db.execute("SELECT count(*) FROM wal_delivery.dead_letters WHERE topic = %s",
                          (topic,)).fetchone()[0] == 0
        entries = [e for es in download(s3, bucket).values() for e in es]
        assert sorted(e["topic"] for e in entries) == [topic] * 5
        command = db.execute("SELECT command FROM cron.job WHERE jobid = %s", (job,)).fetchone()[0]
        assert command == "CALL wal_delivery.archive_dead_letters()"
    finally:
        db.execute("SELECT cron.unschedule(%s)", (job,))


def test_batches_are_bounded_in_rows_bytes_and_run_time(s3, bucket, db, unique):
    topic = f"archtest.{unique}"
    add_dead_letters(db, topic, 7)
    # Each entry is over 512 bytes: 1 kB holds one, well under the row limit.
    configure(db, s3.endpoint, bucket, archive_batch_rows=5, archive_batch_bytes=1024)
    first = db.execute("SELECT wal_delivery.archive_dead_letter_batch()").fetchone()[0]
    assert first["rows"] == 1 and 512 < first["bytes"] <= 1024
    configure(db, s3.endpoint, bucket, archive_batch_rows=2, archive_max_run_time="1 millisecond")
    summary = archive(db)
    assert (summary["finished"], summary["reason"], summary["batches"], summary["archived"]) == \
        (False, "archive_max_run_time", 1, 2), "one batch, then the run stops"
    configure(db, s3.endpoint, bucket, archive_batch_rows=2)
    summary = archive(db)
    assert (summary["finished"], summary["archived"]) == (True, 4), "the next run goes on"
    objects = download(s3, bucket)
    assert sorted(len(entries) for entries in objects.values()) == [1, 2, 2, 2]
    assert db.execute("SELECT count(*) FROM wal_delivery.dead_letters WHERE topic = %s",
                      (topic,)).fetchone()[0] == 0


def test_pg_cancel_backend_stops_a_stalled_upload(s3, bucket, db, unique):
    topic = f"archtest.{unique}"
    add_dead_letters(db, topic, 2)
    relay = FaultyRelay(s3.port, stall_puts={1}, stall_seconds=30)
    try:
        configure(db, relay.endpoint, bucket)
        pid = db.execute("SELECT pg_backend_pid()").fetchone()[0]

        def cancel_when_uploading():
            wait_until(lambda: relay.puts >= 1, 30, what="the upload")
            with connect() as other:
                other.execute("SELECT pg_cancel_backend(%s)", (pid,))
        canceller = threading.Thread(target=cancel_when_uploading)
        canceller.start()
        started = time.monotonic()
        state, message, _ = error_of(db, "CALL wal_delivery.archive_dead_letters()")
        canceller.join()
        assert (state, message) == ("57014", "canceling statement due to user request")
        assert time.monotonic() - started < 10
        assert unarchived(db, topic) == 2
        assert db.execute("SELECT 1").fetchone() == (1,), "the session goes on"
    finally:
        relay.stop()


def test_restore_takes_older_archives_and_refuses_what_is_not_one(s3, bucket, db, unique):
    topic = f"archtest.{unique}"
    (row_id,) = add_dead_letters(db, topic, 1)
    assert archive(db)["archived"] == 1
    (key,) = download(s3, bucket)
    entry = download(s3, bucket)[key][0]
    # An archive written before a column existed, with a key the table no longer has:
    # the missing column takes its default, the unknown key is ignored.
    missing = next(c for c in ("replays", "kafka_offset") if c in entry)
    older = {k: v for k, v in entry.items() if k != missing} | {"retired_column": "x"}
    client = s3.client()
    client.put_object(Bucket=bucket, Key="archtest/older.ndjson.gz",
                      Body=gzip.compress((json.dumps(older) + "\n").encode()))
    got = db.execute("SELECT * FROM wal_delivery.restore_dead_letters('archtest/older.ndjson.gz')").fetchone()
    assert got == (1, 0, 0)
    row = db.execute("SELECT payload, topic, idempotency_key FROM wal_delivery.dead_letters WHERE id = %s",
                     (row_id,)).fetchone()
    assert (bytes(row[0]), row[1], row[2]) == (base64.b64decode(entry["payload_base64"]), topic, entry["idempotency_key"])

    client.put_object(Bucket=bucket, Key="archtest/plain.txt", Body=b"not gzip")
    state, message, _ = error_of(db, "SELECT * FROM wal_delivery.restore_dead_letters('archtest/plain.txt')")
    assert state == "XX001" and message.startswith('archive object "archtest/plain.txt" is not valid gzip')
    client.put_object(Bucket=bucket, Key="archtest/other.ndjson.gz", Body=gzip.compress(b'{"hello": 1}\n'))
    state, message, _ = error_of(db, "SELECT * FROM wal_delivery.restore_dead_letters('archtest/other.ndjson.gz')")
    assert (state, message) == ("22000", "object archtest/other.ndjson.gz is not a dead-letter archive")


def test_https_certificates_are_verified(tmp_path, bucket, db, unique):
    topic = f"archtest.{unique}"
    add_dead_letters(db, topic, 2)
    untrusted = SelfSignedHttps(tmp_path)
    try:
        configure(db, untrusted.endpoint, bucket, archive_s3_allow_http=False)
        state, message, hint = error_of(db, "CALL wal_delivery.archive_dead_letters()")
        assert state == "08006"
        assert message.startswith(f"could not verify the TLS connection to the S3 endpoint {untrusted.endpoint}")
        assert "certificate" in hint
        assert untrusted.requests == 0, "no request went over the unverified connection"
        assert unarchived(db, topic) == 2
    finally:
        untrusted.stop()


def test_concurrent_runs_archive_disjoint_rows(s3, bucket, db, unique):
    topic = f"archtest.{unique}"
    ids = add_dead_letters(db, topic, 10)
    relay = FaultyRelay(s3.port, stall_puts={1}, stall_seconds=2)
    try:
        configure(db, relay.endpoint, bucket, archive_batch_rows=5, archive_keeps_rows=True)
        results = {}

        def run(name):
            with connect() as conn:
                results[name] = conn.execute("SELECT wal_delivery.archive_dead_letter_batch()").fetchone()[0]
        first = threading.Thread(target=run, args=("first",))
        first.start()
        wait_until(lambda: relay.puts >= 1, 30, what="the first upload")
        run("second")  # while the first holds its rows
        first.join(30)
        batches = sorted((r["first_id"], r["last_id"]) for r in results.values())
        assert batches == [(ids[0], ids[4]), (ids[5], ids[9])], "SKIP LOCKED: no row in two batches"
        objects = download(s3, bucket)
        assert len(objects) == 2
        assert check_marks_match_objects(db, topic, objects) == 10
    finally:
        relay.stop()
