"""Running `wal-worker console` against the test environment: login roles whose password
the server checks (the test environment trusts every other login), the console process,
an HTTP client that keeps the session cookie, and headless Chromium."""
import http.client
import json
import os
import re
import subprocess
import time
from pathlib import Path

from conftest import connect
from consumer_helpers import WORKER, free_port
from relay_helpers import ensure_extension, wait_until

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / ".cache" / "test-output" / "console"
# Members of this group sign in with a password (scram) over TCP; see ensure_logins.
PASSWORD_GROUP = "wal_console_test"
PASSWORD = "console-test-pw"
# name -> the wal_delivery role it is a member of (None: none).
LOGINS = {"console_oncall": "wal_delivery_oncall", "console_admin": "wal_delivery_admin",
          "console_writer": "wal_delivery_writer", "console_nobody": None}
# A member of wal_delivery_oncall the server lets in without a password (trust).
TRUSTED_LOGIN = "console_trusted"


def ensure_logins():
    """The console signs in only roles whose password the server checks; the test
    environment trusts every login, so members of PASSWORD_GROUP get scram-sha-256 lines
    at the top of pg_hba.conf (cluster-wide, kept: no other test's login is a member)."""
    ensure_extension()
    with connect() as conn:
        conn.execute(f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{PASSWORD_GROUP}')"
                     f" THEN CREATE ROLE {PASSWORD_GROUP} NOLOGIN; END IF; END $$")
        for name, role in {**LOGINS, TRUSTED_LOGIN: "wal_delivery_oncall"}.items():
            conn.execute(f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{name}')"
                         f" THEN CREATE ROLE {name} LOGIN; END IF; END $$")
            conn.execute(f"ALTER ROLE {name} PASSWORD '{PASSWORD}'")
            if role:
                conn.execute(f"GRANT {role} TO {name}")
            if name != TRUSTED_LOGIN:
                conn.execute(f"GRANT {PASSWORD_GROUP} TO {name}")
        hba = Path(conn.execute("SHOW hba_file").fetchone()[0])
        lines = [f"host all +{PASSWORD_GROUP} 127.0.0.1/32 scram-sha-256",
                 f"host all +{PASSWORD_GROUP} ::1/128 scram-sha-256"]
        text = hba.read_text()
        if lines[0] not in text:
            hba.write_text("\n".join(lines) + "\n" + text)
            conn.execute("SELECT pg_reload_conf()")
            time.sleep(0.5)


class Console:
    """A `wal-worker console` process on a free port; its log goes under tmp_path."""

    def __init__(self, tmp_path, *args):
        self.admin_port = free_port()
        self.log_path = tmp_path / f"console-{self.admin_port}.log"
        conninfo = f"host=127.0.0.1 port={os.environ['PGPORT']} dbname={os.environ['PGDATABASE']}"
        self.log = open(self.log_path, "w")
        env = {k: v for k, v in os.environ.items() if k not in ("PGUSER", "PGPASSWORD")}
        self.proc = subprocess.Popen([WORKER, "console", "--listen", "127.0.0.1:0", "--admin-port",
                                      str(self.admin_port), "--db", conninfo, *args],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env)
        found = wait_until(lambda: re.search(r"event=started .*port=(\d+)", self.log_path.read_text()),
                           20, what="the console to start")
        self.port = int(found.group(1))
        self.url = f"http://127.0.0.1:{self.port}"

    def metric(self, name, **labels):
        conn = http.client.HTTPConnection("127.0.0.1", self.admin_port, timeout=5)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
        for line in text.splitlines():
            if line.startswith(want + " "):
                return float(line.split()[-1])
        return 0.0

    def output(self):
        return self.log_path.read_text()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)
        self.log.close()
        return self.proc.returncode


class Client:
    """One browser's worth of HTTP: keeps the session cookie and the CSRF token."""

    def __init__(self, console):
        self.console = console
        self.cookie = None
        self.csrf = None

    def request(self, method, path, body=None, headers=None, csrf=True):
        conn = http.client.HTTPConnection("127.0.0.1", self.console.port, timeout=30)
        h = {"Host": f"127.0.0.1:{self.console.port}", **(headers or {})}
        if self.cookie:
            h.setdefault("Cookie", self.cookie)
        if method == "POST":
            h.setdefault("Content-Type", "application/json")
            if csrf and self.csrf:
                h.setdefault("X-CSRF-Token", self.csrf)
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        conn.request(method, path, body=data, headers=h)
        resp = conn.getresponse()
        raw = resp.read()
        for k, v in resp.getheaders():
            if k.lower() == "set-cookie":
                value = v.split(";")[0]
                self.cookie = None if value.endswith("=") else value
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = raw
        return resp.status, parsed, dict((k.lower(), v) for k, v in resp.getheaders())

    def sign_in(self, user, password=PASSWORD):
        status, body, _ = self.request("POST", "/api/session", {"user": user, "password": password})
        if status == 200:
            self.csrf = body["csrf"]
        return status, body

    def get(self, path):
        status, body, _ = self.request("GET", path)
        return status, body

    def post(self, path, body=None, **kw):
        status, body, _ = self.request("POST", path, {} if body is None else body, **kw)
        return status, body


def chromium():
    """Debian's headless Chromium through its chromedriver (never a downloaded one); as
    root it needs --no-sandbox."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--disable-extensions"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=options)


def screenshot(driver, name):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))
