"""The record contract at the ingest door: raw HTTP bytes on a socket (no client library to
clean them), the same request to a plain topic (Kafka path) and to a topic that needs
processing (outbox path). Each request gets one answer, the same on both paths, always
valid JSON naming the field at fault, and a refused record is stored on neither path.
Real Postgres, real Kafka, real HTTP."""
import json
import socket
import uuid

import psycopg
import pytest

from conftest import connect
from ingest_helpers import running_ingest, send_record, topics_with_token
from relay_helpers import read_topic, wait_until


@pytest.fixture
def ingest(tmp_path, kafka_bootstrap):
    with running_ingest(tmp_path, kafka_bootstrap) as worker:
        yield worker


@pytest.fixture
def topics(ingest, unique):
    with connect() as conn:
        (plain, proc), token = topics_with_token(conn, unique, processing=True)
    wait_until(lambda: send_record(ingest.port, plain, token, ikey="ready")[0] == 201, 30,
               what="the new topics in the ingest's config")
    return plain, proc, token


def raw_request(port, head_lines, body=b""):
    """Sends one request as raw bytes; returns (status, body bytes, headers) or (None, b"", {})
    when the server closed without an answer."""
    request = b"\r\n".join(head_lines + [b"Content-Length: %d" % len(body), b"", b""]) + body
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(request)
        data = b""
        while True:
            head_end = data.find(b"\r\n\r\n")
            if head_end >= 0:
                head = data[:head_end].decode("latin-1").split("\r\n")
                headers = {k.lower(): v.strip() for k, v in (h.split(":", 1) for h in head[1:])}
                length = int(headers.get("content-length", "0"))
                if len(data) >= head_end + 4 + length:
                    return int(head[0].split()[1]), data[head_end + 4:head_end + 4 + length], headers
            chunk = s.recv(65536)
            if not chunk:
                return None, b"", {}
            data += chunk


def post_raw(port, topic, token, extra, body=b"{}", path="records"):
    lines = [b"POST /v1/topics/%s/%s HTTP/1.1" % (topic.encode(), path.encode()),
             b"Host: 127.0.0.1", b"Authorization: Bearer " + token.encode()] + extra
    return raw_request(port, lines, body)


def answer_json(status, body):
    assert status is not None, "the server closed the connection without an answer"
    return json.loads(body.decode("utf-8"))  # strict: the answer must be UTF-8 JSON


def outbox_count(topic):
    with connect() as conn:
        return conn.execute("SELECT count(*) FROM wal_delivery.outbox WHERE topic = %s",
                            (topic,)).fetchone()[0]


def kafka_keys(bootstrap, topic, marker):
    return set(read_topic(bootstrap, topic, [marker], timeout=30))


# Requests the contract refuses: (what, extra header lines, body, field named).
REFUSED = [
    ("content type not ASCII", [b"Content-Type: text/plain; name=\xc3\xa9"], b"x", "content_type"),
    ("content type with bytes that are not UTF-8", [b"Content-Type: text/\xff"], b"x", "content_type"),
    ("message key not UTF-8", [b"X-Wal-Key: k\xff\xfe"], b"{}", "key"),
    ("header value not UTF-8", [b"X-Wal-Header-obs: v\xff\xfe"], b"{}", "headers"),
    ("idempotency key not UTF-8", [b"Idempotency-Key: k\xff\xfe"], b"{}", "idempotency_key"),
    ("idempotency key with a tab", [b"Idempotency-Key: a\tb"], b"{}", "idempotency_key"),
    ("header value with a tab", [b"X-Wal-Header-t: a\tb"], b"{}", "headers"),
    ("header given twice in two cases", [b"X-Wal-Header-Trace: a", b"X-Wal-Header-trace: b"], b"{}",
     "headers"),
    ("reserved header", [b"X-Wal-Header-Outbox-Id: 1"], b"{}", "headers"),
    ("idempotency key over 200 bytes", [b"Idempotency-Key: " + b"k" * 201], b"{}", "idempotency_key"),
    ("message key over 1024 bytes", [b"X-Wal-Key: " + b"k" * 1025], b"{}", "key"),
    ("65 headers", [b"X-Wal-Header-h%d: v" % i for i in range(65)], b"{}", "headers"),
]


@pytest.mark.parametrize("what,extra,body,field", REFUSED, ids=[r[0] for r in REFUSED])
def test_a_refused_record_gets_the_same_json_answer_on_both_paths_and_is_stored_on_neither(
        ingest, topics, kafka_bootstrap, what, extra, body, field):
    plain, proc, token = topics
    answers = []
    for topic in (plain, proc):
        status, raw, headers = post_raw(ingest.port, topic, token, extra, body)
        answer = answer_json(status, raw)
        # A count over a limit is 413 (SQLSTATE 54000 at the SQL door); the rest 400.
        expect = (413, "too_large") if what == "65 headers" else (400, "bad_record")
        assert (status, answer["error"]) == expect, (topic, answer)
        assert answer["field"] == field, answer
        answers.append((status, answer["error"], answer["field"], answer["message"]))
    assert answers[0] == answers[1], "the two paths answered differently"
    # Stored on neither path: only the marker sent after it is there.
    marker = "marker-" + uuid.uuid4().hex
    assert send_record(ingest.port, plain, token, ikey=marker)[0] == 201
    assert kafka_keys(kafka_bootstrap, plain, marker) == {"ready", marker}
    assert outbox_count(proc) == 0


def test_text_that_is_valid_utf8_travels_byte_for_byte_on_both_paths(ingest, topics, kafka_bootstrap):
    plain, proc, token = topics
    key = "caf\u00e9-\u65e5\u672c-" + uuid.uuid4().hex[:6]
    extra = [b"Idempotency-Key: " + key.encode(), b"X-Wal-Key: cl\xc3\xa9",
             b"X-Wal-Header-Note: na\xc3\xafve \xe2\x9c\x93", b"Content-Type: text/plain; charset=utf-8"]
    for topic, expect in ((plain, 201), (proc, 202)):
        status, raw, headers = post_raw(ingest.port, topic, token, extra, b"payload")
        answer = answer_json(status, raw)
        assert status == expect, answer
        assert answer["idempotency_key"] == key
    got = read_topic(kafka_bootstrap, plain, [key])[key][0]
    assert got["key"] == "cl\u00e9".encode() and got["headers"]["note"] == "na\u00efve \u2713"
    with connect() as conn:
        row = conn.execute("SELECT idempotency_key, message_key, headers->>'note', content_type"
                           " FROM wal_delivery.outbox WHERE topic = %s", (proc,)).fetchone()
    assert row == (key, "cl\u00e9", "na\u00efve \u2713", "text/plain; charset=utf-8")


BATCH_REFUSED = [
    ("NUL in the idempotency key", b'{"value": 1, "idempotency_key": "k\\u0000A"}', "line"),
    ("NUL in a header value", b'{"value": 1, "headers": {"h": "a\\u0000b"}}', "line"),
    ("NUL in the message key", b'{"value": 1, "key": "k\\u0000"}', "line"),
    ("bytes that are not UTF-8", b'{"value": 1, "idempotency_key": "\xff\xfe"}', "line"),
    ("content type not ASCII", b'{"value": 1, "content_type": "text/\xc3\xa9"}', "content_type"),
    ("headers twice in two cases", b'{"value": 1, "headers": {"A": "1", "a": "2"}}', "headers"),
    ("a control character in the key", b'{"value": 1, "idempotency_key": "a\\nb"}', "idempotency_key"),
]


@pytest.mark.parametrize("what,line,field", BATCH_REFUSED, ids=[r[0] for r in BATCH_REFUSED])
def test_a_batch_line_the_contract_refuses_gets_one_json_answer_on_both_paths(
        ingest, topics, what, line, field):
    plain, proc, token = topics
    answers = []
    for topic in (plain, proc):
        good = b'{"value": 1, "idempotency_key": "good-%s"}' % uuid.uuid4().hex.encode()
        status, raw, _ = post_raw(ingest.port, topic, token, [b"Content-Type: application/x-ndjson"],
                                  good + b"\n" + line + b"\n", path="batch")
        answer = answer_json(status, raw)
        assert status == 400 and answer["field"] == field, answer
        assert answer["message"].startswith("line 2: "), answer
        answers.append((answer["error"], answer["field"], answer["message"]))
    assert answers[0] == answers[1]
    assert outbox_count(proc) == 0  # the whole batch is refused, the good line too


def test_the_sql_door_refuses_what_the_ingest_door_refuses():
    """The same rule at the SQL door: header names that differ only in case, a content
    type the contract refuses (ingest_enqueue_batch), with their SQLSTATEs."""
    with connect() as conn:
        conn.execute("INSERT INTO wal_delivery.topics (name) VALUES ('contract.sql')"
                     " ON CONFLICT DO NOTHING")
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="given twice"):
            conn.execute("""SELECT wal_enqueue('contract.sql', '{}'::jsonb,
                            headers => '{"Trace": "a", "trace": "b"}')""")
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="printable ASCII"):
            conn.execute("SELECT wal_delivery.ingest_enqueue_batch('contract.sql', %s,"
                         " ARRAY['\\x00'::bytea], ARRAY['k'], ARRAY[NULL], ARRAY[NULL]::jsonb[])",
                         ("text/plain; name=\u00e9",))


def test_a_key_repeated_with_a_different_record_is_409_on_the_outbox_path(ingest, topics):
    """The outbox door knows every key of a topic: the same record again is the same
    record (202, same id); a different record under the key is 409, not a silent 202 that
    would lose it. (The direct Kafka path does not look keys up: destinations dedupe.)"""
    plain, proc, token = topics
    key = "conflict-" + uuid.uuid4().hex[:8]
    first = post_raw(ingest.port, proc, token, [b"Idempotency-Key: " + key.encode()], b"A")
    again = post_raw(ingest.port, proc, token, [b"Idempotency-Key: " + key.encode()], b"A")
    other = post_raw(ingest.port, proc, token, [b"Idempotency-Key: " + key.encode()], b"B")
    assert first[0] == again[0] == 202
    assert answer_json(*first[:2])["outbox_id"] == answer_json(*again[:2])["outbox_id"]
    answer = answer_json(*other[:2])
    assert other[0] == 409 and answer["error"] == "idempotency_key_conflict", answer
    with connect() as conn:
        assert conn.execute("SELECT convert_from(payload, 'UTF8') FROM wal_delivery.outbox"
                            " WHERE topic = %s AND idempotency_key = %s", (proc, key)).fetchall() == [("A",)]


def test_a_topic_whose_writers_leave_out_the_ingest_login_is_403_on_both_paths(ingest, topics):
    from consumer_helpers import wait_published
    plain, proc, token = topics
    with connect() as conn:
        conn.execute("DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tenant_a')"
                     " THEN CREATE ROLE tenant_a; END IF; END $$")
        conn.execute("UPDATE wal_delivery.topics SET writers = ARRAY['tenant_a']::regrole[]"
                     " WHERE name IN (%s, %s)", (plain, proc))
        wait_published(conn)
    for topic in (plain, proc):
        status, raw, _ = (None, b"", {})
        for _ in range(100):  # until the ingest follows the new config version
            status, raw, _ = post_raw(ingest.port, topic, token, [], b"{}")
            if status != 201:
                break
        answer = answer_json(status, raw)
        assert status == 403 and answer["error"] == "forbidden", (topic, answer)
    assert outbox_count(proc) == 0
