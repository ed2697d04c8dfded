"""Helpers for the processor tests: a real HTTP transform service, and an audit of every
state transition of processing rows, written by a trigger, so tests can count claims and
processed transitions instead of trusting the worker's word."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from conftest import connect
from relay_helpers import make_topic

AUDIT_SQL = """
CREATE TABLE IF NOT EXISTS public.process_audit (
    outbox_id bigint NOT NULL, topic text NOT NULL, state text NOT NULL,
    lease_token bigint, app text, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE OR REPLACE FUNCTION public.process_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.process_audit (outbox_id, topic, state, lease_token, app)
    VALUES (NEW.id, NEW.topic, NEW.state::text, NEW.lease_token, current_setting('application_name'));
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS process_audit ON wal_delivery.outbox_rows;
CREATE TRIGGER process_audit AFTER UPDATE OF state ON wal_delivery.outbox_rows FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state AND NEW.topic LIKE 'proc.%')
    EXECUTE FUNCTION public.process_audit();
"""


# The login the process workers of the tests run as: a member of wal_delivery_worker and
# nothing more, as operations.md asks (the worker refuses to run as a superuser). SQL
# processors run as wal_delivery_processor, which gets the test schema proc_test.
WORKER_ROLE = "proc_worker"


def ensure_worker_role(conn):
    conn.execute(f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{WORKER_ROLE}')"
                 f" THEN CREATE ROLE {WORKER_ROLE} LOGIN; END IF; END $$")
    conn.execute(f"GRANT wal_delivery_worker TO {WORKER_ROLE}")
    conn.execute("CREATE SCHEMA IF NOT EXISTS proc_test")
    conn.execute("GRANT USAGE ON SCHEMA proc_test TO wal_delivery_processor")
    conn.execute("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA proc_test TO wal_delivery_processor")
    conn.execute("ALTER DEFAULT PRIVILEGES IN SCHEMA proc_test"
                 " GRANT USAGE, SELECT ON SEQUENCES TO wal_delivery_processor")


def install_audit():
    with connect() as conn:
        conn.execute(AUDIT_SQL)


def remove_audit():
    with connect() as conn:
        conn.execute("DROP TRIGGER IF EXISTS process_audit ON wal_delivery.outbox_rows")


def transitions(conn, topic, state):
    """{outbox id: number of times it entered state}, from the audit."""
    return dict(conn.execute("SELECT outbox_id, count(*) FROM public.process_audit"
                             " WHERE topic = %s AND state = %s GROUP BY 1", (topic, state)).fetchall())


def make_processing_topic(conn, name, kind, processor, **settings):
    make_topic(conn, name, processor_kind=kind, processor=processor, **settings)


class TransformServer:
    """An HTTP transform service on 127.0.0.1 in a thread of the test. `answer(key, call,
    body)` decides each reply as (status, body bytes, delay in seconds); call counts the
    requests for that idempotency key, from 1. Every request is recorded."""

    def __init__(self, answer=None):
        self.answer = answer or (lambda key, call, body: (200, wrap(body, call), 0))
        self.lock = threading.Lock()
        self.calls = {}
        self.requests = []
        self.stopping = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                key = self.headers.get("Idempotency-Key", "")
                with server.lock:
                    call = server.calls[key] = server.calls.get(key, 0) + 1
                    server.requests.append({"key": key, "call": call, "at": time.time(),
                                            "headers": dict(self.headers), "body": body})
                status, reply, delay = server.answer(key, call, body)
                if delay and server.stopping.wait(delay):
                    return
                self.send_response(status)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

        ThreadingHTTPServer.request_queue_size = 256
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/transform"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def count(self, key=None):
        with self.lock:
            return len([r for r in self.requests if key is None or r["key"] == key])

    def stop(self):
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def wrap(body, call):
    """What the default transform answers: the original JSON inside an envelope."""
    return json.dumps({"transformed": json.loads(body), "call": call}).encode()
