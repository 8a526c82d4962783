"""Idempotent producers through the proxy in front of Apache Kafka (whose storage
survives a restart, unlike Tansu's), through every fault in a row: LRU eviction of
their connections, a broker stall, the proxy restarted, the broker killed and
restarted. Afterwards every acknowledged record is read back from the broker, and
counted: each exactly once."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from tests.apache_kafka.broker import JavaParts
from tests.clients import create_topic, unique
from tests.conftest import wait_until
from tests.faults import FaultyApacheKafka, ProducerTraffic, assert_exactly_once, consumed_values, sockets_to
from tests.integration.test_faults import figures

pytestmark = pytest.mark.apache_kafka


@pytest.fixture(scope="module")
def faulty_kafka(java_parts: JavaParts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultyApacheKafka]:
    broker = FaultyApacheKafka(java_parts, Path(tmp_path_factory.mktemp("faulty-kafka")))
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def churn(bootstrap: str, stop: threading.Event) -> int:
    """New clients, five a second, each asking for metadata once: at the connection cap
    each new connection evicts the least recently used idle one (KIP-1015). A churn
    client can itself be evicted, by a producer reconnecting, before its answer: its
    request fails, and that is counted, not raised. (Raised in this thread, the error
    kept the client alive in pytest's report of it, reconnecting through the proxy.)"""
    answered = 0
    while not stop.wait(0.2):
        client = AdminClient({"bootstrap.servers": bootstrap})
        try:
            client.list_topics(timeout=5)
            answered += 1
        except KafkaException:
            pass
        del client  # destroyed now: no churn client outlives its turn
    return answered


def test_idempotent_producers_through_every_fault_lose_and_duplicate_nothing(
    faulty_kafka: FaultyApacheKafka, start_proxy: Any
) -> None:
    # Three producers hold one connection each (librdkafka drops its bootstrap connection once it
    # knows the broker): the cap is full from the start.
    proxy = start_proxy(
        faulty_kafka.bootstrap,
        node_ids=(FaultyApacheKafka.NODE_ID,),
        extra_args=["--drain-timeout", "10"],
        policies={"max.connections": 3},
    )
    topic = unique("faults")
    create_topic(proxy.bootstrap, topic, partitions=2)
    traffic = [ProducerTraffic(proxy.bootstrap, topic, name=f"p{i}").start() for i in range(3)]
    seen: dict[str, int] = {}

    def progressing(phase: str, records: int = 20, timeout: float = 60) -> None:
        marks = [len(t.acked) for t in traffic]
        wait_until(lambda: all(len(t.acked) >= n + records for t, n in zip(traffic, marks, strict=True)), timeout)
        seen[phase] = sum(len(t.acked) for t in traffic)

    try:
        progressing("start")

        # 1. LRU eviction of the producers' idle connections by new clients, for 4 s.
        stop = threading.Event()
        churner = threading.Thread(target=lambda: seen.__setitem__("churn_answered", churn(proxy.bootstrap, stop)))
        churner.start()
        time.sleep(4)
        stop.set()
        churner.join(30)
        evicted = proxy.metric("kafka_admission_decisions_total", action="evict", limit="max.connections")
        assert evicted > 0
        progressing("after eviction")

        # 2. The broker stalls for 3 s and resumes.
        faulty_kafka.stall()
        time.sleep(3)
        faulty_kafka.resume()
        progressing("after stall")

        # 3. The proxy restarted: SIGTERM drains it, a new one starts on the same ports.
        proxy.signal(signal.SIGTERM)
        assert proxy.wait(timeout=20) == 0
        proxy.start()
        progressing("after proxy restart")

        # 4. The broker killed (-9) under traffic and started again on its storage.
        faulty_kafka.kill()
        time.sleep(0.5)
        faulty_kafka.restart()
        progressing("after broker restart", timeout=90)
    finally:
        for t in traffic:
            t.stop()
    assert all(t.unflushed == 0 for t in traffic)
    assert [t.failed for t in traffic] == [[], [], []]
    # Counted at the broker itself, not through the proxy.
    acked = sum(len(t.acked) for t in traffic)
    values = consumed_values(faulty_kafka.bootstrap, topic, acked)
    assert_exactly_once(traffic, values)
    # Every client is gone: so is every connection the proxy had to the broker.
    wait_until(lambda: sockets_to(proxy.process.pid, faulty_kafka.port) == 0, timeout=10)
    figures(
        "idempotent through every fault (Apache Kafka)",
        acked=acked,
        consumed=len(values),
        lost=0,
        duplicated=0,
        evictions=int(evicted),
        churn_answered=seen.get("churn_answered"),
        phases="; ".join(f"{k}: {v}" for k, v in seen.items() if k != "churn_answered"),
    )
