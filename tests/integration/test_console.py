"""`wal-worker console` over HTTP (the browser tests are test_console_browser.py): each
role sees and does exactly what its grants allow; sign-in, sessions, CSRF, Origin and the
failed sign-in limit; the headers of every answer; keyset pages; payloads shown as text
or hex and cut with a download; every change audited with who; the archive paged by
keyset. Dead letters are written with ingest_dead_letter, as the dlq worker writes them;
only the per-topic rates need Kafka (a real `consume` delivering to a real destination)."""
import json
import time

import pytest

from conftest import Destination, connect
from console_helpers import PASSWORD, TRUSTED_LOGIN, Client, Console, ensure_logins
from consumer_helpers import Worker, add_destination, wait_published
from relay_helpers import make_topic, wait_all_stored, wait_until

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")


@pytest.fixture(scope="module", autouse=True)
def logins():
    ensure_logins()


@pytest.fixture
def console(tmp_path):
    c = Console(tmp_path)
    yield c
    c.stop()


def add_dead_letters(topic, destination, n, payload=b'{"n": 1}', error="HTTP 400", key_prefix="k"):
    with connect() as conn:
        return [r[0] for r in conn.execute(
            "SELECT wal_delivery.ingest_dead_letter('dlq', 0, (SELECT coalesce(max(id), 0) FROM"
            " wal_delivery.dead_letters) + 1000000 + o, %s, %s || o, %s, NULL, 'application/json', %s,"
            " 3, %s, '{}') FROM generate_series(1, %s) o",
            (topic, key_prefix, destination, payload, error, n)).fetchall()]


@pytest.fixture
def topic_and_destination(unique):
    topic, dest = f"console.{unique}", f"console-{unique}"
    with connect() as conn:
        conn.execute("INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas)"
                     " VALUES (%s, 1, 1)", (topic,))
        conn.execute("INSERT INTO wal_delivery.destinations (name, endpoint) VALUES (%s, 'http://127.0.0.1:9/x')",
                     (dest,))
    yield topic, dest
    with connect() as conn:
        conn.execute("DELETE FROM wal_delivery.dead_letters WHERE topic = %s", (topic,))
        conn.execute("SET wal_delivery.force_delete = on")
        conn.execute("DELETE FROM wal_delivery.destinations WHERE name = %s", (dest,))
        conn.execute("DELETE FROM wal_delivery.topics WHERE name = %s", (topic,))


def test_each_role_sees_and_does_what_its_grants_allow(console, topic_and_destination):
    topic, dest = topic_and_destination
    add_dead_letters(topic, dest, 2)
    seen = {}
    for user in ("console_oncall", "console_admin", "console_writer", "console_nobody"):
        c = Client(console)
        assert c.sign_in(user)[0] == 200, user
        status, session = c.get("/api/session")
        assert status == 200 and session["user"] == user
        seen[user] = {path: c.get(path)[0] for path in
                      ("/api/overview", f"/api/dead-letters?topic={topic}", "/api/destinations", "/api/audit",
                       "/api/archive")}
        seen[user]["restore"] = c.post("/api/archive/restore", {"object": "none"})[0]
    ok = {"/api/overview": 200, f"/api/dead-letters?topic={topic}": 200, "/api/destinations": 200,
          "/api/audit": 200, "/api/archive": 200}
    assert seen["console_oncall"] == {**ok, "restore": 403}, "on-call may not restore (an admin's job)"
    # The admin may try: the object does not exist, which is not a permission problem.
    assert seen["console_admin"] == {**ok, "restore": seen["console_admin"]["restore"]}
    assert seen["console_admin"]["restore"] != 403
    for user in ("console_writer", "console_nobody"):
        assert set(seen[user].values()) == {403}, user
    c = Client(console)
    c.sign_in("console_writer")
    status, body = c.get("/api/overview")
    assert "permission denied" in body["error"] and body["sqlstate"] == "42501"


def test_a_role_the_server_lets_in_without_a_password_is_refused(console):
    c = Client(console)
    status, body = c.sign_in(TRUSTED_LOGIN, "any password at all")
    assert status == 401 and "without checking a password" in body["error"]
    assert c.cookie is None
    assert console.metric("wal_console_signins_total", outcome="refused") == 1


def test_wrong_passwords_are_limited_per_role_with_retry_after(console):
    c = Client(console)
    for _ in range(5):
        assert c.sign_in("console_oncall", "wrong")[0] == 401
    status, body, headers = c.request("POST", "/api/session", {"user": "console_oncall", "password": PASSWORD})
    assert status == 429 and 0 < int(headers["retry-after"]) <= 60, "even the right password, for a minute"
    assert console.metric("wal_console_signins_total", outcome="failed") == 5
    assert console.metric("wal_console_signins_total", outcome="limited") == 1


def test_every_change_needs_the_csrf_token_and_this_origin(console, topic_and_destination):
    topic, dest = topic_and_destination
    [dl] = add_dead_letters(topic, dest, 1)
    c = Client(console)
    c.sign_in("console_oncall")
    path = f"/api/dead-letters/{dl}/resolve"
    forged = [
        {"csrf": False},                                                        # no token
        {"headers": {"X-CSRF-Token": "0" * 64}},                                # a wrong one
        {"headers": {"Origin": "http://evil.test"}},                            # another site
        {"headers": {"Origin": f"http://127.0.0.1:{console.port}.evil.test"}},
        {"headers": {"Sec-Fetch-Site": "cross-site"}},
    ]
    for kw in forged:
        status, body = c.post(path, {"note": "forged"}, **kw)
        assert status == 403 and body["error"].startswith("refused"), kw
    with connect() as conn:
        assert conn.execute("SELECT resolved_at FROM wal_delivery.dead_letters WHERE id = %s", (dl,)).fetchone() == (None,)
        assert conn.execute("SELECT count(*) FROM wal_delivery.audit_log WHERE target->>'id' = %s",
                            (str(dl),)).fetchone()[0] == 0
    # A form post from another site cannot sign in either (no JSON without a preflight).
    status, body, _ = Client(console).request("POST", "/api/session", b"user=console_oncall&password=x",
                                              headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 415
    status, body = c.post(path, {"note": "by the page"}, headers={"Origin": f"http://127.0.0.1:{console.port}"})
    assert status == 200
    with connect() as conn:
        assert conn.execute("SELECT who, action, count FROM wal_delivery.audit_log WHERE target->>'id' = %s",
                            (str(dl),)).fetchall() == [("console_oncall", "resolve", 1)]


def test_a_session_after_sign_out_is_refused(console):
    c = Client(console)
    c.sign_in("console_oncall")
    cookie, csrf = c.cookie, c.csrf
    assert c.post("/api/signout")[0] == 200
    assert c.cookie is None, "the cookie is cleared"
    stale = Client(console)
    stale.cookie, stale.csrf = cookie, csrf
    assert stale.get("/api/overview")[0] == 401
    assert stale.post("/api/destinations/x/resume")[0] == 401
    # Signing in again in the same browser ends the session it had.
    again = Client(console)
    again.sign_in("console_oncall")
    first = again.cookie
    again.sign_in("console_admin")
    old = Client(console)
    old.cookie = first
    assert old.get("/api/session")[0] == 401 and again.get("/api/session")[1]["user"] == "console_admin"


def test_sessions_end_when_idle_and_at_their_age(tmp_path):
    console = Console(tmp_path, "--session-idle", "10", "--session-max-age", "16")
    try:
        idle, busy = Client(console), Client(console)
        idle.sign_in("console_oncall")
        busy.sign_in("console_oncall")
        for _ in range(4):
            time.sleep(3.5)
            assert busy.get("/api/session")[0] == 200
        assert idle.get("/api/session")[0] == 401, "idle for 14 s"
        time.sleep(3)
        assert busy.get("/api/session")[0] == 401, "17 s after sign-in, though busy"
        assert "event=session_ended user=console_oncall reason=idle" in console.output()
        assert "reason=max_age" in console.output()
    finally:
        console.stop()


def test_sessions_are_capped(tmp_path):
    console = Console(tmp_path, "--max-sessions", "1")
    try:
        first = Client(console)
        assert first.sign_in("console_oncall")[0] == 200
        assert Client(console).sign_in("console_admin")[0] == 503
        first.post("/api/signout")
        assert Client(console).sign_in("console_admin")[0] == 200
    finally:
        console.stop()


def test_answers_carry_the_security_headers_and_cookie_flags(tmp_path, console):
    c = Client(console)
    status, body, headers = c.request("POST", "/api/session", {"user": "console_oncall", "password": PASSWORD})
    assert status == 200
    for path in ("/", "/app.js", "/app.css", "/api/session", "/api/nope"):
        status, _, headers = c.request("GET", path)
        assert headers["content-security-policy"] == CSP, path
        assert headers["x-content-type-options"] == "nosniff" and headers["referrer-policy"] == "no-referrer"
        if path.startswith("/api/"):
            assert headers["cache-control"] == "no-store"
    conn_cookie = Client(console).request("POST", "/api/session",
                                          {"user": "console_oncall", "password": PASSWORD})[2]["set-cookie"]
    assert "HttpOnly" in conn_cookie and "SameSite=Strict" in conn_cookie and "Path=/" in conn_cookie
    assert "Secure" not in conn_cookie
    behind = Console(tmp_path, "--behind-tls")
    try:
        cookie = Client(behind).request("POST", "/api/session",
                                        {"user": "console_oncall", "password": PASSWORD})[2]["set-cookie"]
        assert cookie.endswith("; Secure")
    finally:
        behind.stop()
    # The page loads its one script and one style sheet and has no inline script.
    html = c.request("GET", "/")[1].decode()
    assert '<script src="/app.js" defer></script>' in html and html.count("<script") == 1
    assert "style=" not in html and " on" not in html.replace(" one", "")


def test_dead_letters_page_by_keyset_with_filters(console, topic_and_destination):
    topic, dest = topic_and_destination
    ids = add_dead_letters(topic, dest, 230, error="HTTP 400")
    special = add_dead_letters(topic, dest, 3, error="HTTP 418 teapot", key_prefix="tea-")
    c = Client(console)
    c.sign_in("console_oncall")
    got, before = [], None
    while True:
        status, page = c.get(f"/api/dead-letters?topic={topic}&limit=100" + (f"&before={before}" if before else ""))
        assert status == 200
        got += [d["id"] for d in page["dead_letters"]]
        before = page["next_before"]
        if before is None:
            break
    assert got == sorted(ids + special, reverse=True), "every entry once, newest first"
    assert [d["id"] for d in c.get(f"/api/dead-letters?topic={topic}&reason=TEAPOT")[1]["dead_letters"]] == special[::-1]
    assert [d["id"] for d in c.get(f"/api/dead-letters?key=tea-2&destination={dest}")[1]["dead_letters"]] == [special[1]]
    assert c.get(f"/api/dead-letters/count?topic={topic}")[1] == {"count": 233}
    assert c.get("/api/dead-letters?before=abc")[0] == 400
    assert c.get("/api/dead-letters?topic=%FF")[0] == 400, "not UTF-8"
    assert c.get("/api/dead-letters?topic=%00")[0] == 400


def test_payloads_show_as_text_or_hex_cut_with_a_download(console, topic_and_destination):
    topic, dest = topic_and_destination
    [text] = add_dead_letters(topic, dest, 1, payload="<script>alert(1)</script> ü".encode())
    [binary] = add_dead_letters(topic, dest, 1, payload=b"\x00\xff\x10abc", key_prefix="bin")
    big_bytes = ("€" * 30000).encode()  # 90,000 bytes: 64 KiB ends inside a 3-byte character
    [big] = add_dead_letters(topic, dest, 1, payload=big_bytes, key_prefix="big")
    c = Client(console)
    c.sign_in("console_oncall")
    p = c.get(f"/api/dead-letters/{text}")[1]["payload"]
    assert p == {"kind": "text", "text": "<script>alert(1)</script> ü", "bytes": 28, "shown_bytes": 28,
                 "truncated": False}
    p = c.get(f"/api/dead-letters/{binary}")[1]["payload"]
    assert (p["kind"], p["hex"], p["truncated"]) == ("binary", "00ff10616263", False)
    p = c.get(f"/api/dead-letters/{big}")[1]["payload"]
    assert (p["kind"], p["truncated"], p["bytes"], p["shown_bytes"]) == ("text", True, 90000, 65535)
    assert p["text"] == "€" * 21845, "the cut character is left out, the rest is text"
    status, raw, headers = c.request("GET", f"/api/dead-letters/{big}/payload")
    assert status == 200 and raw == big_bytes
    assert headers["content-type"] == "application/octet-stream"
    assert headers["content-disposition"] == f'attachment; filename="dead-letter-{big}.bin"'


def test_bulk_actions_pause_and_resume_are_audited_with_who(console, topic_and_destination):
    topic, dest = topic_and_destination
    ids = add_dead_letters(topic, dest, 5)
    c = Client(console)
    c.sign_in("console_oncall")
    assert c.post("/api/dead-letters/resolve", {"ids": ids[:3], "note": "customer deleted"}) == (200, {"count": 3})
    assert c.post("/api/dead-letters/resolve", {"ids": ids[:3], "note": "again"}) == (200, {"count": 0})
    assert c.post("/api/dead-letters/replay", {"ids": ids[3:]})[1] == {"count": 2}
    assert c.post("/api/dead-letters/resolve", {"ids": ids})[0] == 400, "a note is needed"
    assert c.post(f"/api/destinations/{dest}/pause", {"reason": "their deploy"}) == (200, {"changed": True})
    status, page = c.get(f"/api/destinations/{dest}")
    assert page["status"]["breaker"] == "open" and page["pause"]["next_probe_at"] is None
    assert page["status"]["pause_reason"] == "paused by console_oncall: their deploy"
    assert c.post(f"/api/destinations/{dest}/resume") == (200, {"changed": True})
    assert c.post("/api/destinations/no-such-dest/resume")[0] == 404
    history = c.get(f"/api/destinations/{dest}")[1]["history"]
    assert [(h["who"], h["action"]) for h in history] == [("console_oncall", "resume"), ("console_oncall", "pause")]
    with connect() as conn:
        rows = conn.execute("SELECT who, action, count, target FROM wal_delivery.audit_log"
                            " WHERE target->'ids' @> %s::jsonb ORDER BY id", (json.dumps(ids[:1]),)).fetchall()
    assert [(r[0], r[1], r[2]) for r in rows] == [("console_oncall", "resolve", 3), ("console_oncall", "resolve", 0)]


def test_per_topic_rates_show_a_real_failure_and_a_real_delivery(tmp_path, kafka_bootstrap, console, unique,
                                                                 clean_destinations):
    """A record the destination refuses (400: a failed attempt, then the DLQ) and one it
    takes, through a real `consume`: both reach delivery_stats and the overview's rates
    and chart. While Postgres refuses the counts (the worker's grant revoked) they stay in
    the worker and arrive with a later flush; delivery does not wait for them."""
    topic, dest = f"rates.{unique}", f"rates-{unique}"
    server = Destination(tmp_path)
    server.behave(status=400)
    worker = None
    try:
        with connect() as conn:
            conn.execute("REVOKE EXECUTE ON FUNCTION wal_delivery.add_delivery_stats(jsonb) FROM wal_delivery_worker")
            make_topic(conn, topic)
            add_destination(conn, dest, server.url + "/hook", [topic])
            conn.execute("SELECT wal_enqueue(%s, '{\"n\": 1}'::jsonb, 'refused')", (topic,))
            wait_all_stored(conn, topic, 1)
            wait_published(conn)
        worker = Worker(tmp_path, "consume", kafka_bootstrap=kafka_bootstrap)
        server.wait_for(1, path="/hook", timeout=60)
        server.behave(status=200)
        with connect() as conn:
            conn.execute("SELECT wal_enqueue(%s, '{\"n\": 2}'::jsonb, 'taken')", (topic,))
        server.wait_for(2, path="/hook", timeout=60)
        wait_until(lambda: worker.metric("wal_delivery_stats_flushes_total", result="failed") >= 1, 30,
                   what="a refused flush")
        with connect() as conn:
            assert conn.execute("SELECT count(*) FROM wal_delivery.delivery_stats WHERE topic = %s",
                                (topic,)).fetchone()[0] == 0
            conn.execute("GRANT EXECUTE ON FUNCTION wal_delivery.add_delivery_stats(jsonb) TO wal_delivery_worker")
        c = Client(console)
        c.sign_in("console_oncall")

        def topic_row():
            o = c.get("/api/overview")[1]
            row = next(t for t in o["topics"] if t["topic"] == topic)
            return row if row["delivered_5m"] == 1 else None
        row = wait_until(topic_row, 30, what="the counts kept through the refused flush")
        assert (row["delivered_5m"], row["failed_5m"], row["dead_lettered_5m"], row["failed_last_hour"]) == (1, 1, 1, 1)
        assert float(row["delivered_per_second"]) > 0
        o = c.get("/api/overview")[1]
        d = next(d for d in o["destinations"] if d["destination"] == dest)
        assert (d["delivered_5m"], d["failed_5m"], d["dead_lettered_last_hour"]) == (1, 1, 1)
        chart = [b for b in o["deliveries_per_5_minutes"] if b["topic"] == topic]
        assert sum(b["delivered"] for b in chart) == 1 and sum(b["failed"] for b in chart) == 1
        assert "deliveries_per_5_minutes" in o and c.get("/api/overview?chart=no")[1]["deliveries_per_5_minutes"] is None
        assert worker.metric("wal_delivery_stats_dropped_total") == 0
    finally:
        with connect() as conn:
            conn.execute("GRANT EXECUTE ON FUNCTION wal_delivery.add_delivery_stats(jsonb) TO wal_delivery_worker")
            conn.execute("DELETE FROM wal_delivery.delivery_stats WHERE topic = %s", (topic,))
        if worker:
            worker.stop()
        server.stop()


def test_the_archive_pages_by_keyset(console):
    """Objects newest day first, then by key; every object once however the pages fall,
    and a page after the last is empty."""
    objects = [(f"console-test/{day:02d}/{n}.ndjson.gz", f"2026-01-{day:02d}") for day in (3, 1, 2) for n in (1, 2, 3)]
    with connect() as conn:
        for obj, day in objects:
            conn.execute("INSERT INTO wal_delivery.archive_objects (object, day, first_id, last_id, entries)"
                         " VALUES (%s, %s, 1, 2, 2) ON CONFLICT DO NOTHING", (obj, day))
    try:
        c = Client(console)
        c.sign_in("console_oncall")
        got, q = [], "limit=4"
        while True:
            status, page = c.get("/api/archive?" + q)
            assert status == 200
            got += [o["object"] for o in page["objects"] if o["object"].startswith("console-test/")]
            if page["next"] is None:
                break
            q = f"limit=4&before_day={page['next']['day']}&before_object={page['next']['object']}"
        mine = sorted(objects, key=lambda o: (o[1], o[0]), reverse=True)
        assert got == [o for o, _ in mine]
        assert c.get("/api/archive?before_day=2026-01-01")[0] == 400, "day and object together"
        assert c.get("/api/archive?limit=0")[0] == 400
        assert c.get("/api/archive?before_day=nope&before_object=x")[0] == 400
    finally:
        with connect() as conn:
            conn.execute("DELETE FROM wal_delivery.archive_objects WHERE object LIKE 'console-test/%'")
