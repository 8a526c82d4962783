"""Real clients through the proxy to Apache Kafka itself: confluent-kafka,
kafka-python and the Java client (Apache Kafka's own perf-test and console
tools) produce and consume, in classic and KIP-848 consumer groups run by the
broker's own coordinator, and every broker address a client learns is the
proxy's (checked in each client's own view of its connections)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupType, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from tests.apache_kafka.broker import ApacheKafkaBroker, JavaParts
from tests.clients import (
    CLIENT_TIMEOUT_S,
    consume,
    create_topic,
    java_tool,
    kafka_python_brokers,
    kafka_python_roundtrip,
    produce_values,
    unique,
)

pytestmark = pytest.mark.apache_kafka
RECORDS = 300


def proxy_addresses(proxy: Any) -> set[str]:
    """Where a client of ``proxy`` may connect: its bootstrap and its port for node 1."""
    base = proxy.config["listeners"][0]["node_port_base"]
    return {proxy.bootstrap, f"127.0.0.1:{base + ApacheKafkaBroker.NODE_ID}"}


@pytest.fixture
def proxy(kafka: ApacheKafkaBroker, start_proxy: Any) -> Any:
    return start_proxy(kafka.bootstrap, node_ids=(ApacheKafkaBroker.NODE_ID,))


def group_type(broker: ApacheKafkaBroker, group: str) -> ConsumerGroupType:
    """The group's type as the broker's coordinator reports it (asked directly)."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    described = admin.describe_consumer_groups([group])[group].result(timeout=CLIENT_TIMEOUT_S)
    return described.type


def committed(broker: ApacheKafkaBroker, group: str, topic: str) -> int:
    """The offset ``group`` committed on partition 0 of ``topic``, as the broker has it."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    try:
        return int(consumer.committed([TopicPartition(topic, 0)], timeout=CLIENT_TIMEOUT_S)[0].offset)
    finally:
        consumer.close()


def test_confluent_kafka_classic_group_through_the_proxy_stays_on_the_proxy(kafka, proxy) -> None:  # type: ignore[no-untyped-def]
    topic, group = unique("ak-ck"), unique("ak-classic")
    create_topic(proxy.bootstrap, topic)
    values = [f"v{i}".encode() for i in range(RECORDS)]
    produced = produce_values(proxy.bootstrap, topic, values, acks="all")
    assert not produced.errors and sorted(v for _, v in produced.delivered) == sorted(values)
    # librdkafka's own view: every broker handle it opened is at a proxy address.
    seen = {name.split("/")[0] for name in produced.stats["brokers"]}
    assert seen and seen <= proxy_addresses(proxy), seen
    assert sorted(consume(proxy.bootstrap, topic, group, RECORDS)) == sorted(values)
    assert group_type(kafka, group) == ConsumerGroupType.CLASSIC
    assert committed(kafka, group, topic) == RECORDS


def test_confluent_kafka_kip848_group_through_the_proxy_is_run_by_the_broker(kafka, proxy) -> None:  # type: ignore[no-untyped-def]
    topic, group = unique("ak-848"), unique("ak-848")
    create_topic(proxy.bootstrap, topic)
    values = [f"r{i}".encode() for i in range(RECORDS)]
    assert not produce_values(proxy.bootstrap, topic, values).errors
    consumer = Consumer(
        {
            "bootstrap.servers": proxy.bootstrap,
            "group.id": group,
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    got: list[bytes] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while len(got) < RECORDS and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error() is not None:
                raise KafkaException(message.error())
            got.append(message.value())
        consumer.commit(asynchronous=False)
        assert group_type(kafka, group) == ConsumerGroupType.CONSUMER
    finally:
        consumer.close()
    assert sorted(got) == sorted(values)
    assert committed(kafka, group, topic) == RECORDS
    assert proxy.metric("kafka_admission_requests_total", api="consumer_group_heartbeat") >= 1


def test_kafka_python_through_the_proxy_stays_on_the_proxy(kafka, proxy) -> None:  # type: ignore[no-untyped-def]
    topic, group = unique("ak-kp"), unique("ak-kp")
    create_topic(proxy.bootstrap, topic)
    values = [f"k{i}".encode() for i in range(50)]
    assert kafka_python_roundtrip(proxy.bootstrap, topic, group, values) == values
    brokers = kafka_python_brokers(proxy.bootstrap)
    assert {f"{h}:{p}" for h, p in brokers.values()} <= proxy_addresses(proxy), brokers
    assert committed(kafka, group, topic) == len(values)


def test_the_java_client_produces_and_consumes_in_both_group_protocols_through_the_proxy(
    kafka: ApacheKafkaBroker, proxy: Any, java_parts: JavaParts, tmp_path: Path
) -> None:
    topic, classic, kip848 = unique("ak-java"), unique("ak-java-classic"), unique("ak-java-848")
    create_topic(proxy.bootstrap, topic)
    produced = java_tool(
        java_parts,
        tmp_path,
        "org.apache.kafka.tools.ProducerPerformance",
        "--topic",
        topic,
        "--num-records",
        str(RECORDS),
        "--record-size",
        "100",
        "--throughput",
        "-1",
        "--command-property",
        f"bootstrap.servers={proxy.bootstrap}",
        "acks=all",
    )
    assert produced.returncode == 0, produced.stderr[-2000:]
    assert f"{RECORDS} records sent" in produced.stdout
    perf = java_tool(
        java_parts,
        tmp_path,
        "org.apache.kafka.tools.ConsumerPerformance",
        "--bootstrap-server",
        proxy.bootstrap,
        "--topic",
        topic,
        "--num-records",
        str(RECORDS),
        "--group",
        classic,
        "--timeout",
        "30000",
    )
    assert perf.returncode == 0, perf.stderr[-2000:]
    # its CSV line: ..., data.consumed.in.nMsg (5th column), ...
    assert int(perf.stdout.strip().splitlines()[-1].split(",")[4]) == RECORDS
    console = java_tool(
        java_parts,
        tmp_path,
        "org.apache.kafka.tools.consumer.ConsoleConsumer",
        "--bootstrap-server",
        proxy.bootstrap,
        "--topic",
        topic,
        "--from-beginning",
        "--max-messages",
        str(RECORDS),
        "--group",
        kip848,
        "--command-property",
        "group.protocol=consumer",
        "--timeout-ms",
        "30000",
    )
    assert console.returncode == 0, console.stderr[-2000:]
    # ProducerPerformance's values: 100 random capital letters each.
    assert len([line for line in console.stdout.splitlines() if re.fullmatch("[A-Z]{100}", line)]) == RECORDS
    assert f"Processed a total of {RECORDS} messages" in console.stderr
    for run in (produced, perf, console):
        assert run.connected_to and run.connected_to <= proxy_addresses(proxy), run.connected_to
    assert group_type(kafka, classic) == ConsumerGroupType.CLASSIC
    assert group_type(kafka, kip848) == ConsumerGroupType.CONSUMER
