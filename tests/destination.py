#!/usr/bin/env python3
"""A sample HTTP destination for tests and the demo (standard library only).

It records every request it receives (method, path, headers, body, arrival time) and
answers as it is told: any status, slowly, with extra headers, or not at all (hang).

    tests/destination.py [--port 0] [--log FILE]   prints "listening on 127.0.0.1:PORT"

Control endpoints (never recorded):
    GET  /_control/requests[?path=/prefix]  the recorded requests as a JSON list
    POST /_control/behaviour                {"path": "/a", "status": 503, "delay_ms": 0,
                                             "hang": false, "headers": {...}, "times": N,
                                             "ratio": 0.3, "body_bytes": N}
        A behaviour applies to requests whose path starts with "path" (default: all);
        with "times" it applies to the next N matching requests only; with "ratio" to
        that fraction of them, drawn at random; "body_bytes" answers with a body of that
        many bytes, streamed. The newest matching behaviour wins.
        Each recorded request gets the "status" it was answered with.
    POST /_control/reset                    forget requests and behaviours
"""
import argparse
import base64
import json
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


class Recorder:
    """Requests seen and behaviours to apply, shared by the server's threads."""

    def __init__(self, log_path):
        self.lock = threading.Lock()
        self.requests = []
        self.behaviours = []
        self.log = open(log_path, "a", buffering=1) if log_path else None
        self.stopping = threading.Event()

    def record(self, entry):
        with self.lock:
            self.requests.append(entry)

    def write_log(self, entry):
        """Logged once its answer is decided, so the line carries the status."""
        with self.lock:
            if self.log:
                self.log.write(json.dumps(entry) + "\n")

    def behaviour_for(self, path):
        with self.lock:
            for b in reversed(self.behaviours):
                if path.startswith(b.get("path", "")):
                    if "ratio" in b and random.random() >= float(b["ratio"]):
                        continue
                    if "times" in b:
                        b["times"] -= 1
                        if b["times"] <= 0:
                            self.behaviours.remove(b)
                    return dict(b)
        return {}


def body_fields(raw):
    try:
        return {"body": raw.decode("utf-8")}
    except UnicodeDecodeError:
        return {"body_base64": base64.b64encode(raw).decode("ascii")}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real destinations do
    disable_nagle_algorithm = True  # headers and body go out in separate writes
    recorder = None

    def log_message(self, fmt, *args):  # the request log is the recorder's job
        pass

    def read_body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def send_json(self, status, value):
        body = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def control(self, raw):
        url = urlparse(self.path)
        rec = self.recorder
        if url.path == "/_control/requests" and self.command == "GET":
            prefix = parse_qs(url.query).get("path", [""])[0]
            with rec.lock:
                found = [r for r in rec.requests if r["path"].startswith(prefix)]
            return self.send_json(200, found)
        if url.path == "/_control/behaviour" and self.command == "POST":
            try:
                b = json.loads(raw or b"{}")
                if not isinstance(b, dict):
                    raise ValueError("a behaviour is a JSON object")
                int(b.get("status", 200))
            except (ValueError, TypeError) as e:
                return self.send_json(400, {"error": f"bad behaviour: {e}"})
            with rec.lock:
                rec.behaviours.append(b)
            return self.send_json(200, {"ok": True})
        if url.path == "/_control/reset" and self.command == "POST":
            with rec.lock:
                rec.requests.clear()
                rec.behaviours.clear()
            return self.send_json(200, {"ok": True})
        return self.send_json(404, {"error": "unknown control endpoint"})

    def handle_any(self):
        raw = self.read_body()
        if self.path.startswith("/_control/"):
            return self.control(raw)
        entry = {
            "method": self.command,
            "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "arrived_at": time.time(),
            **body_fields(raw),
        }
        self.recorder.record(entry)
        b = self.recorder.behaviour_for(self.path)
        if b.get("hang"):
            self.recorder.write_log(entry)
            # Hold the connection without answering until the client gives up.
            while not self.recorder.stopping.wait(0.5):
                pass
            return
        if b.get("delay_ms"):
            time.sleep(b["delay_ms"] / 1000.0)
        status = int(b.get("status", 200))
        entry["status"] = status
        self.recorder.write_log(entry)
        body = json.dumps({"status": status}).encode()
        size = int(b.get("body_bytes", len(body)))
        self.send_response(status)
        for k, v in (b.get("headers") or {}).items():
            self.send_header(k, str(v))
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        if "body_bytes" not in b:
            self.wfile.write(body)
            return
        chunk = b" " * (1 << 20)  # a huge answer, streamed
        try:
            while size > 0:
                self.wfile.write(chunk[:min(size, len(chunk))])
                size -= len(chunk)
        except OSError:
            pass  # the client gave up on it

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = handle_any


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: any free)")
    ap.add_argument("--log", help="also append every request as a JSON line to this file")
    args = ap.parse_args()

    Handler.recorder = Recorder(args.log)
    ThreadingHTTPServer.request_queue_size = 128  # the default 5 drops bursts of connects
    try:
        server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    except OSError as e:
        sys.exit(f"destination: cannot listen on 127.0.0.1:{args.port}: {e}")
    server.daemon_threads = True
    print(f"listening on 127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        Handler.recorder.stopping.set()


if __name__ == "__main__":
    main()
