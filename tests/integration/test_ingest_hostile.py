"""Hostile requests at `wal-worker ingest` that the framing and contract tests do not send:
batch values whose bytes a parse and re-encode would change (decimals, integers over 64
bits), a line with a key twice and value_base64 that a lax decoder reads as another
record, a body announced over the limit with Expect: 100-continue, and more idle
connections than systemd's default open-file limit. Each gets a clear JSON answer, and what is stored is exactly what was sent and accepted.
Real Postgres, real Kafka, the real worker on raw sockets."""
import json
import os
import resource
import socket
import time
import uuid

import pytest

from conftest import connect
from consumer_helpers import PEER_TOKEN
from ingest_helpers import Ingest, new_token, running_ingest, send_record, topics_with_token, kafka_records, outbox_rows
from relay_helpers import read_topic, wait_until


@pytest.fixture(scope="module")
def ingest(tmp_path_factory, kafka_bootstrap):
    """An ingest, a plain topic (Kafka path), a topic that needs processing (outbox path)
    and a token for both."""
    unique = uuid.uuid4().hex[:10]
    with running_ingest(tmp_path_factory.mktemp("ingest-hostile"), kafka_bootstrap) as worker:
        with connect() as conn:
            (worker.plain, worker.processed), worker.token = topics_with_token(conn, unique,
                                                                          processing=True)
        worker.bootstrap = kafka_bootstrap
        wait_until(lambda: send_record(worker.port, worker.plain, worker.token)[0] == 201, 30,
                   what="the direct path to the new topic")
        yield worker


def batch(ingest, topic, lines, extra=()):
    """(status, parsed answer) of one NDJSON batch sent as raw bytes."""
    body = b"\n".join(lines) + b"\n"
    head = [b"POST /v1/topics/%s/batch HTTP/1.1" % topic.encode(), b"Host: 127.0.0.1",
            b"Authorization: Bearer " + ingest.token.encode(), b"Connection: close",
            b"Content-Length: %d" % len(body), *extra]
    answer = exchange(ingest.port, b"\r\n".join(head) + b"\r\n\r\n" + body)
    status, _, payload = answer
    return status, json.loads(payload.decode("utf-8")) if payload else None


def exchange(port, data, timeout=30):
    """Sends data, reads until the server closes: (status, headers, body); status None
    when it closed without an answer."""
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    if not head:
        return None, {}, b""
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def stored(ingest):
    """(messages in the plain topic, rows of the processing topic in the outbox)."""
    return kafka_records(ingest.bootstrap, ingest.plain), outbox_rows(ingest.processed)


# ---------------------------------------------------------------- batch values as sent

# JSON a parse into doubles and 64-bit integers would change: each must be stored as sent.
VALUES = [b"19.99", b"0.1", b"12345678901234567890", b"-12345678901234567890123", b"1E2",
          b"-0", b"1.0", b'{"price": 10.10, "ids": [1.50, 2e-3]}', b'"caf\\u00e9 \\u2713"',
          b'[ 1 , {"a" : "b"} ]']


def test_a_batch_value_is_stored_byte_for_byte_on_both_paths(ingest):
    run = uuid.uuid4().hex[:8]
    keys = [f"value-{run}-{i}" for i in range(len(VALUES))]
    lines = [b'{"idempotency_key": "%s", "value": %s}' % (k.encode(), v) for k, v in zip(keys, VALUES)]
    status, answer = batch(ingest, ingest.plain, lines)
    assert status == 201 and answer["kafka"] == len(VALUES), answer
    # On the outbox path the same, with the value before the other keys and spaces around.
    lines = [b'{ "value" :  %s , "idempotency_key": "%s" }\r' % (v, k.encode()) for k, v in zip(keys, VALUES)]
    status, answer = batch(ingest, ingest.processed, lines)
    assert status == 202 and answer["outbox"] == len(VALUES), answer

    seen = read_topic(ingest.bootstrap, ingest.plain, keys)
    assert {k: seen[k][0]["value"] for k in keys} == dict(zip(keys, VALUES))
    with connect() as conn:
        rows = dict(conn.execute("SELECT idempotency_key, payload FROM wal_delivery.outbox"
                                 " WHERE topic = %s AND idempotency_key = ANY(%s)",
                                 (ingest.processed, keys)).fetchall())
    assert {k: bytes(v) for k, v in rows.items()} == dict(zip(keys, VALUES))


# ---------------------------------------------------------------- a key twice

TWICE = [
    ("value twice", b'{"value": 1, "value": 2}'),
    ("idempotency_key twice", b'{"value": 1, "idempotency_key": "a", "idempotency_key": "b"}'),
    ("a key twice inside the value", b'{"value": {"amount": 1, "amount": 1000}}'),
    ("value twice, once escaped", b'{"value": 1, "\\u0076alue": 2}'),
]


@pytest.mark.parametrize("what,line", TWICE, ids=[t[0] for t in TWICE])
def test_a_batch_line_with_a_key_twice_is_refused_and_nothing_is_stored(ingest, what, line):
    before = stored(ingest)
    for topic in (ingest.plain, ingest.processed):
        good = b'{"value": 1, "idempotency_key": "good-%s"}' % uuid.uuid4().hex.encode()
        status, answer = batch(ingest, topic, [good, line])
        assert status == 400 and answer["error"] == "bad_record" and answer["field"] == "line", answer
        assert answer["message"].startswith("line 2: ") and "duplicate" in answer["message"], answer
    assert stored(ingest) == before, "a line with a key twice, or the good line before it, was stored"


# ---------------------------------------------------------------- one key on two lines

def test_a_batch_with_one_idempotency_key_on_two_lines_is_refused_whole_on_both_paths(ingest):
    """Two records under one key: the direct path stored both and destinations, deduping
    on the key, dropped one; the outbox path stored the first and answered 409 for the
    second. Now the batch is refused whole, the same on both paths."""
    before = stored(ingest)
    key = "twice-" + uuid.uuid4().hex[:8]
    lines = [b'{"value": 1, "idempotency_key": "other-%s"}' % uuid.uuid4().hex.encode(),
             b'{"value": 1, "idempotency_key": "%s"}' % key.encode(), b"",
             b'{"value": 2, "idempotency_key": "%s"}' % key.encode()]
    for topic in (ingest.plain, ingest.processed):
        status, answer = batch(ingest, topic, lines)
        assert status == 400 and answer["field"] == "idempotency_key", answer
        assert answer["message"].startswith(f'line 4: idempotency key "{key}" is line 2\'s too'), answer
    assert stored(ingest) == before


def test_a_refusal_by_the_database_reads_as_its_message(ingest):
    """A record the outbox refuses (here a key already used for another record) is
    answered with Postgres's message as wal_enqueue raises it, not libpq's "ERROR:  "
    rendering of it."""
    key = "conflict-" + uuid.uuid4().hex[:8]
    assert batch(ingest, ingest.processed, [b'{"value": 1, "idempotency_key": "%s"}' % key.encode()])[0] == 202
    status, answer = batch(ingest, ingest.processed, [b'{"value": 2, "idempotency_key": "%s"}' % key.encode()])
    assert status == 409 and answer["records"][0]["error"] == "idempotency_key_conflict", answer
    message = answer["records"][0]["message"]
    assert message.startswith(f'idempotency key "{key}" of topic "{ingest.processed}"'), message


# ---------------------------------------------------------------- unknown members

UNKNOWN = [(b'{"value": 1, "idempotencyKey": "order-1"}', "idempotencyKey"),
           (b'{"value": 1, "headrs": {"a": "b"}}', "headrs"),
           (b'{"value_base64": "QQ==", "contentType": "text/plain"}', "contentType"),
           (b'{"value": 1, "": 2}', "")]


@pytest.mark.parametrize("line,member", UNKNOWN, ids=[u[1] or "empty name" for u in UNKNOWN])
def test_a_batch_line_with_an_unknown_member_is_refused_and_nothing_is_stored(ingest, line, member):
    """A misspelt idempotency_key was ignored: the record got a generated key, and every
    retry of it was stored again as another record."""
    before = stored(ingest)
    for topic in (ingest.plain, ingest.processed):
        status, answer = batch(ingest, topic, [line])
        assert status == 400 and answer["field"] == "line", answer
        assert f'unknown member "{member}"' in answer["message"], answer
    assert stored(ingest) == before


# ---------------------------------------------------------------- value_base64

NOT_BASE64 = ["QUJD=junk", "=QUJD", "QQ==QQ==", "QUJD====", "Q", "QUJDR", "QUI==", "QU JD",
              "QUJD\n", "QUJD-_"]


@pytest.mark.parametrize("text", NOT_BASE64)
def test_value_base64_that_is_not_base64_is_refused_and_nothing_is_stored(ingest, text):
    before = stored(ingest)
    for topic in (ingest.plain, ingest.processed):
        status, answer = batch(ingest, topic, [json.dumps({"value_base64": text}).encode()])
        assert status == 400 and answer["field"] == "value_base64", answer
        assert "not base64" in answer["message"], answer
    assert stored(ingest) == before


def test_value_base64_with_or_without_padding_is_stored_exactly(ingest):
    run = uuid.uuid4().hex[:8]
    cases = {"QUJD": b"ABC", "QUI=": b"AB", "QUI": b"AB", "QQ==": b"A", "QQ": b"A", "": b"",
             "/+8=": b"\xff\xef"}
    keys = {f"b64-{run}-{i}": (text, want) for i, (text, want) in enumerate(cases.items())}
    lines = [json.dumps({"value_base64": text, "idempotency_key": k}).encode()
             for k, (text, _) in keys.items()]
    status, answer = batch(ingest, ingest.plain, lines)
    assert status == 201 and answer["kafka"] == len(cases), answer
    seen = read_topic(ingest.bootstrap, ingest.plain, list(keys))
    assert {k: seen[k][0]["value"] for k in keys} == {k: want for k, (_, want) in keys.items()}


# ---------------------------------------------------------------- Expect: 100-continue

def expect_continue(ingest, length, auth=True):
    """A request that announces length bytes and waits for the go-ahead before sending
    them: (status line, answer, closed) of what came back within 5 s."""
    head = [b"POST /v1/topics/%s/records HTTP/1.1" % ingest.plain.encode(), b"Host: 127.0.0.1",
            b"Content-Type: application/octet-stream", b"Expect: 100-continue",
            b"Content-Length: %d" % length]
    if auth:
        head.append(b"Authorization: Bearer " + ingest.token.encode())
    received, closed = b"", False
    with socket.create_connection(("127.0.0.1", ingest.port), timeout=5) as s:
        s.sendall(b"\r\n".join(head) + b"\r\n\r\n")
        try:
            while not closed:
                chunk = s.recv(65536)
                closed = not chunk
                received += chunk
        except TimeoutError:
            pass
    status_line, _, rest = received.partition(b"\r\n")
    return status_line, rest.partition(b"\r\n\r\n")[2], closed


def test_expect_continue_gets_the_refusal_before_the_body(ingest):
    """Over the limit or unauthorized: the answer comes at once, in JSON, with no
    "100 Continue" first, and the connection is closed; the client never sends its body."""
    before = ingest.metric("wal_ingest_requests_total", status="413")
    status_line, body, closed = expect_continue(ingest, 100_000_000)
    assert status_line.startswith(b"HTTP/1.1 413 "), (status_line, body)
    answer = json.loads(body)
    assert answer["error"] == "too_large" and "Content-Length: 100000000" in answer["message"], answer
    assert closed
    assert ingest.metric("wal_ingest_requests_total", status="413") == before + 1

    status_line, body, closed = expect_continue(ingest, 1000, auth=False)
    assert status_line.startswith(b"HTTP/1.1 401 ") and closed, (status_line, body)
    assert json.loads(body)["error"] == "unauthorized"

    # Within the limit the client is told to go on.
    status_line, _, closed = expect_continue(ingest, 2)
    assert status_line == b"HTTP/1.1 100 Continue" and not closed


# ---------------------------------------------------------------- many idle connections

IDLE_CONNECTIONS = 3000


@pytest.fixture
def ingest_with_systemd_file_limit(ingest, tmp_path, kafka_bootstrap):
    """An ingest started as systemd starts services: 1024 open files, a higher hard limit."""
    worker = Ingest(tmp_path, kafka_bootstrap, wrapper=("prlimit", "--nofile=1024:20000", "--"))
    try:
        worker.wait_listening()
        worker.plain, worker.token = ingest.plain, ingest.token
        yield worker
    finally:
        worker.stop()


def test_idle_connections_beyond_1024_do_not_lock_out_other_clients(ingest_with_systemd_file_limit):
    """A client holding 3000 idle connections (a slowloris, or a load balancer's pool)
    under the default soft limit of 1024 files: accept() failed with EMFILE and every new
    client waited unanswered. The worker raises its soft limit for its connection limit."""
    worker = ingest_with_systemd_file_limit
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < IDLE_CONNECTIONS + 1000:
        pytest.skip(f"this test needs {IDLE_CONNECTIONS + 1000} open files, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (IDLE_CONNECTIONS + 1000, hard))
    idle = []
    try:
        for _ in range(IDLE_CONNECTIONS):
            idle.append(socket.create_connection(("127.0.0.1", worker.port), timeout=10))
        time.sleep(1)  # every one accepted, or refused by the file limit
        started = time.time()
        status, answer, _ = send_record(worker.port, worker.plain, worker.token)
        assert status == 201, answer
        assert time.time() - started < 10
    finally:
        for s in idle:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert "Too many open files" not in worker.output()


def test_an_open_file_limit_too_low_to_raise_is_logged_with_the_fix(ingest, tmp_path, kafka_bootstrap):
    worker = Ingest(tmp_path, kafka_bootstrap, wrapper=("prlimit", "--nofile=1024:1024", "--"))
    try:
        worker.wait_listening()
        assert send_record(worker.port, ingest.plain, ingest.token)[0] == 201
        line = next(line for line in worker.output().splitlines()
                    if "event=connection_limit_lowered" in line)
        assert "connections=512 open_files=1024" in line and "LimitNOFILE" in line, line
    finally:
        worker.stop()


# ---------------------------------------------------------------- the Authorization header

def with_authorization(port, path, value, method=b"POST"):
    body = b"{}" if method == b"POST" else b""
    head = [method + b" " + path + b" HTTP/1.1", b"Host: 127.0.0.1", b"Connection: close",
            b"Authorization: " + value, b"Content-Length: %d" % len(body)]
    return exchange(port, b"\r\n".join(head) + b"\r\n\r\n" + body)


def test_the_bearer_scheme_is_read_in_any_case_with_any_spaces(ingest):
    """RFC 9110: the scheme is case-insensitive and one space or more comes before the
    token. Clients that send "bearer" were answered 401 with a valid token."""
    path = f"/v1/topics/{ingest.plain}/records".encode()
    token = ingest.token.encode()
    for value in (b"bearer " + token, b"BEARER " + token, b"Bearer   " + token):
        status, _, body = with_authorization(ingest.port, path, value)
        assert status == 201, (value, body)
    for value in (b"Bearer", b"Bearer\t" + token, b"Bearer" + token, b"Basic " + token,
                  b"Bearer " + token + b"x"):
        status, _, body = with_authorization(ingest.port, path, value)
        assert status == 401 and json.loads(body)["error"] == "unauthorized", (value, body)
    # The admin port's /config reads the header the same way.
    peer = PEER_TOKEN.encode()
    assert with_authorization(ingest.admin_port, b"/config", b"bearer " + peer, b"GET")[0] == 200
    assert with_authorization(ingest.admin_port, b"/config", b"Bearer " + peer + b"x", b"GET")[0] == 401


# ---------------------------------------------------------------- methods

@pytest.mark.parametrize("method", [b"GET", b"PUT", b"DELETE", b"OPTIONS", b"PATCH"])
def test_a_method_a_path_does_not_take_is_405_with_allow(ingest, method):
    """RFC 9110 15.5.6: a 405 says in Allow which methods the path takes."""
    for path, allow in ((f"/v1/topics/{ingest.plain}/records".encode(), "POST"),
                        (f"/v1/topics/{ingest.plain}/batch".encode(), "POST"),
                        (b"/healthz", "GET, HEAD"), (b"/metrics", "GET, HEAD")):
        if method == b"GET" and allow != "POST":
            continue
        status, headers, body = with_authorization(ingest.port, path,
                                                   b"Bearer " + ingest.token.encode(), method)
        assert status == 405 and json.loads(body)["error"] == "method_not_allowed", (path, body)
        assert headers.get("allow") == allow, (path, headers)


# ---------------------------------------------------------------- bodies held in memory

BATCH_MAX = 16 * 1024 * 1024
BODIES_MAX = 256 * 1024 * 1024
# The sanitized stage (tests/run) runs this file against wal-worker built with ASan, whose
# allocator keeps freed memory in quarantine and pads every allocation: its resident set is
# not the worker's. The memory bound is checked in the plain build's run of the same test.
SANITIZED = "/sanitize/" in os.environ.get("WAL_WORKER_BIN", "")


def peak_rss_bytes(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def test_slow_uploads_over_the_bodies_limit_get_503_and_memory_stays_bounded(ingest):
    """20 uploads of a 16 MiB batch, each stopped one byte short (a slow client, or a
    hostile one): each request is bounded, but together they held 320 MiB, and a
    thousand of them would have had the worker killed for its memory. Past 256 MiB of
    bodies, a request is answered 503 busy with Retry-After; the others are unaffected,
    and once the uploads end, records are taken again."""
    path = f"/v1/topics/{ingest.plain}/batch".encode()
    head = b"\r\n".join([b"POST " + path + b" HTTP/1.1", b"Host: 127.0.0.1",
                         b"Authorization: Bearer " + ingest.token.encode(),
                         b"Content-Length: %d" % BATCH_MAX, b"Connection: close"]) + b"\r\n\r\n"
    body = b"x" * (BATCH_MAX - 1)
    uploads = []
    try:
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", ingest.port), timeout=30)
            s.sendall(head + body)
            uploads.append(s)
        time.sleep(1)
        if not SANITIZED:
            assert peak_rss_bytes(ingest.proc.pid) < 2 * BODIES_MAX
        answers = []
        for s in uploads:
            s.sendall(b"x")  # the last byte: the request is complete, and answered
            received = b""
            while chunk := s.recv(65536):
                received += chunk
            head_text, _, answer = received.partition(b"\r\n\r\n")
            answers.append((int(head_text.split()[1]), b"retry-after:" in head_text.lower(),
                            json.loads(answer)["error"]))
    finally:
        for s in uploads:
            s.close()
    busy = [a for a in answers if a[0] == 503]
    assert busy and all(a[1] and a[2] == "busy" for a in busy), answers
    # The ones within the limit were read whole: "x..." is not JSON.
    assert all(a[0] == 400 for a in answers if a[0] != 503), answers
    assert len(answers) - len(busy) >= BODIES_MAX // BATCH_MAX - 1, answers
    assert "event=bodies_limit_reached" in ingest.output()
    status, answer, _ = send_record(ingest.port, ingest.plain, ingest.token)
    assert status == 201, answer


# ---------------------------------------------------------------- trailer fields

def test_a_chunked_body_with_trailer_fields_is_refused_and_nothing_is_stored(ingest):
    """An Idempotency-Key in the trailer was ignored (the record got a generated key)
    while a proxy that merges trailers into the header read it as the key."""
    before = stored(ingest)
    for topic in (ingest.plain, ingest.processed):
        head = [b"POST /v1/topics/%s/records HTTP/1.1" % topic.encode(), b"Host: 127.0.0.1",
                b"Authorization: Bearer " + ingest.token.encode(), b"Connection: close",
                b"Transfer-Encoding: chunked"]
        body = b"2\r\n{}\r\n0\r\nIdempotency-Key: trailer-" + uuid.uuid4().hex.encode() + b"\r\n\r\n"
        status, _, answer = exchange(ingest.port, b"\r\n".join(head) + b"\r\n\r\n" + body)
        answer = json.loads(answer)
        assert status == 400 and "trailer" in answer["message"], answer
    assert stored(ingest) == before


# ---------------------------------------------------------------- content codings

def test_a_compressed_body_is_refused_415_and_nothing_is_stored(ingest):
    """A gzip body was stored as the payload, compressed bytes labelled application/json."""
    import gzip
    before = stored(ingest)
    body = gzip.compress(b'{"a": 1}')
    for topic, path in ((ingest.plain, "records"), (ingest.processed, "records"), (ingest.plain, "batch")):
        head = [b"POST /v1/topics/%s/%s HTTP/1.1" % (topic.encode(), path.encode()),
                b"Host: 127.0.0.1", b"Authorization: Bearer " + ingest.token.encode(),
                b"Connection: close", b"Content-Type: application/json",
                b"Content-Encoding: gzip", b"Content-Length: %d" % len(body)]
        status, _, answer = exchange(ingest.port, b"\r\n".join(head) + b"\r\n\r\n" + body)
        answer = json.loads(answer)
        assert status == 415 and answer["error"] == "unsupported_content_encoding", answer
        assert '"gzip"' in answer["message"], answer
    assert stored(ingest) == before
    # "identity" is no coding.
    head = [b"POST /v1/topics/%s/records HTTP/1.1" % ingest.plain.encode(), b"Host: 127.0.0.1",
            b"Authorization: Bearer " + ingest.token.encode(), b"Connection: close",
            b"Content-Encoding: identity", b"Content-Length: 2"]
    assert exchange(ingest.port, b"\r\n".join(head) + b"\r\n\r\n{}")[0] == 201


# ---------------------------------------------------------------- a topic removed meanwhile

def test_a_topic_removed_while_requests_come_is_unknown_topic_on_every_answer(ingest):
    """Until the service follows the new configuration, a record of a removed topic that
    needs processing reaches the database, which refuses it: answered 404
    "refused_by_database" (a code no table lists) instead of unknown_topic."""
    from consumer_helpers import wait_published
    from relay_helpers import make_topic

    topic = f"ingest.removed.{uuid.uuid4().hex[:8]}"
    with connect() as conn:
        make_topic(conn, topic, processor_kind="sql", processor="public.ingest_identity")
        token = new_token(conn, [topic])
        wait_published(conn)
    wait_until(lambda: send_record(ingest.port, topic, token)[0] == 202, 30,
               what="the new topic in the service's configuration")
    with connect() as conn, conn.transaction():
        conn.execute("SET LOCAL wal_delivery.force_delete = on")
        conn.execute("DELETE FROM wal_delivery.topics WHERE name = %s", (topic,))
    answers = [send_record(ingest.port, topic, token)[:2] for _ in range(20)]
    assert all(status == 404 and answer["error"] == "unknown_topic" for status, answer in answers), \
        [a for a in answers if a[0] != 404 or a[1]["error"] != "unknown_topic"][:3]
    assert all(answer["message"].startswith(f'topic "{topic}" does not exist') for _, answer in answers)
