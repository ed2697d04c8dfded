"""The sample destination records what it receives and answers as it is told."""
import json
import socket
import urllib.error
import urllib.request

import pytest


def call(url, body=b"{}", headers=None, timeout=10):
    req = urllib.request.Request(url, data=body, headers=headers or {}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers)


def test_records_method_path_headers_body_and_time(destination):
    status, _ = call(destination.url + "/orders", b'{"id": 1}', {"Idempotency-Key": "k1"})
    assert status == 200
    [req] = destination.requests()
    assert req["method"] == "POST"
    assert req["path"] == "/orders"
    assert req["headers"]["idempotency-key"] == "k1"
    assert json.loads(req["body"]) == {"id": 1}
    assert req["arrived_at"] > 0


@pytest.mark.parametrize("status", [201, 400, 429, 503])
def test_answers_the_status_it_is_told(destination, status):
    destination.behave(status=status, headers={"Retry-After": "1"})
    got, headers = call(destination.url + "/x")
    assert got == status
    assert headers["Retry-After"] == "1"


def test_behaviour_by_path_and_for_a_number_of_requests(destination):
    destination.behave(path="/a", status=500, times=2)
    assert [call(destination.url + "/a")[0] for _ in range(3)] == [500, 500, 200]
    assert call(destination.url + "/b")[0] == 200
    assert len(destination.requests("/a")) == 3


def test_slow_and_hanging_answers(destination):
    destination.behave(delay_ms=300)
    assert call(destination.url + "/slow", timeout=5)[0] == 200
    destination.behave(hang=True)
    with pytest.raises((socket.timeout, urllib.error.URLError, TimeoutError)):
        call(destination.url + "/hang", timeout=1)
    assert destination.requests("/hang"), "a hung request is still recorded"


def test_bad_behaviour_is_refused(destination):
    with pytest.raises(urllib.error.HTTPError) as e:
        destination.control("behaviour", ["not", "an", "object"])
    assert e.value.code == 400
