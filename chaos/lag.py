#!/usr/bin/env python3
"""Consumer lag per group and topic, from Kafka itself (committed offsets against the
partitions' end offsets), one JSON line every --interval seconds:

    {"t": ..., "kind": "kafka", "lag": {group: {topic: messages}}}

    chaos/lag.py --bootstrap HOST:PORT,... --groups '{"group": ["topic", ...]}' --out FILE

Its own process: librdkafka can abort (an assertion) when brokers die under a request, and
that must not take the chaos run down; the run starts it again. A sample that fails while
a broker is down is skipped."""
import argparse
import json
import time

from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec


def sample(admin, groups, timeout):
    md = admin.list_topics(timeout=timeout)
    tps = {}
    for topics in groups.values():
        for t in topics:
            if t in md.topics and not md.topics[t].error:
                tps[t] = [TopicPartition(t, p) for p in md.topics[t].partitions]
    every = [tp for v in tps.values() for tp in v]
    ends = {}
    if every:
        for tp, fut in admin.list_offsets({tp: OffsetSpec.latest() for tp in every},
                                          request_timeout=timeout).items():
            ends[(tp.topic, tp.partition)] = fut.result().offset
    out = {}
    for group, topics in groups.items():
        mine = [TopicPartition(t, tp.partition) for t in topics for tp in tps.get(t, [])]
        lag = {t: 0 for t in topics}
        if mine:
            res = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, mine)],
                                                    request_timeout=timeout)[group].result()
            for tp in res.topic_partitions:
                end = ends.get((tp.topic, tp.partition), 0)
                lag[tp.topic] += max(0, end - (tp.offset if tp.offset >= 0 else 0))
        out[group] = lag
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--groups", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--interval", type=float, default=2.0)
    args = ap.parse_args()
    groups = json.loads(args.groups)
    admin = AdminClient({"bootstrap.servers": args.bootstrap, "socket.timeout.ms": 5000, "log_level": 0})
    with open(args.out, "a", buffering=1) as f:
        while True:
            t = time.time()
            try:
                f.write(json.dumps({"t": t, "kind": "kafka", "lag": sample(admin, groups, 4)}) + "\n")
            except Exception:
                pass
            time.sleep(max(0.0, t + args.interval - time.time()))


if __name__ == "__main__":
    main()
