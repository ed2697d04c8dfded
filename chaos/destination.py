#!/usr/bin/env python3
"""One destination of the chaos run: tests/destination.py's server and behaviours (status,
delay_ms, hang, headers, ratio, set with POST /_control/behaviour), with two changes for
long runs: nothing is kept in memory (GET /_control/requests answers []), and each request
is logged as one compact JSON line, once its answer is decided:

    {"at": arrival, "done": answer time, "s": status (null: hung), "id": Idempotency-Key,
     "a": X-Wal-Attempt, "proc": true when the body carries the chaos processor's mark}

    chaos/destination.py --log FILE [--port 0]     prints "listening on 127.0.0.1:PORT"
"""
import argparse
import importlib.util
import json
import sys
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("sample_destination", ROOT / "tests" / "destination.py")
sample = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sample)

# What chaos.enrich (the processing topic's SQL processor) puts into every payload.
PROCESSOR_MARK = '"enriched_by"'


class HangRelease:
    """Stands in for the recorder's `stopping` event, which a hanging request waits on:
    the request is let go (closed without an answer) once the newest behaviour no longer
    hangs, so hung threads do not pile up over a long run."""

    def __init__(self, recorder):
        self.recorder, self.stopped = recorder, False

    def wait(self, timeout):
        time.sleep(timeout)
        with self.recorder.lock:
            newest = self.recorder.behaviours[-1] if self.recorder.behaviours else {}
        return self.stopped or not newest.get("hang")

    def set(self):
        self.stopped = True


class CompactRecorder(sample.Recorder):
    def __init__(self, log_path):
        super().__init__(log_path)
        self.stopping = HangRelease(self)

    def record(self, entry):
        pass  # the log is the record; a 30-minute run would not fit in memory

    def write_log(self, entry):
        headers = entry["headers"]
        line = {"at": entry["arrived_at"], "done": time.time(), "s": entry.get("status"),
                "id": headers.get("idempotency-key"), "a": headers.get("x-wal-attempt"),
                "proc": PROCESSOR_MARK in entry.get("body", "")}
        with self.lock:
            self.log.write(json.dumps(line) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0, help="0: a free port (a restart passes the old one)")
    ap.add_argument("--log", required=True)
    args = ap.parse_args()
    sample.Handler.recorder = CompactRecorder(args.log)
    ThreadingHTTPServer.request_queue_size = 256
    try:
        server = ThreadingHTTPServer(("127.0.0.1", args.port), sample.Handler)
    except OSError as e:
        sys.exit(f"destination: cannot listen on 127.0.0.1:{args.port}: {e}")
    server.daemon_threads = True
    print(f"listening on 127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        sample.Handler.recorder.stopping.set()


if __name__ == "__main__":
    main()
