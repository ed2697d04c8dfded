#!/usr/bin/env python3
"""The chaos run's SQL generators: several clients, each its own connection as a writer
role, enqueueing with wal_enqueue and wal_enqueue_batch in transactions of several shapes,
some rolled back whole, some with a savepoint rolled back, some aborted by an error. Every
record is written to the ledger (one JSON line per record, per client file) with its fate:

    acked       COMMIT returned: the record must reach every subscribed destination
    rolledback  ROLLBACK (or ROLLBACK TO SAVEPOINT) undid it: it must reach nobody
    failed      the transaction failed before COMMIT was sent (aborted, or the server went
                away mid-transaction): it was never committed, so it must reach nobody
    indoubt     the connection broke while COMMIT was on its way: the verdict looks the
                record up in the outbox to learn whether it committed

and HTTP clients that send records to `wal-worker ingest` (through HAProxy), one per
request or as NDJSON batches, each with its Idempotency-Key; a 503 or a lost connection is
sent again with the same key (at most 3 times). Their fates:

    acked       answered 201 (in Kafka) or 202 (in the outbox), "path" says which
    unacked     never answered 2xx: it may or may not exist (Kafka may have taken it
                late), so it is neither required nor forbidden anywhere

    chaos/generate.py --conninfo CONNINFO --out DIR --topics a,b,c --rate 20 --clients 4
                      [--ingest 127.0.0.1:PORT --token T --http-rate 8 --http-clients 2]

Stops at SIGTERM after the transaction or request in hand (the ledger is complete when it
exits).
"""
import argparse
import http.client
import json
import random
import signal
import threading
import time
from pathlib import Path

import psycopg

SHAPES = [  # (name, weight)
    ("single", 40), ("batch", 22), ("multi", 15), ("rollback", 8), ("savepoint", 10), ("abort", 5),
]


class Client(threading.Thread):
    def __init__(self, name, conninfo, topics, rate, out, seed, stop):
        super().__init__(daemon=True)
        self.name_, self.conninfo, self.topics, self.rate = name, conninfo, topics, rate
        self.rng = random.Random(seed)
        self.stop = stop
        self.ledger = open(Path(out) / f"sql-{name}.jsonl", "a", buffering=1)
        self.seq = 0
        self.errors = 0
        self.conn = None

    # ------------------------------------------------------------------ records
    def new_record(self, topic):
        self.seq += 1
        key = f"{self.name_}-{self.seq}"
        payload = {"k": key, "client": self.name_, "n": self.seq, "at": time.time(),
                   "pad": "x" * self.rng.randint(20, 400)}
        return {"topic": topic, "key": key, "payload": json.dumps(payload)}

    def write(self, records, fate, started, acked_at=None):
        for r in records:
            self.ledger.write(json.dumps({"topic": r["topic"], "key": r["key"], "fate": fate,
                                          "s": started, "t": acked_at, "client": self.name_}) + "\n")

    def enqueue(self, records):
        """One wal_enqueue, or one wal_enqueue_batch when records share a topic and are many."""
        if len(records) == 1:
            r = records[0]
            self.conn.execute("SELECT wal_enqueue(%s, %s::jsonb, %s)", (r["topic"], r["payload"], r["key"]))
        else:
            self.conn.execute("SELECT wal_enqueue_batch(%s, %s::jsonb[], %s)",
                              (records[0]["topic"], [r["payload"] for r in records],
                               [r["key"] for r in records]))

    # ------------------------------------------------------------------ transactions
    def transaction(self, shape):
        """Runs one transaction; returns the records it enqueued. Writes the ledger."""
        topic = self.rng.choice(self.topics)
        keep, undone = [], []  # records whose fate COMMIT decides; records undone for sure
        started = time.time()
        stage = "before"
        try:
            self.conn.execute("BEGIN")
            if shape == "single":
                keep = [self.new_record(topic)]
                self.enqueue(keep)
            elif shape == "batch":
                keep = [self.new_record(topic) for _ in range(self.rng.randint(2, 12))]
                self.enqueue(keep)
            elif shape == "multi":
                for t in self.rng.sample(self.topics, k=min(len(self.topics), self.rng.randint(2, 3))):
                    rs = [self.new_record(t) for _ in range(self.rng.randint(1, 3))]
                    for r in rs:
                        self.enqueue([r])
                    keep += rs
            elif shape == "rollback":
                undone = [self.new_record(topic) for _ in range(self.rng.randint(1, 4))]
                self.enqueue(undone[:1])
                if len(undone) > 1:
                    self.enqueue(undone[1:])
                self.conn.execute("ROLLBACK")
                self.write(undone, "rolledback", started)
                return undone
            elif shape == "savepoint":
                before = [self.new_record(topic)]
                self.enqueue(before)
                keep += before
                self.conn.execute("SAVEPOINT chaos")
                inner = [self.new_record(t) for t in self.rng.sample(self.topics, k=2)]
                for r in inner:
                    self.enqueue([r])
                self.conn.execute("ROLLBACK TO SAVEPOINT chaos")
                undone = inner
                after = [self.new_record(topic) for _ in range(self.rng.randint(1, 3))]
                self.enqueue(after)
                keep += after
            elif shape == "abort":
                undone = [self.new_record(topic) for _ in range(self.rng.randint(1, 3))]
                self.enqueue(undone)
                try:  # an unknown topic: 42704, the transaction is aborted
                    self.conn.execute("SELECT wal_enqueue('chaos.no_such_topic', '{}'::jsonb)")
                except psycopg.errors.UndefinedObject:
                    pass
                self.conn.execute("ROLLBACK")
                self.write(undone, "failed", started)
                return undone
            stage = "commit"
            self.conn.execute("COMMIT")
        except psycopg.Error as e:
            # Before COMMIT was sent the transaction cannot have committed; when the
            # connection broke while COMMIT was on its way nobody knows; a COMMIT the
            # server answered with an error did not commit.
            lost_link = isinstance(e, psycopg.OperationalError) and stage == "commit"
            self.write(undone, "rolledback" if stage == "commit" else "failed", started)
            self.write(keep, "indoubt" if lost_link else "failed", started)
            raise
        acked = time.time()
        self.write(undone, "rolledback", started)
        self.write(keep, "acked", started, acked)
        return keep + undone

    def run(self):
        budget, last = 0.0, time.time()
        while not self.stop.is_set():
            now = time.time()
            budget = min(budget + (now - last) * self.rate, 50.0)
            last = now
            if budget < 1:
                time.sleep(min(0.5, (1 - budget) / self.rate))
                continue
            try:
                if self.conn is None:
                    self.conn = psycopg.connect(self.conninfo, autocommit=True, connect_timeout=3)
                shape = self.rng.choices([s for s, _ in SHAPES], weights=[w for _, w in SHAPES])[0]
                budget -= len(self.transaction(shape))
            except psycopg.Error:
                self.errors += 1
                try:
                    if self.conn is not None:
                        self.conn.close()
                except psycopg.Error:
                    pass
                self.conn = None
                self.stop.wait(0.3)
        if self.conn is not None:
            self.conn.close()
        self.ledger.close()


class HttpClient(threading.Thread):
    """Sends records to the ingest service (through the load balancer)."""

    def __init__(self, name, address, token, topics, rate, out, seed, stop):
        super().__init__(daemon=True)
        self.name_, self.token, self.topics, self.rate, self.stop = name, token, topics, rate, stop
        self.host, _, port = address.rpartition(":")
        self.port = int(port)
        self.rng = random.Random(seed)
        self.ledger = open(Path(out) / f"http-{name}.jsonl", "a", buffering=1)
        self.seq, self.errors, self.conn = 0, 0, None

    def post(self, path, body, headers):
        """(status, parsed body); (None, error) when the connection failed."""
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
            self.conn.request("POST", path, body=body, headers=headers)
            r = self.conn.getresponse()
            data = r.read()
            try:
                return r.status, json.loads(data)
            except ValueError:
                return r.status, data.decode(errors="replace")
        except (OSError, http.client.HTTPException) as e:
            self.conn = None
            return None, str(e)

    def write(self, topic, key, fate, started, acked_at=None, path=None):
        self.ledger.write(json.dumps({"topic": topic, "key": key, "fate": fate, "s": started, "t": acked_at,
                                      "client": self.name_, "path": path}) + "\n")

    def send(self, topic, n):
        """n records of topic, as one request (n == 1) or one NDJSON batch; returns n."""
        records = {}
        for _ in range(n):
            self.seq += 1
            key = f"{self.name_}-{self.seq}"
            records[key] = {"k": key, "client": self.name_, "n": self.seq, "at": time.time(),
                            "pad": "y" * self.rng.randint(20, 400)}
        started = time.time()
        auth = {"Authorization": f"Bearer {self.token}"}
        for attempt in range(3):
            if n == 1:
                (key, value), = records.items()
                status, body = self.post(f"/v1/topics/{topic}/records", json.dumps(value).encode(),
                                         {**auth, "Content-Type": "application/json", "Idempotency-Key": key})
                answers = [body] if status in (201, 202) and isinstance(body, dict) else []
            else:
                lines = "\n".join(json.dumps({"value": v, "idempotency_key": k}) for k, v in records.items())
                status, body = self.post(f"/v1/topics/{topic}/batch", lines.encode(),
                                         {**auth, "Content-Type": "application/x-ndjson"})
                answers = body.get("records", []) if isinstance(body, dict) else []
            now = time.time()
            for a in answers:
                if isinstance(a, dict) and a.get("path") and a.get("idempotency_key") in records:
                    records.pop(a["idempotency_key"])
                    self.write(topic, a["idempotency_key"], "acked", started, now, a["path"])
            if not records:
                return n
            if status is not None and status < 500:
                break  # refused: sending it again changes nothing
            self.errors += 1
            if self.stop.wait(0.3):
                break
        for key in records:
            self.write(topic, key, "unacked", started)
        return n

    def run(self):
        budget, last = 0.0, time.time()
        while not self.stop.is_set():
            now = time.time()
            budget = min(budget + (now - last) * self.rate, 50.0)
            last = now
            if budget < 1:
                time.sleep(min(0.5, (1 - budget) / self.rate))
                continue
            n = 1 if self.rng.random() < 0.7 else self.rng.randint(2, 10)
            budget -= self.send(self.rng.choice(self.topics), n)
        self.ledger.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conninfo", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--topics", required=True)
    ap.add_argument("--rate", type=float, default=20.0, help="records per second, all clients together")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ingest", help="ADDR:PORT of the ingest service (its load balancer)")
    ap.add_argument("--token", help="the ingest token")
    ap.add_argument("--http-rate", type=float, default=8.0)
    ap.add_argument("--http-clients", type=int, default=2)
    args = ap.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    Path(args.out).mkdir(parents=True, exist_ok=True)
    topics = args.topics.split(",")
    clients = [Client(f"c{i}", args.conninfo, topics, args.rate / args.clients, args.out,
                      args.seed * 1000 + i, stop) for i in range(args.clients)]
    https = [HttpClient(f"h{i}", args.ingest, args.token, topics, args.http_rate / args.http_clients,
                        args.out, args.seed * 1000 + 500 + i, stop)
             for i in range(args.http_clients if args.ingest and args.http_rate > 0 else 0)]
    for c in clients + https:
        c.start()
    while not stop.is_set():
        stop.wait(0.5)
    for c in clients + https:
        c.join(60)
    print(json.dumps({"errors": {c.name_: c.errors for c in clients + https}}), flush=True)


if __name__ == "__main__":
    main()
