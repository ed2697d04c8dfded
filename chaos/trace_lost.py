"""Where the lost (record, destination) pairs of a chaos run went, written while Kafka
is still up: every copy of each lost record in the retry steps and the DLQ (topic,
partition, offset, its attempt and when it entered the step), the retry and DLQ groups'
committed offsets for those partitions, and the workers' log lines naming the record.

A lost pair is either a copy that never reached the next step (the hand-off's fault) or
one that is in a step below its group's commit and was never attempted there (the
consumer's); this file says which, so the next occurrence is a diagnosis, not a guess."""
import json
import uuid
from pathlib import Path

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

HEADERS = ("destination", "attempt", "step-entered-at", "source-topic", "last-error")


def lost_keys(pairs):
    """{idempotency key: {destination, ...}} from the verdict's "dest<-topic:key" pairs."""
    keys = {}
    for pair in pairs:
        dest, record = pair.split("<-", 1)
        keys.setdefault(record.split(":", 1)[1], set()).add(dest)
    return keys


def copies_in(bootstrap, topics, keys, timeout=60):
    """Every message of topics whose idempotency-key header is one of keys."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "chaos-trace-" + uuid.uuid4().hex,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    md = consumer.list_topics(timeout=30)
    parts = [TopicPartition(t, p) for t in topics if t in md.topics for p in md.topics[t].partitions]
    ends = {(tp.topic, tp.partition): consumer.get_watermark_offsets(tp, timeout=30)[1] for tp in parts}
    consumer.assign([TopicPartition(tp.topic, tp.partition, 0) for tp in parts])
    found, left = [], {k for k, end in ends.items() if end > 0}
    try:
        while left:
            msg = consumer.poll(1.0)
            if msg is None or msg.error():
                timeout -= 1
                if timeout <= 0:
                    break
                continue
            if msg.offset() + 1 >= ends[(msg.topic(), msg.partition())]:
                left.discard((msg.topic(), msg.partition()))
            headers = {k: (v or b"").decode("utf-8", "replace") for k, v in msg.headers() or []}
            if headers.get("idempotency-key") in keys:
                found.append({"topic": msg.topic(), "partition": msg.partition(), "offset": msg.offset(),
                              "key": headers["idempotency-key"], **{h: headers.get(h) for h in HEADERS}})
    finally:
        consumer.close()
    return found


def committed(bootstrap, groups, partitions):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    out = {}
    for group, topics in groups.items():
        mine = [TopicPartition(t, p) for t, p in partitions if t in topics]
        if not mine:
            continue
        res = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, mine)],
                                                request_timeout=30)[group].result()
        out[group] = {f"{tp.topic}[{tp.partition}]": tp.offset for tp in res.topic_partitions}
    return out


def trace(bootstrap, groups, lost_pairs, out):
    keys = lost_keys(lost_pairs)
    steps = groups["wal_delivery.retry"] + groups["wal_delivery.dlq"]
    copies = copies_in(bootstrap, steps, keys)
    partitions = {(c["topic"], c["partition"]) for c in copies}
    retry_groups = {g: groups[g] for g in ("wal_delivery.retry", "wal_delivery.dlq")}
    lines = {}
    for log in sorted((Path(out) / "workers").glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            for key in keys:
                if f'key="{key}"' in line or f"key={key} " in line or line.endswith(f"key={key}"):
                    lines.setdefault(key, []).append(f"{log.stem}: {line}")
    report = {"lost": {k: sorted(v) for k, v in keys.items()}, "copies": copies,
              "committed": committed(bootstrap, retry_groups, partitions), "log_lines": lines}
    (Path(out) / "lost-trace.json").write_text(json.dumps(report, indent=1))
    return report
