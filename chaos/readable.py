#!/usr/bin/env python3
"""When each record of the main topics could first be read from Kafka, one JSON line per
record read:

    {"id": "topic:idempotency-key", "at": ...}

    chaos/readable.py --bootstrap HOST:PORT,... --topics a,b,c --out FILE

A plain consumer, assigned every partition from the start (no group, so no coordinator to
wait for), committing nothing: it sees a record when any consumer could (the partition's high watermark passed it). The
verdict splits each record's delivery time at that point, into what the relay and Kafka
took and what the delivering workers took: a destination's neighbours share the second
part (the same workers, the same groups), while the first is shared by everything on the
machine. Started again by the run if librdkafka aborts; a restart reads from the start
again and the verdict keeps each record's first line."""
import argparse
import json
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition


def idempotency_key(message):
    for name, value in message.headers() or []:
        if name == "idempotency-key" and value is not None:
            return value.decode("utf-8", "replace")
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topics", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    consumer = Consumer({"bootstrap.servers": args.bootstrap, "group.id": "chaos-readable",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 10,
                         "socket.timeout.ms": 5000, "log_level": 0})
    topics = consumer.list_topics(timeout=30).topics
    consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING)
                     for t in args.topics.split(",") for p in topics[t].partitions])
    with open(args.out, "a", buffering=1) as f:
        while True:
            # One message a call: a batch call waits to fill its batch, and each record's
            # time would be that of the batch's last.
            message = consumer.poll(0.5)
            at = time.time()
            if message is None or message.error():
                continue
            key = idempotency_key(message)
            if key is not None:
                f.write(json.dumps({"id": f"{message.topic()}:{key}", "at": at}) + "\n")


if __name__ == "__main__":
    main()
