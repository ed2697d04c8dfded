"""Fuzzing what the workers read from Kafka headers: messages with random and adversarial
header sets (missing, empty, huge, out-of-range numbers, invalid UTF-8, NUL bytes, line
breaks, forged log fields, duplicate names) go to a main topic (the consumer), to a retry
step (the retry consumer) and to the DLQ topic (the dlq worker) for a fixed time. Every
message must end delivered, in dead_letters, or (when its headers ask for a later
attempt) waiting in its retry step; every worker lives; every log line is one event.

The seed is printed and can be replayed with WAL_FUZZ_SEED; WAL_FUZZ_SECONDS sets how
long messages are generated (default 15)."""
import os
import random
import time

from confluent_kafka import Producer

from conftest import Destination, connect
from consumer_helpers import add_destination, wait_published
from relay_helpers import make_topic, wait_until
from retry_helpers import Fleet
from test_log import parse_logfmt

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
HEADER_NAMES = ["idempotency-key", "source-topic", "content-type", "outbox-id", "created-at",
                "destination", "attempt", "step-entered-at", "step-jitter-ms", "not-before",
                "last-error", "source-partition", "source-offset"]


def hostile_value(rng, unique):
    choices = [
        b"", b"0", b"-1", b"1" * 40, b"99999999999999999999", b"1e20", b" 7", b"NaN",
        b"\xff\xfe\xfd", b"\xc3\x28", b"\xe2\x82", b"a\x00b", b"line\r\nbreak", b"\t",
        b"x level=error event=forged", b'"quoted" \\ back', "ünïcødé €".encode(),
        os.urandom(rng.randint(1, 64)), b"k" * rng.randint(300, 5000),
        str(int(time.time() * 1000)).encode(), str(int(time.time() * 1000) + 10 ** 12).encode(),
        f"fuzz-{unique}".encode(),
    ]
    return rng.choice(choices)


def hostile_headers(rng, unique, base):
    """base (the headers a real message of that kind carries), then random damage."""
    headers = list(base)
    for _ in range(rng.randint(0, 6)):
        action = rng.random()
        if action < 0.4 and headers:  # replace a value
            i = rng.randrange(len(headers))
            headers[i] = (headers[i][0], hostile_value(rng, unique))
        elif action < 0.6 and headers:  # drop one
            headers.pop(rng.randrange(len(headers)))
        elif action < 0.8:  # add (maybe a duplicate name after the real one)
            headers.append((rng.choice(HEADER_NAMES), hostile_value(rng, unique)))
        else:  # a name nobody knows, odd bytes included
            headers.append((rng.choice(["x-\u00e9", "", "a" * 300, "with space"]), hostile_value(rng, unique)))
    return headers


def unique_keys(headers, i):
    """Every idempotency-key value (hostile or not, repeated names included) made this
    message's own by a suffix; the rest of the damage stays."""
    return [(n, v + b"-%d" % i if n == "idempotency-key" else v) for n, v in headers]


def test_random_and_adversarial_headers_never_lose_a_message_or_a_worker(tmp_path, kafka_bootstrap, unique):
    seed = int(os.environ.get("WAL_FUZZ_SEED", random.randrange(1 << 30)))
    seconds = float(os.environ.get("WAL_FUZZ_SECONDS", "15"))
    print(f"header fuzz seed {seed} (replay with WAL_FUZZ_SEED={seed})")
    rng = random.Random(seed)
    topic, name = f"fuzz.{unique}", f"fuzz-{unique}"
    dest = Destination(tmp_path)
    fleet = Fleet(tmp_path, kafka_bootstrap)
    try:
        with connect() as conn:
            make_topic(conn, topic)
            add_destination(conn, name, dest.url + "/f", [topic], secret=SECRET)
            wait_published(conn)
            partition, retry_prefix, dlq = conn.execute(
                "SELECT d.retry_partition, s.retry_topic_prefix, s.dlq_topic FROM wal_delivery.destinations d,"
                " wal_delivery.settings s WHERE d.name = %s", (name,)).fetchone()
        workers = fleet.start_ready("consume", "retry", "dlq")
        p = Producer({"bootstrap.servers": kafka_bootstrap, "message.max.bytes": 2000000})
        sent = {}  # payload -> where it went
        sent_headers = {}
        now_ms = str(int(time.time() * 1000) - 60000).encode()
        deadline = time.time() + seconds
        i = 0
        while time.time() < deadline:
            payload = f"fuzz-{unique}-{i}".encode()
            kind = rng.choice(["main", "retry", "dlq"])
            key = f"k{i}".encode()
            if kind == "main":
                base = [("idempotency-key", key), ("source-topic", topic.encode()),
                        ("content-type", b"application/json")]
                # Keys stay unique per message: the same key twice on a topic is one record,
                # rightly delivered once (the consumer's dedupe).
                headers = unique_keys(hostile_headers(rng, unique, base), i)
                p.produce(topic, payload, headers=headers)
            elif kind == "retry":
                base = [("idempotency-key", key), ("source-topic", topic.encode()),
                        ("destination", name.encode()), ("attempt", b"1"), ("step-entered-at", now_ms)]
                headers = hostile_headers(rng, unique, base)
                p.produce(f"{retry_prefix}1", payload, partition=partition, headers=headers)
            else:
                base = [("idempotency-key", key), ("source-topic", topic.encode()),
                        ("destination", name.encode()), ("attempt", b"2"), ("last-error", b"HTTP 400")]
                # Unique too: the same record's failure at the same destination, while its
                # dead letter is open, is that dead letter (dead_letters_open_failure).
                headers = unique_keys(hostile_headers(rng, unique, base), i)
                p.produce(dlq, payload, headers=headers)
            sent[payload.decode()] = kind
            sent_headers[payload.decode()] = headers
            i += 1
            p.poll(0)
            time.sleep(0.02)
        p.flush(30)
        print(f"header fuzz: {len(sent)} messages")

        def unaccounted():
            delivered = {r["body"] for r in dest.requests("/f")}
            with connect() as conn:
                dead = {r[0] for r in conn.execute(
                    "SELECT convert_from(payload, 'UTF8') FROM wal_delivery.dead_letters"
                    " WHERE position(%s::bytea in payload) > 0", (f"fuzz-{unique}".encode(),))}
            return {k: v for k, v in sent.items() if k not in delivered and k not in dead}

        # Retry messages whose headers ask for a later attempt (a not-before or step time
        # far ahead) may rightly still wait; everything else must be accounted for.
        try:
            wait_until(lambda: not {k for k, v in unaccounted().items() if v != "retry"}, 120,
                       what="every main and DLQ message delivered or in dead_letters")
        except AssertionError:
            missing = {k: v for k, v in unaccounted().items() if v != "retry"}
            for k in list(missing)[:8]:
                print("missing", missing[k], k, [(n, v[:60]) for n, v in sent_headers[k]])
            raise
        waiting_retries = [k for k, v in unaccounted().items() if v == "retry"]
        assert len(waiting_retries) <= max(3, len(sent) // 20), \
            f"{len(waiting_retries)} retry messages neither delivered nor dead"
        for w in workers:
            assert w.proc.poll() is None, f"the {w.log_path.name} worker died:\n{w.output()[-2000:]}"
            for line in w.output().splitlines():
                fields = parse_logfmt(line)  # one event a line, whatever the headers held
                assert fields.get("event") != "forged", line
    finally:
        fleet.stop_all()
        dest.stop()
