"""`wal-worker ingest`: records over HTTP into Kafka (201) or the outbox (202), tokens,
the errors a client gets, the batch form, and that a record reads the same in Kafka
whichever path it took. Real Postgres, real Kafka, real HTTP."""
import base64
import json
import re

import pytest

from conftest import connect
from consumer_helpers import wait_published
from ingest_helpers import (INGEST_LOGIN, new_token, post, running_ingest, send_record,
                            topics_with_token)
from relay_helpers import read_topic, wait_all_stored, wait_until


@pytest.fixture
def ingest(tmp_path, kafka_bootstrap):
    with running_ingest(tmp_path, kafka_bootstrap) as worker:
        yield worker


def test_records_take_the_direct_path_or_the_outbox_and_read_the_same(ingest, kafka_bootstrap, unique):
    with connect() as conn:
        (plain, proc), token = topics_with_token(conn, unique, processing=True)
    wait_until(lambda: send_record(ingest.port, plain, token)[0] == 201, 30,
               what="the new topic in the ingest's config")

    status, body, headers = send_record(ingest.port, plain, token, b'{"a": 1}', key="order-1",
                                        headers={"Trace-Id": "t-1"}, ikey="direct-1")
    assert status == 201, body
    assert body["path"] == "kafka" and body["topic"] == plain and body["idempotency_key"] == "direct-1"
    assert body["partition"] >= 0 and body["offset"] >= 0
    assert headers["Idempotency-Key"] == "direct-1"

    # Without a key one is generated and returned.
    status, body, headers = send_record(ingest.port, plain, token, b"x", content_type="text/plain")
    assert status == 201 and re.fullmatch(r"[0-9a-f-]{36}", body["idempotency_key"])
    assert headers["Idempotency-Key"] == body["idempotency_key"]

    # A topic that needs processing always goes through the outbox.
    status, body, _ = send_record(ingest.port, proc, token, b"raw", ikey="proc-1",
                                  content_type="application/x-custom")
    assert status == 202, body
    assert body["path"] == "outbox" and body["outbox_id"] > 0
    with connect() as conn:
        row = conn.execute("SELECT content_type, enqueued_by::regrole::text FROM wal_delivery.outbox"
                           " WHERE id = %s", (body["outbox_id"],)).fetchone()
        assert row == ("application/x-custom", INGEST_LOGIN)
        # The same record through wal_enqueue, for comparison with the direct path.
        conn.execute("SELECT wal_enqueue(%s, '{\"a\": 1}'::jsonb, 'relayed-1', 'order-1',"
                     " '{\"trace-id\": \"t-1\"}')", (plain,))
        wait_all_stored(conn, plain, 1)

    seen = read_topic(kafka_bootstrap, plain, ["direct-1", "relayed-1"])
    direct, relayed = seen["direct-1"][0], seen["relayed-1"][0]
    assert direct["key"] == relayed["key"] == b"order-1"
    assert json.loads(direct["value"]) == json.loads(relayed["value"]) == {"a": 1}
    # Consumers cannot tell the paths apart: the same headers, in the same format, except
    # the outbox id, which only a record that went through the outbox has.
    assert set(direct["headers"]) == set(relayed["headers"]) - {"outbox-id"}
    for name in ("source-topic", "content-type", "trace-id"):
        assert direct["headers"][name] == relayed["headers"][name], name
    pattern = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z"
    assert re.fullmatch(pattern, direct["headers"]["created-at"])
    assert re.fullmatch(pattern, relayed["headers"]["created-at"])


def test_tokens_topics_and_bad_input_get_clear_errors(ingest, unique):
    with connect() as conn:
        (plain,), token = topics_with_token(conn, unique, max_payload_bytes=1000)
        other = f"ingest.other.{unique}"
        conn.execute("INSERT INTO wal_delivery.topics (name, partitions, replication_factor,"
                     " min_insync_replicas) VALUES (%s, 1, 1, 1)", (other,))
        star = new_token(conn, ["*"])
        revoked = new_token(conn, ["*"], name=f"revoked-{unique}")
        conn.execute("UPDATE wal_delivery.ingest_tokens SET revoked_at = now() WHERE name = %s",
                     (f"revoked-{unique}",))
        wait_published(conn)
    wait_until(lambda: send_record(ingest.port, other, star)[0] == 201, 30, what="config")

    def error(expected_status, *args, **kw):
        status, body, headers = send_record(ingest.port, *args, **kw)
        assert status == expected_status, body
        assert isinstance(body, dict) and body["error"] and body["message"], body
        return body

    assert post(ingest.port, f"/v1/topics/{plain}/records", b"{}")[0] == 401
    error(401, plain, "not-a-token")
    error(401, plain, revoked)
    assert "may not write" in error(403, other, token)["message"]
    assert "does not exist" in error(404, f"nope.{unique}", star)["message"]
    error(413, plain, token, b"x" * 1001)
    error(413, plain, token, b"x" * 900, headers={"big": "y" * 200})
    assert "reserved" in error(400, plain, token, headers={"Source-Topic": "x"})["message"]
    error(400, plain, token, ikey="x" * 201)
    error(400, plain, token, key="k" * 1025)
    assert post(ingest.port, f"/v1/topics/{plain}/records", method="GET",
                headers={"Authorization": f"Bearer {token}"})[0] == 405
    assert post(ingest.port, "/v2/elsewhere")[0] == 404

    # The batch form: NDJSON, answered per record; a bad line refuses the whole batch.
    # Its topic's first record may miss the Kafka deadline while the producer learns the
    # new topic's metadata (then it takes the outbox): the batch is sent once it does not.
    wait_until(lambda: send_record(ingest.port, plain, token)[0] == 201, 30,
               what="the direct path to the new topic")
    lines = [json.dumps({"value": {"n": 1}, "idempotency_key": "b-1"}),
             json.dumps({"value_base64": base64.b64encode(b"\x00\x01").decode(), "key": "k",
                         "headers": {"h": "v"}, "content_type": "application/x-bin"})]
    status, body, _ = post(ingest.port, f"/v1/topics/{plain}/batch", "\n".join(lines).encode(),
                           {"Authorization": f"Bearer {token}"})
    assert status == 201 and body["kafka"] == 2 and len(body["records"]) == 2, body
    assert body["records"][0]["idempotency_key"] == "b-1"
    status, body, _ = post(ingest.port, f"/v1/topics/{plain}/batch",
                           (lines[0] + "\n{\"value_base64\": 1}\n").encode(),
                           {"Authorization": f"Bearer {token}"})
    assert status == 400 and "line 2" in body["message"], body

    assert ingest.metric("wal_ingest_requests_total", status="401") >= 3
    assert ingest.metric("wal_ingest_records_total", path="kafka") >= 3
    assert ingest.metric("wal_ingest_request_seconds_count", path="kafka") >= 2


def test_ingest_role_reads_only_its_own_config(ingest):
    """The login is a writer plus ingest_config(): no signing secrets, no control plane."""
    with connect(user=INGEST_LOGIN) as conn:
        doc = conn.execute("SELECT wal_delivery.ingest_config()").fetchone()[0]
        assert set(doc) >= {"topics", "tokens", "version"}
        assert all(set(t) == {"name", "sha256", "topics"} for t in doc["tokens"])
        for forbidden in ("SELECT wal_delivery.worker_config()",
                          "SELECT * FROM wal_delivery.ingest_tokens",
                          "SELECT * FROM wal_delivery.destination_secrets",
                          "SELECT * FROM wal_delivery.outbox"):
            with pytest.raises(Exception, match="permission denied"):
                conn.execute(forbidden)
    status, _ = ingest.get("/readyz")
    assert status == 200
