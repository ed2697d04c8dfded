"""`wal-worker ingest` refuses every request whose framing or target two HTTP parsers could
read two ways (the building blocks of request smuggling), before it takes a record: folded
header lines, two Content-Length headers, Transfer-Encoding with Content-Length or other
than `chunked`, NUL bytes in header values, and paths that are not a plain topic name once
decoded. Each refusal is a 400 and the connection is closed, so a request pipelined behind
it is never read; nothing reaches Kafka or the outbox. Well-formed requests from curl,
Python (http.client, requests) and HAProxy still get 201 (docs/security.md, "HTTP framing
of the ingest service").

The requests are raw bytes on a socket to a real ingest against the test environment's
Postgres and Kafka."""
import http.client
import json
import socket
import subprocess
import time
import uuid
from collections import namedtuple

import pytest

from conftest import connect
from consumer_helpers import wait_published
from ingest_helpers import (Ingest, kafka_records, new_token, post, send_record, setup_ingest,
                            stored_records)
from relay_helpers import make_topic, wait_until
from test_ingest_haproxy import haproxy  # noqa: F401 (a fixture)

Answer = namedtuple("Answer", "status headers body")


@pytest.fixture(scope="module")
def ingest(tmp_path_factory, kafka_bootstrap):
    """An ingest, a topic the refused requests aim at (each test checks that they add
    nothing to it), a topic for the well-formed ones, and a token for both."""
    unique = uuid.uuid4().hex[:10]
    worker = None
    with connect() as conn:
        setup_ingest(conn)
        refused, accepted = f"ingest.framing.{unique}", f"ingest.framing-ok.{unique}"
        make_topic(conn, refused)
        make_topic(conn, accepted)
        token = new_token(conn, [refused, accepted])
        wait_published(conn)
    try:
        worker = Ingest(tmp_path_factory.mktemp("ingest-framing"), kafka_bootstrap)
        worker.wait_listening()
        worker.refused, worker.accepted, worker.token = refused, accepted, token
        worker.bootstrap = kafka_bootstrap
        wait_until(lambda: send_record(worker.port, accepted, token)[0] == 201, 30,
                   what="the topics in the ingest's config")
        wait_until(lambda: kafka_records(kafka_bootstrap, refused) is not None, 60,
                   what="the refused topic in Kafka")
        yield worker
    finally:
        if worker:
            worker.stop()


def stored(ingest):
    """What the refused requests' topic holds: (messages in Kafka, rows in the outbox)."""
    return stored_records(ingest, ingest.refused)


def record_request(ingest, *lines, body=b"{}", path=None, length=True, auth=None, topic=None):
    """One request's bytes: the request line, Host, the token, lines (raw header lines,
    in order), a Content-Length unless length is False, then body as it is."""
    path = path or f"/v1/topics/{topic or ingest.refused}/records".encode()
    head = [b"POST " + path + b" HTTP/1.1", b"Host: 127.0.0.1",
            auth or b"Authorization: Bearer " + ingest.token.encode(),
            b"Content-Type: application/json", *lines]
    if length:
        head.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def pipelined(ingest, topic=None):
    """A well-formed request, to send right behind another on the same connection."""
    return record_request(ingest, b"Idempotency-Key: pipelined-" + uuid.uuid4().hex.encode(),
                          topic=topic)


def parse_answers(data):
    """The HTTP responses in data, in order; a truncated one is (None, {}, rest)."""
    answers = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            answers.append(Answer(None, {}, data))
            break
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower().decode()] = value.strip().decode("latin-1")
        if "content-length" in headers:
            n = int(headers["content-length"])
            body, data = rest[:n], rest[n:]
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                size_line, _, rest = rest.partition(b"\r\n")
                size = int(size_line.split(b";")[0], 16)
                body, rest = body + rest[:size], rest[size + 2:]
                if size == 0:
                    break
            data = rest
        else:
            body, data = rest, b""
        answers.append(Answer(status, headers, body))
    return answers


def exchange(port, data, wait=5.0):
    """Sends data on a new connection and reads until the server closes it or wait seconds
    pass: (the answers, whether the server closed the connection)."""
    received, closed = b"", False
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        try:
            s.sendall(data)
        except OSError:
            pass  # closed while sending: what it answered is still to be read
        deadline = time.time() + wait
        while time.time() < deadline:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            received += chunk
    return parse_answers(received), closed


def assert_refused(ingest, data, mentions=None):
    """data, with a well-formed request pipelined behind it, gets one 400 and a closed
    connection, and stores nothing. mentions: the answer is ours (JSON) and names it."""
    before = stored(ingest)
    answers, closed = exchange(ingest.port, data + pipelined(ingest))
    assert [a.status for a in answers] == [400], answers
    assert closed, "the connection is still open after the 400"
    if mentions is not None:
        body = json.loads(answers[0].body.decode("utf-8"))  # strict UTF-8
        assert body["error"] == "bad_request" and mentions in body["message"], body
        assert answers[0].headers.get("connection", "").lower() == "close", answers[0].headers
    assert stored(ingest) == before, "a refused request reached Kafka or the outbox"
    return answers[0]


# ---------------------------------------------------------------- folded header lines

def test_folded_wal_header_is_refused(ingest):
    # libmicrohttpd 0.9 read this as a header named "fdef" with the value "abc".
    assert_refused(ingest, record_request(ingest, b"X-Wal-Header-f: abc", b" def"))


def test_folded_idempotency_key_is_refused(ingest):
    assert_refused(ingest, record_request(ingest, b"Idempotency-Key: abc", b"\tdef"))


# ---------------------------------------------------------------- Content-Length

def test_two_equal_content_lengths_are_refused(ingest):
    assert_refused(ingest, record_request(ingest, b"Content-Length: 2", b"Content-Length: 2",
                                          length=False), mentions="Content-Length")


def test_two_different_content_lengths_smuggling_a_request_are_refused(ingest):
    # A front end that takes the last Content-Length sends one request; a back end that
    # takes the first would read the rest of the body as a second request.
    smuggled = record_request(ingest, b"Idempotency-Key: smuggled-" + uuid.uuid4().hex.encode())
    body = b"{}" + smuggled
    assert_refused(ingest, record_request(ingest, b"Content-Length: 2",
                                          b"Content-Length: %d" % len(body), body=body,
                                          length=False), mentions="Content-Length")


# ---------------------------------------------------------------- Transfer-Encoding

CHUNKED_BODY = b"2\r\n{}\r\n0\r\n\r\n"


def test_transfer_encoding_with_content_length_is_refused(ingest):
    smuggled = record_request(ingest, b"Idempotency-Key: smuggled-" + uuid.uuid4().hex.encode())
    body = b"0\r\n\r\n" + smuggled
    assert_refused(ingest, record_request(ingest, b"Transfer-Encoding: chunked",
                                          b"Content-Length: %d" % len(body), body=body,
                                          length=False))


@pytest.mark.parametrize("coding", [b"xchunked", b"gzip, chunked", b"identity", b"chunked, chunked"])
def test_transfer_encoding_other_than_chunked_is_refused(ingest, coding):
    assert_refused(ingest, record_request(ingest, b"Transfer-Encoding: " + coding,
                                          body=CHUNKED_BODY, length=False))


def test_two_transfer_encoding_headers_are_refused(ingest):
    assert_refused(ingest, record_request(ingest, b"Transfer-Encoding: chunked",
                                          b"Transfer-Encoding: identity", body=CHUNKED_BODY,
                                          length=False), mentions="Transfer-Encoding")


# ---------------------------------------------------------------- headers read once

@pytest.mark.parametrize("name", [b"Host", b"Authorization", b"Content-Type", b"Idempotency-Key",
                                  b"X-Wal-Key", b"Content-Encoding"])
def test_two_of_a_header_read_once_are_refused(ingest, name):
    # The server reads the first; a proxy or a filter in front may read the last.
    sent = {b"Host", b"Authorization", b"Content-Type"}  # record_request sends one of these
    lines = [name + b": second"] if name in sent else [name + b": first", name + b": second"]
    assert_refused(ingest, record_request(ingest, *lines), mentions=name.decode())


# ---------------------------------------------------------------- NUL in header values

@pytest.mark.parametrize("line", [b"Idempotency-Key: key\x00junk", b"X-Wal-Key: key\x00junk",
                                  b"X-Wal-Header-x: value\x00junk"])
def test_nul_in_a_header_value_is_refused(ingest, line):
    assert_refused(ingest, record_request(ingest, line))


def test_valid_token_with_nul_and_more_is_refused(ingest):
    auth = b"Authorization: Bearer " + ingest.token.encode() + b"\x00junk"
    assert_refused(ingest, record_request(ingest, auth=auth))


# ---------------------------------------------------------------- the path

def test_nul_escape_in_the_path_is_refused(ingest):
    # libmicrohttpd decoded it in place: the handler saw /v1/topics/<topic>/records.
    path = f"/v1/topics/{ingest.refused}/records%00junk".encode()
    assert_refused(ingest, record_request(ingest, path=path), mentions="%00")


def test_topic_that_is_not_utf8_is_refused(ingest):
    answer = assert_refused(ingest, record_request(ingest, path=b"/v1/topics/%FF%FE/records"),
                            mentions="%FF%FE")
    assert b"\xff" not in answer.body


def test_topic_over_the_name_rule_is_refused(ingest):
    # 248 characters, 249 bytes: a length check in bytes would let it through.
    path = b"/v1/topics/" + b"a" * 247 + b"%C3%A9/records"
    assert_refused(ingest, record_request(ingest, path=path), mentions="topic")


@pytest.mark.parametrize("path", [b"/v1/topics/a%2/records", b"/v1/topics/a%zzb/records",
                                  b"/v1/topics/a%2Fb/records", b"/v1/topics/%2E%2E/records",
                                  b"/v1/topics/__x/records", b"/v1/topics/a%20b/records"])
def test_malformed_escapes_and_bad_topic_names_are_refused(ingest, path):
    assert_refused(ingest, record_request(ingest, path=path))


def test_query_string_is_refused(ingest):
    path = f"/v1/topics/{ingest.refused}/records?acks=0".encode()
    assert_refused(ingest, record_request(ingest, path=path), mentions="query")


# ---------------------------------------------------------------- the admin port

def test_admin_port_refuses_the_same_framing(ingest):
    get = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    for head in (b"X-A: abc\r\n def\r\n", b"Content-Length: 0\r\nContent-Length: 0\r\n",
                 b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n"):
        answers, closed = exchange(ingest.admin_port, get + head + b"\r\n" + get + b"\r\n")
        assert [a.status for a in answers] == [400] and closed, (head, answers)
    answers, _ = exchange(ingest.admin_port, b"GET /healthz%00x HTTP/1.1\r\nHost: x\r\n"
                          b"Connection: close\r\n\r\n")
    assert [a.status for a in answers] == [404], answers


# ---------------------------------------------------------------- what still works

def test_well_formed_requests_still_get_201(ingest):
    topic = ingest.accepted
    # Content-Length and chunked, and two of them pipelined on one connection.
    chunked = record_request(ingest, b"Transfer-Encoding: chunked", body=CHUNKED_BODY,
                             length=False, topic=topic)
    answers, closed = exchange(ingest.port, chunked + record_request(
        ingest, b"Idempotency-Key: ok-" + uuid.uuid4().hex.encode(), b"Connection: close",
        topic=topic))
    assert [a.status for a in answers] == [201, 201] and closed, answers
    # An encoded "." in a valid name is decoded.
    path = f"/v1/topics/{topic}/records".replace(".", "%2E", 1).encode()
    answers, _ = exchange(ingest.port, record_request(ingest, b"Connection: close", path=path))
    assert [a.status for a in answers] == [201], answers
    # GET endpoints keep working, with arguments too (ignored there).
    assert post(ingest.port, "/healthz?probe=1", method="GET")[0] == 200
    assert post(ingest.port, "/readyz", method="GET")[0] == 200
    assert post(ingest.port, "/metrics?x=%FF", method="GET")[0] == 200


def test_curl_and_python_clients_get_201(ingest):
    url = f"http://127.0.0.1:{ingest.port}/v1/topics/{ingest.accepted}/records"
    auth = f"Authorization: Bearer {ingest.token}"
    for extra in ([], ["-H", "Transfer-Encoding: chunked"]):
        out = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-H", auth,
                              "-H", "Content-Type: application/json", *extra,
                              "--data-binary", "{}", url], capture_output=True, text=True)
        assert out.stdout == "201", (extra, out.stdout, out.stderr)
    headers = {"Authorization": f"Bearer {ingest.token}", "Content-Type": "application/json"}
    conn = http.client.HTTPConnection("127.0.0.1", ingest.port, timeout=30)
    try:
        for body in (b"{}", iter([b"{", b"}"])):  # Content-Length, then chunked
            assert post(ingest.port, url[url.index("/v1"):], body, headers, conn=conn)[0] == 201
    finally:
        conn.close()
    requests = pytest.importorskip("requests")
    with requests.Session() as s:
        assert s.post(url, data=b"{}", headers=headers, timeout=30).status_code == 201
        assert s.post(url, data=iter([b"{", b"}"]), headers=headers, timeout=30).status_code == 201


def test_requests_through_haproxy_get_201(ingest, haproxy):  # noqa: F811
    port = haproxy([ingest.port])
    wait_until(lambda: send_record(port, ingest.accepted, ingest.token)[0] == 201, 30,
               what="haproxy to pass requests on")
    headers = {"Authorization": f"Bearer {ingest.token}", "Content-Type": "application/json"}
    path = f"/v1/topics/{ingest.accepted}/records"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        for _ in range(3):  # keep-alive, Content-Length then chunked
            assert post(port, path, b"{}", headers, conn=conn)[0] == 201
            assert post(port, path, iter([b"{", b"}"]), headers, conn=conn)[0] == 201
    finally:
        conn.close()
