"""Real-client workloads for the tests: confluent-kafka (librdkafka) and kafka-python."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

# Tansu finishes a classic group's first join fast only with a short session timeout.
GROUP_CONF = {"session.timeout.ms": 6000, "auto.offset.reset": "earliest"}


def create_topic(bootstrap: str, topic: str, partitions: int = 1, **conf: Any) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, **conf})
    for future in admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)]).values():
        future.result(timeout=20)


def produce(bootstrap: str, topic: str, count: int, **conf: Any) -> int:
    """Produce ``count`` records; returns how many the broker acknowledged."""
    delivered = 0
    errors: list[Any] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        nonlocal delivered
        if err is None:
            delivered += 1
        else:
            errors.append(err)

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, **conf})
    for i in range(count):
        producer.produce(topic, key=str(i).encode(), value=f"record-{i}".encode(), on_delivery=on_delivery)
        producer.poll(0)
    remaining = producer.flush(30)
    assert remaining == 0, f"{remaining} records still queued; errors: {errors[:3]}"
    return delivered


def consume(bootstrap: str, topic: str, group: str, count: int, timeout: float = 30, **conf: Any) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, **GROUP_CONF, **conf})
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                raise KafkaException(message.error())
            values.append(message.value())
    finally:
        consumer.close()
    return values


def kafka_python_roundtrip(bootstrap: str, topic: str, group: str, count: int, **conf: Any) -> list[bytes]:
    """Produce with kafka-python, then consume in a group with kafka-python."""
    from kafka import KafkaConsumer, KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", **conf)
    for i in range(count):
        producer.send(topic, f"kp-{i}".encode())
    producer.flush(timeout=30)
    producer.close()
    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
        session_timeout_ms=6000, heartbeat_interval_ms=1000, consumer_timeout_ms=20000, **conf,
    )
    values = []
    for message in consumer:
        values.append(message.value)
        if len(values) >= count:
            break
    consumer.close()
    return values
