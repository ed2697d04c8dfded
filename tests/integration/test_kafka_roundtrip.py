"""The real broker works end to end with librdkafka: what is produced with acks=all comes
back with the same key, value and headers."""
import uuid

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic


def test_produce_and_read_back(kafka_bootstrap):
    topic = "roundtrip." + uuid.uuid4().hex[:8]
    # The test broker creates no topic on request (auto.create.topics.enable=false).
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(20)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all",
                         "enable.idempotence": True})
    sent = {}
    reports = []
    for i in range(50):
        key, value = f"k{i}", f'{{"n": {i}}}'.encode()
        sent[key] = value
        producer.produce(topic, value=value, key=key, headers={"idempotency-key": f"idem-{i}"},
                         on_delivery=lambda err, msg: reports.append(err))
    assert producer.flush(30) == 0
    assert reports == [None] * 50

    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "rt-" + topic,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    got = {}
    try:
        for _ in range(300):
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            key = msg.key().decode()
            got[key] = msg.value()
            assert dict(msg.headers()) == {"idempotency-key": b"idem-" + key[1:].encode()}
            if len(got) == len(sent):
                break
    finally:
        consumer.close()
    assert got == sent
