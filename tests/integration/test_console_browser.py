"""The on-call console in a real browser (Debian's headless Chromium, driven through
Selenium): sign in as each role; a dead letter made by a real failing destination (the
consume, dlq and retry workers on Kafka) is found, inspected, replayed and then
delivered; bulk resolve; pause and resume; and the hostile cases: markup and
javascript: URLs in every field of a record render as text and run nothing, a forged
request without the CSRF token or from another origin changes nothing, a session after
sign-out is refused, a role without rights sees Postgres's refusal. Each page shown is
saved under .cache/test-output/console/ (`make console-screenshots` copies them into
docs/console/)."""
import json
import signal

import pytest

from conftest import Destination, connect
from console_helpers import PASSWORD, Console, chromium, ensure_logins, screenshot
from consumer_helpers import Worker, add_destination, wait_published
from relay_helpers import make_topic, wait_all_stored, wait_until

pytest.importorskip("selenium")
from selenium.common.exceptions import NoAlertPresentException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

SCRIPT = "<script>window.__pwned = 1</script>"
IMG = "<img src=x onerror=\"window.__pwned = 1\">"
JS_URL = "javascript:window.__pwned=1"
HOSTILE = f"{SCRIPT}{IMG}{JS_URL}"


@pytest.fixture(scope="module", autouse=True)
def logins():
    ensure_logins()


@pytest.fixture
def console(tmp_path):
    c = Console(tmp_path)
    yield c
    c.stop()


@pytest.fixture
def browser():
    driver = chromium()
    yield driver
    driver.quit()


def sign_in(driver, console, user, password=PASSWORD):
    driver.get(console.url + "/")
    wait_for(driver, lambda d: d.find_element(By.ID, "signin-page").is_displayed())
    driver.find_element(By.ID, "signin-user").send_keys(user)
    driver.find_element(By.ID, "signin-password").send_keys(password)
    driver.find_element(By.ID, "signin-submit").click()


def wait_for(driver, predicate, timeout=20):
    return WebDriverWait(driver, timeout, ignored_exceptions=(Exception,)).until(predicate)


def status_text(driver):
    return driver.find_element(By.ID, "status").text


def go(driver, console, hash_):
    driver.get(f"{console.url}/#{hash_}")


def confirm(driver, expect):
    # The page may ask first (a bulk action by filter counts the matches): wait for it.
    alert = WebDriverWait(driver, 10, ignored_exceptions=(NoAlertPresentException,)).until(
        lambda d: d.switch_to.alert)
    assert alert.text == expect
    alert.accept()


def nothing_ran(driver):
    """No hostile markup became an element or ran: the only script is the page's own, no
    image, and no link to a javascript: URL."""
    assert driver.execute_script("return window.__pwned === undefined"), "a record's script ran"
    scripts = driver.execute_script("return [...document.scripts].map(s => s.getAttribute('src'))")
    assert scripts == ["/app.js"]
    assert driver.find_elements(By.TAG_NAME, "img") == []
    hrefs = driver.execute_script("return [...document.querySelectorAll('[href]')].map(a => a.getAttribute('href'))")
    assert not [h for h in hrefs if h.strip().lower().startswith("javascript:")], hrefs


@pytest.fixture
def topic_and_destination(unique, clean_destinations):
    topic, dest = f"cb.{unique}", f"cb-{unique}"
    yield topic, dest
    with connect() as conn:
        conn.execute("DELETE FROM wal_delivery.dead_letters WHERE topic LIKE %s", (f"%{unique}%",))


def test_signin_as_each_role_and_what_each_sees(console, browser, unique):
    go(browser, console, "overview")
    wait_for(browser, lambda d: d.find_element(By.ID, "signin-page").is_displayed())
    screenshot(browser, "signin")
    sign_in(browser, console, "console_oncall", "wrong password")
    wait_for(browser, lambda d: "wrong role or password" in status_text(d))

    sign_in(browser, console, "console_admin")
    wait_for(browser, lambda d: d.find_element(By.ID, "topics"))
    assert browser.find_element(By.ID, "who-roles").text == "(wal_delivery_admin, wal_delivery_processor)"
    go(browser, console, "archive")
    wait_for(browser, lambda d: d.find_element(By.ID, "archive-shown").text)
    screenshot(browser, "archive")
    browser.find_element(By.ID, "signout").click()
    wait_for(browser, lambda d: d.find_element(By.ID, "signin-page").is_displayed())

    for user in ("console_writer", "console_nobody"):
        sign_in(browser, console, user)
        wait_for(browser, lambda d: "permission denied" in status_text(d))
        assert status_text(browser).startswith("403: permission denied")
        assert browser.find_elements(By.ID, "topics") == []
        browser.find_element(By.ID, "signout").click()
        wait_for(browser, lambda d: d.find_element(By.ID, "signin-page").is_displayed())

    # On-call may look at the archive but not restore from it (the admin's job).
    sign_in(browser, console, "console_oncall")
    wait_for(browser, lambda d: d.find_element(By.ID, "topics"))
    go(browser, console, "archive")
    wait_for(browser, lambda d: d.find_element(By.ID, "archive"))
    csrf = browser.execute_async_script(
        "const done = arguments[0]; fetch('/api/session').then(r => r.json()).then(s => done(s.csrf));")
    got = browser.execute_async_script(
        "const done = arguments[1];"
        "fetch('/api/archive/restore', {method: 'POST', headers: {'Content-Type': 'application/json',"
        " 'X-CSRF-Token': arguments[0]}, body: JSON.stringify({object: 'x'})}).then(r => done(r.status));",
        csrf)
    assert got == 403


def test_a_real_dead_letter_is_inspected_replayed_and_delivered(tmp_path, kafka_bootstrap, console, browser,
                                                               topic_and_destination):
    topic, dest = topic_and_destination
    server = Destination(tmp_path)
    server.behave(status=400)
    workers = []
    key = f"{SCRIPT}-{dest}"
    payload = {"html": SCRIPT, "img": IMG, "link": JS_URL, "nested": {"k": HOSTILE}}
    try:
        with connect() as conn:
            make_topic(conn, topic)
            add_destination(conn, dest, server.url + "/hook", [topic],
                            retry_delays="{10 seconds,10 seconds,10 seconds}")
            conn.execute("SELECT wal_enqueue(%s, %s::jsonb, %s, %s, %s::jsonb)",
                         (topic, json.dumps(payload), key, HOSTILE, json.dumps({"x-evil": HOSTILE})))
            wait_all_stored(conn, topic, 1)
            wait_published(conn)
        for role in ("consume", "dlq", "retry"):
            workers.append(Worker(tmp_path, role, "--time-scale", "10", kafka_bootstrap=kafka_bootstrap))
        with connect() as conn:
            dl = wait_until(lambda: conn.execute("SELECT id FROM wal_delivery.dead_letters WHERE destination = %s",
                                                 (dest,)).fetchone(), 90, what="the dead letter")[0]

        sign_in(browser, console, "console_oncall")
        wait_for(browser, lambda d: d.find_element(By.ID, "topics"))
        go(browser, console, f"dead-letters?topic={topic}")
        row = wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, f"tr[data-id='{dl}']"))
        assert row.find_element(By.CSS_SELECTOR, "td.key").text == key, "the key as text"
        screenshot(browser, "dead-letters")
        row.find_element(By.LINK_TEXT, str(dl)).click()
        pre = wait_for(browser, lambda d: d.find_element(By.ID, "payload-text"))
        assert json.loads(pre.text) == payload, "pretty JSON, every character as sent"
        assert pre.text.startswith("{\n  ")
        # The DLQ message's headers, the key among them (the record's own headers and
        # message key stay in the main topic: test_hostile_text_in_every_field covers them).
        assert json.loads(browser.find_element(By.ID, "headers").text)["idempotency-key"] == key
        fields = {e.get_attribute("data-field"): e.text
                  for e in browser.find_elements(By.CSS_SELECTOR, "#dead-letter-fields dd")}
        assert (fields["idempotency_key"], fields["destination"], fields["last_error"]) == (key, dest, "HTTP 400")
        nothing_ran(browser)
        screenshot(browser, "dead-letter")

        server.behave(status=200)
        browser.find_element(By.ID, "replay").click()
        confirm(browser, f"Replay dead letter {dl}?")
        wait_for(browser, lambda d: "Replayed: queued for retry step 1 of " + dest in status_text(d))
        delivered = server.wait_for(2, path="/hook", timeout=60)
        assert delivered[-1]["status"] == 200 and json.loads(delivered[-1]["body"]) == payload
        with connect() as conn:
            wait_until(lambda: conn.execute("SELECT resolution FROM wal_delivery.dead_letters WHERE id = %s",
                                            (dl,)).fetchone()[0] == "replayed through retry step 1", 30,
                       what="the replay to be resolved")
            assert conn.execute("SELECT who, action FROM wal_delivery.audit_log WHERE target->>'id' = %s",
                                (str(dl),)).fetchall() == [("console_oncall", "replay")]
        browser.refresh()  # the page is this entry's already: load it again
        wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, "dd[data-field='resolution']").text
                 == "replayed through retry step 1")
        assert not browser.find_element(By.ID, "replay").is_enabled()

        # The overview's rates: consume's refused attempt (failed, then the DLQ) and the
        # retry worker's delivery of the replay, from delivery_stats (flushed every 10 s).
        go(browser, console, "overview")
        row = f"//table[@id='topics']//tr[td[1]='{topic}']"
        cells = lambda d: [c.text for c in d.find_elements(By.XPATH, row + "/td")]  # noqa: E731
        wait_for(browser, lambda d: cells(d)[4] == "1" and cells(d)[5] == "1", timeout=40)
        assert float(cells(browser)[3]) > 0, "deliveries per second"
        dest_row = f"//table[@id='destinations']//tr[td[1]='{dest}']/td"
        assert [c.text for c in browser.find_elements(By.XPATH, dest_row)][5:8] == ["1", "1", "1"]
        browser.refresh()  # the charts are drawn with the first refresh of the page
        chart = wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, f"div.topic-chart[data-topic='{topic}']"))
        bars = chart.find_elements(By.CSS_SELECTOR, "svg rect")
        assert len(bars) == 2 * 72, "6 hours of 5 minutes, deliveries and failures"
        assert [b for b in bars if float(b.get_attribute("height")) > 0], "the delivery and the failure drawn"
        nothing_ran(browser)
        screenshot(browser, "overview")
    finally:
        for w in workers:
            w.stop(signal.SIGKILL, timeout=5)
        server.stop()


def test_hostile_text_in_every_field_renders_as_text(console, browser, topic_and_destination, unique):
    topic = f"{HOSTILE}{unique}"
    with connect() as conn:
        ids = [r[0] for r in conn.execute(
            "SELECT wal_delivery.ingest_dead_letter(%s, 0, 9000000 + o, %s, %s || o, %s, NULL, %s, %s, 1, %s,"
            " %s::jsonb) FROM generate_series(1, 2) o",
            (HOSTILE, topic, HOSTILE, HOSTILE, HOSTILE, HOSTILE.encode(), HOSTILE,
             json.dumps({HOSTILE: HOSTILE}))).fetchall()]
    sign_in(browser, console, "console_oncall")
    wait_for(browser, lambda d: d.find_element(By.ID, "topics"))
    go(browser, console, "dead-letters?state=all")
    row = wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, f"tr[data-id='{ids[1]}']"))
    assert HOSTILE in row.text
    nothing_ran(browser)
    go(browser, console, f"dead-letter/{ids[0]}")
    pre = wait_for(browser, lambda d: d.find_element(By.ID, "payload-text"))
    assert pre.text == HOSTILE
    fields = {e.get_attribute("data-field"): e.text for e in browser.find_elements(By.CSS_SELECTOR, "#dead-letter-fields dd")}
    for f in ("topic", "destination", "content_type", "last_error", "kafka_topic"):
        assert HOSTILE in fields[f], f
    # The note a person types is shown back as text too (the audit page).
    browser.find_element(By.ID, "resolve-note").send_keys(HOSTILE)
    browser.find_element(By.ID, "resolve").click()
    wait_for(browser, lambda d: status_text(d) == "Resolved.")
    nothing_ran(browser)
    go(browser, console, "audit")
    # (the note stands in the target's JSON, its quotes escaped)
    wait_for(browser, lambda d: SCRIPT in d.find_element(By.ID, "audit-rows").text
             and JS_URL in d.find_element(By.ID, "audit-rows").text)
    nothing_ran(browser)
    screenshot(browser, "audit")


def test_bulk_resolve_and_pause_and_resume(console, browser, topic_and_destination):
    topic, dest = topic_and_destination
    with connect() as conn:
        make_topic(conn, topic)
        add_destination(conn, dest, "http://127.0.0.1:9/none", [topic])
        ids = [r[0] for r in conn.execute(
            "SELECT wal_delivery.ingest_dead_letter('dlq', 1, 8000000 + o, %s, 'bulk-' || o, %s, NULL,"
            " 'application/json', '{}', 1, 'HTTP 422', '{}') FROM generate_series(1, 5) o",
            (topic, dest)).fetchall()]
    sign_in(browser, console, "console_oncall")
    wait_for(browser, lambda d: d.find_element(By.ID, "topics"))
    go(browser, console, f"dead-letters?topic={topic}")
    wait_for(browser, lambda d: d.find_element(By.ID, "match-count").text == "5 match")
    browser.find_element(By.ID, "select-all").click()
    browser.find_element(By.ID, "bulk-note").send_keys("the customer was deleted")
    browser.find_element(By.ID, "bulk-resolve").click()
    confirm(browser, "Resolve 5 dead letters?")
    wait_for(browser, lambda d: status_text(d) == "Resolved 5 of 5.")
    with connect() as conn:
        assert conn.execute("SELECT count(*) FROM wal_delivery.dead_letters WHERE id = ANY(%s)"
                            " AND resolution = 'the customer was deleted'", (ids,)).fetchone()[0] == 5
        assert conn.execute("SELECT who, count FROM wal_delivery.audit_log WHERE action = 'resolve'"
                            " AND target->'ids' @> %s::jsonb", (json.dumps(ids),)).fetchall() == [("console_oncall", 5)]

    go(browser, console, f"destination/{dest}")
    wait_for(browser, lambda d: d.find_element(By.ID, "destination-state").text == "closed")
    browser.find_element(By.ID, "pause-reason").send_keys("their deploy")
    browser.find_element(By.ID, "pause").click()
    confirm(browser, f"Pause {dest}?")
    wait_for(browser, lambda d: d.find_element(By.ID, "destination-state").text == "open (paused)")
    assert "console_oncall" in browser.find_element(By.ID, "history").text
    screenshot(browser, "destination")
    browser.find_element(By.ID, "resume").click()
    confirm(browser, f"Resume {dest}?")
    wait_for(browser, lambda d: d.find_element(By.ID, "destination-state").text == "closed")
    with connect() as conn:
        assert conn.execute("SELECT action FROM wal_delivery.audit_log WHERE target->>'destination' = %s"
                            " ORDER BY id", (dest,)).fetchall() == [("pause",), ("resume",)]


def test_bulk_replay_and_resolve_by_filter_with_the_count_confirmed(console, browser, topic_and_destination):
    """Every unresolved dead letter the filter matches, however many pages: the
    confirmation says how many, and the audit log has one entry with the filter."""
    topic, dest = topic_and_destination
    with connect() as conn:
        make_topic(conn, topic)
        add_destination(conn, dest, "http://127.0.0.1:9/none", [topic])
        ingest = ("SELECT wal_delivery.ingest_dead_letter('dlq', 4, %s + o, %s, 'filter-' || %s || o, %s, NULL,"
                  " 'application/json', '{}', 1, 'HTTP 422', '{}') FROM generate_series(1, %s) o")
        conn.execute(ingest, (5000000, topic, "a", dest, 3))
    sign_in(browser, console, "console_oncall")
    wait_for(browser, lambda d: d.find_element(By.ID, "topics"))
    go(browser, console, f"dead-letters?topic={topic}")
    wait_for(browser, lambda d: d.find_element(By.ID, "match-count").text == "3 match")
    browser.find_element(By.ID, "filter-replay").click()
    confirm(browser, f"Replay all 3 unresolved dead letters matching topic {topic}?")
    wait_for(browser, lambda d: status_text(d) == f"Replayed 3 dead letters matching topic {topic}.")
    with connect() as conn:
        conn.execute(ingest, (5100000, topic, "b", dest, 2))
    go(browser, console, f"dead-letters?topic={topic}&destination={dest}")
    wait_for(browser, lambda d: d.find_element(By.ID, "match-count").text == "5 match")
    browser.find_element(By.ID, "filter-resolve").click()
    wait_for(browser, lambda d: status_text(d) == "Resolving needs a note saying how they were handled.")
    browser.find_element(By.ID, "bulk-note").send_keys("bad batch, sent again by hand")
    browser.find_element(By.ID, "filter-resolve").click()
    confirm(browser, f"Resolve all 5 unresolved dead letters matching topic {topic}, destination {dest}?")
    wait_for(browser, lambda d: status_text(d) == f"Resolved 5 dead letters matching topic {topic}, destination {dest}.")
    go(browser, console, f"dead-letters?topic={topic}&reason=422")
    wait_for(browser, lambda d: d.find_element(By.ID, "match-count").text == "0 match")
    browser.find_element(By.ID, "filter-replay").click()
    wait_for(browser, lambda d: "clear reason" in status_text(d))
    with connect() as conn:
        assert conn.execute("SELECT count(*) FROM wal_delivery.dead_letters WHERE topic = %s AND resolution"
                            " = 'bad batch, sent again by hand'", (topic,)).fetchone()[0] == 5
        assert conn.execute("SELECT who, action, count, target - 'note' FROM wal_delivery.audit_log"
                            " WHERE target->>'topic' = %s ORDER BY id", (topic,)).fetchall() == [
            ("console_oncall", "replay", 3, {"topic": topic}),
            ("console_oncall", "resolve", 5, {"topic": topic, "destination": dest})]


def test_the_archive_pages_by_keyset(console, browser):
    objects = [f"console-browser/{n:03d}.ndjson.gz" for n in range(130)]
    with connect() as conn:
        for n, obj in enumerate(objects):
            conn.execute("INSERT INTO wal_delivery.archive_objects (object, day, first_id, last_id, entries)"
                         " VALUES (%s, date '2030-01-01' + %s, %s, %s, 10) ON CONFLICT DO NOTHING",
                         (obj, n // 10, n * 10 + 1, n * 10 + 10))
    try:
        sign_in(browser, console, "console_oncall")
        wait_for(browser, lambda d: d.find_element(By.ID, "topics"))
        go(browser, console, "archive")
        shown = lambda d: [r.get_attribute("data-object") for r in d.find_elements(By.CSS_SELECTOR, "#archive-rows tr")]  # noqa: E731
        wait_for(browser, lambda d: len(shown(d)) == 100)
        assert shown(browser)[:2] == [objects[129], objects[128]], "the newest day first"
        browser.find_element(By.ID, "archive-more").click()
        wait_for(browser, lambda d: len(shown(d)) >= 130)
        mine = [o for o in shown(browser) if o.startswith("console-browser/")]
        assert mine == objects[::-1], "every object once, in order"
    finally:
        with connect() as conn:
            conn.execute("DELETE FROM wal_delivery.archive_objects WHERE object LIKE 'console-browser/%'")


def test_forged_requests_and_a_session_after_signout_change_nothing(tmp_path, console, browser,
                                                                   topic_and_destination):
    topic, dest = topic_and_destination
    with connect() as conn:
        [dl] = conn.execute("SELECT wal_delivery.ingest_dead_letter('dlq', 2, 7000000, %s, 'forged', %s, NULL,"
                            " 'text/plain', 'x', 1, 'HTTP 400', '{}')", (topic, dest)).fetchone()
    sign_in(browser, console, "console_oncall")
    wait_for(browser, lambda d: d.find_element(By.ID, "topics"))
    post = ("const done = arguments[arguments.length - 1];"
            "fetch(arguments[0], {method: 'POST', credentials: 'include', mode: arguments[1],"
            " headers: {'Content-Type': 'application/json'}, body: JSON.stringify({note: 'forged'})})"
            ".then(r => done(r.type === 'opaque' ? 'opaque' : r.status), e => done(String(e)));")
    resolve = f"{console.url}/api/dead-letters/{dl}/resolve"
    # From the console's own page but without the CSRF token: 403.
    assert browser.execute_async_script(post, resolve, "same-origin") == 403
    # From another origin's page (another port of the same host: same site, so the cookie
    # goes along): the Origin check refuses it.
    other = Destination(tmp_path)
    try:
        browser.get(other.url + "/_control/requests")
        browser.set_script_timeout(10)
        browser.execute_async_script(post, resolve, "no-cors")
    finally:
        other.stop()
    assert console.metric("wal_console_refused_total", why="cross_site") == 1
    assert console.metric("wal_console_refused_total", why="csrf") == 1
    with connect() as conn:
        assert conn.execute("SELECT resolved_at FROM wal_delivery.dead_letters WHERE id = %s", (dl,)).fetchone() == (None,)

    # After sign-out the old cookie is dead: the page asks to sign in again.
    go(browser, console, "overview")
    wait_for(browser, lambda d: d.find_element(By.ID, "topics"))
    cookie = browser.get_cookie("wal_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    browser.find_element(By.ID, "signout").click()
    wait_for(browser, lambda d: d.find_element(By.ID, "signin-page").is_displayed())
    browser.add_cookie({"name": "wal_console", "value": cookie["value"], "path": "/"})
    go(browser, console, "dead-letters")
    wait_for(browser, lambda d: d.find_element(By.ID, "signin-page").is_displayed())
    assert browser.find_element(By.ID, "page").is_displayed() is False


def test_the_overview_refreshes_without_a_reload(console, browser, topic_and_destination):
    topic, dest = topic_and_destination
    with connect() as conn:
        make_topic(conn, topic)
    sign_in(browser, console, "console_oncall")
    cell = f"//table[@id='topics']//tr[td[1]='{topic}']/td[8]"
    wait_for(browser, lambda d: d.find_element(By.XPATH, cell).text == "0")
    browser.execute_script("window.__same_page = true")
    with connect() as conn:
        conn.execute("SELECT wal_delivery.ingest_dead_letter('dlq', 3, 6000000 + o, %s, 'live-' || o, %s, NULL,"
                      " 'text/plain', 'x', 1, 'HTTP 400', '{}') FROM generate_series(1, 3) o", (topic, dest))
    wait_for(browser, lambda d: d.find_element(By.XPATH, cell).text == "3", timeout=15)
    assert browser.execute_script("return window.__same_page === true"), "counted without a reload"
