#!/usr/bin/env python3
"""A real OTLP/HTTP trace receiver for the tests and the benchmarks.

It takes POST /v1/traces with a JSON body and decodes it with the OpenTelemetry protocol's
own definitions (the opentelemetry-proto package): each body becomes an
opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest through protobuf's JSON
mapping, with unknown fields refused. As the OTLP JSON encoding tells receivers, trace and
span ids arrive as hex strings and are turned into their bytes first (protobuf's own JSON
mapping would read them as base64). A body that does not decode is answered 400 and kept
in `rejected`, so a test sees what was wrong.

In a test:  receiver = OtlpReceiver(); receiver.start(); ... receiver.spans() ...
As a program:  tests/otlp_receiver.py [--port 0]   prints "listening on 127.0.0.1:PORT",
then a line per request ("spans N" or "rejected: why") when --verbose.

behaviour: "ok" (200, the default), "status:NNN" (answers NNN), "hang" (reads the request
and never answers until the receiver stops or the behaviour changes).
"""
import argparse
import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

ID_FIELDS = {"traceId": 16, "spanId": 8, "parentSpanId": 8}


def hex_ids_to_base64(node):
    """OTLP JSON carries ids as hex; protobuf's JSON parser wants bytes as base64."""
    if isinstance(node, list):
        for item in node:
            hex_ids_to_base64(item)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key in ID_FIELDS and isinstance(value, str):
                raw = bytes.fromhex(value)  # ValueError: not hex
                if value and (len(raw) != ID_FIELDS[key] or value != value.lower()):
                    raise ValueError(f"{key} {value!r} is not {ID_FIELDS[key]} bytes of lowercase hex")
                node[key] = base64.b64encode(raw).decode()
            else:
                hex_ids_to_base64(value)


def decode_request(body):
    """The ExportTraceServiceRequest of a JSON body; ValueError/ParseError when it is not one."""
    document = json.loads(body)
    hex_ids_to_base64(document)
    message = trace_service_pb2.ExportTraceServiceRequest()
    json_format.ParseDict(document, message, ignore_unknown_fields=False)
    return message


class OtlpReceiver:
    def __init__(self, port=0, verbose=False):
        self.lock = threading.Lock()
        self.requests = []   # (arrival time, ExportTraceServiceRequest)
        self.rejected = []   # (arrival time, why)
        self.posts = 0       # every POST, answered or not
        self.behaviour = "ok"
        self.verbose = verbose
        self.released = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def answer(self, status, body=b""):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                with receiver.lock:
                    receiver.posts += 1
                    behaviour = receiver.behaviour
                if behaviour == "hang":
                    receiver.released.wait()
                    self.close_connection = True
                    return
                if self.path != "/v1/traces":
                    return self.answer(404)
                if self.headers.get("Content-Type", "").split(";")[0].strip() != "application/json":
                    receiver.reject(f"Content-Type {self.headers.get('Content-Type')!r}")
                    return self.answer(415)
                try:
                    message = decode_request(body)
                except (ValueError, json_format.ParseError) as e:
                    receiver.reject(str(e))
                    return self.answer(400, json.dumps({"message": str(e)}).encode())
                with receiver.lock:
                    receiver.requests.append((time.time(), message))
                if receiver.verbose:
                    print("spans", sum(len(ss.spans) for rs in message.resource_spans
                                       for ss in rs.scope_spans), flush=True)
                if behaviour.startswith("status:"):
                    return self.answer(int(behaviour[7:]))
                self.answer(200, b"{}")

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def reject(self, why):
        with self.lock:
            self.rejected.append((time.time(), why))
        if self.verbose:
            print("rejected:", why, flush=True)

    def start(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self):
        self.released.set()
        self.server.shutdown()
        self.server.server_close()

    def set_behaviour(self, behaviour):
        with self.lock:
            self.behaviour = behaviour
        if behaviour != "hang":
            self.released.set()
        else:
            self.released.clear()

    def spans(self):
        """Every decoded span so far, as (resource attributes dict, span) pairs."""
        with self.lock:
            messages = [m for _, m in self.requests]
        out = []
        for message in messages:
            for rs in message.resource_spans:
                resource = {a.key: any_value(a.value) for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    out.extend((resource, span) for span in ss.spans)
        return out


def any_value(value):
    """The Python value of an AnyValue (the kinds wal_delivery sends)."""
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def attributes(span):
    return {a.key: any_value(a.value) for a in span.attributes}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    receiver = OtlpReceiver(args.port, args.verbose)
    print(f"listening on 127.0.0.1:{receiver.port}", flush=True)
    try:
        receiver.server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
