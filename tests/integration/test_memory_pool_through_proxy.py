"""KIP-72 through the proxy: the byte budget for requests in flight, with real
producers to a real Tansu, and raw slow senders."""

from __future__ import annotations

import socket
import threading
import time
import uuid

import pytest
from confluent_kafka import Producer

from tests.clients import create_topic, produce
from tests.conftest import wait_until
from tests.integration.test_bad_input import rss_kib
from tests.raw_kafka import RawConnection, api_versions_frame

MIB = 1024 * 1024
POOL = {"queued.max.request.bytes": 2 * MIB, "socket.request.max.bytes": MIB}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def big_batches(
    bootstrap: str, topic: str, records: int, size: int, results: list[int], max_bytes: int = 950_000
) -> None:
    """One producer sending batches of ~900 KB (one Produce request each)."""
    delivered = 0

    def on_delivery(err: object, _msg: object) -> None:
        nonlocal delivered
        delivered += err is None

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.size": 900_000,
            "message.max.bytes": max_bytes,
            "enable.idempotence": True,
            "compression.type": "none",
        }
    )
    for i in range(records):
        producer.produce(topic, value=bytes([i % 251]) * size, on_delivery=on_delivery)
        producer.poll(0)
    producer.flush(120)
    results.append(delivered)


def test_twenty_producers_of_900_kb_batches_all_deliver_within_the_pool_bound(tansu, start_proxy) -> None:
    proxy = start_proxy(tansu.bootstrap, policies=POOL)
    topic = unique("pool")
    create_topic(proxy.bootstrap, topic, partitions=4)
    results: list[int] = []
    threads = [
        threading.Thread(target=big_batches, args=(proxy.bootstrap, topic, 30, 90_000, results)) for _ in range(20)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert results == [30] * 20  # every record of every producer delivered
    high_water = proxy.metric("kafka_admission_memory_pool_high_water_mark_bytes")
    assert MIB < high_water <= 3 * MIB  # the pool was used, and never beyond pool + largest request
    assert proxy.metric("kafka_admission_memory_pool_used_bytes") == 0  # everything returned
    assert proxy.metric(
        "kafka_admission_decisions_total", policy="memory_pool", action="wait", limit="queued.max.request.bytes",
        mode="enforce",
    ) > 0


def slow_sender(address: str, announced: int) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.sendall(announced.to_bytes(4, "big") + b"\0\x00\0\x09" + b"\0" * 60)  # a Produce header start
    return sock


def test_500_slow_senders_hold_no_more_than_the_pool_and_a_normal_client_is_served(tansu, start_proxy) -> None:
    proxy = start_proxy(tansu.bootstrap, policies={**POOL, "request.body.timeout.ms": 3000})
    topic = unique("slow")
    create_topic(proxy.bootstrap, topic)
    rss_before = rss_kib(proxy.process.pid)
    senders = [slow_sender(proxy.bootstrap, MIB) for _ in range(500)]
    try:
        wait_until(lambda: proxy.metric("kafka_admission_memory_pool_waiting_requests") >= 490, timeout=20)
        # Trickle: the senders that hold memory get a byte now and then, never enough.
        for sock in senders[:10]:
            sock.sendall(b"\0" * 100)
        grown_mib = (rss_kib(proxy.process.pid) - rss_before) / 1024
        # Stated bound: the pool (2 MiB) plus per connection its state and at most 64 KiB read ahead.
        assert grown_mib < 2 + 500 * 80 / 1024, grown_mib
        assert proxy.metric("kafka_admission_memory_pool_used_bytes") <= 3 * MIB
        started = time.monotonic()
        assert produce(proxy.bootstrap, topic, 10) == 10  # served once the stalled requests time out
        assert time.monotonic() - started < 20
        assert proxy.metric("kafka_admission_connection_failures_total", cause="request_body_timeout") >= 490
    finally:
        for sock in senders:
            sock.close()


def test_a_client_that_disconnects_mid_request_returns_its_bytes(tansu, start_proxy) -> None:
    proxy = start_proxy(tansu.bootstrap, policies=POOL)
    host, port = proxy.bootstrap.rsplit(":", 1)
    socks = []
    for _ in range(3):
        sock = socket.create_connection((host, int(port)))
        sock.sendall(MIB.to_bytes(4, "big") + b"\0" * 1000)
        socks.append(sock)
    wait_until(lambda: proxy.metric("kafka_admission_memory_pool_used_bytes") >= 2 * MIB)
    for sock in socks:
        sock.close()
    wait_until(lambda: proxy.metric("kafka_admission_memory_pool_used_bytes") == 0)
    assert proxy.metric("kafka_admission_memory_pool_waiting_requests") == 0
    with RawConnection(proxy.bootstrap) as conn:  # and the pool serves again
        conn.send(api_versions_frame(1))
        assert conn.read_response(18, 3).body.error_code == 0


def test_a_1_mib_request_is_served_while_small_requests_compete(tansu, start_proxy) -> None:
    proxy = start_proxy(
        tansu.bootstrap, policies={"queued.max.request.bytes": MIB + 200_000, "socket.request.max.bytes": MIB}
    )
    topic = unique("mixed")
    create_topic(proxy.bootstrap, topic, partitions=2)
    stop = threading.Event()

    def small_requests() -> None:
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "linger.ms": 0, "acks": 1})
        while not stop.is_set():
            producer.produce(topic, value=b"s" * 20_000)
            producer.poll(0.001)
        producer.flush(30)

    competitors = [threading.Thread(target=small_requests) for _ in range(8)]
    for t in competitors:
        t.start()
    try:
        time.sleep(1)
        results: list[int] = []
        big_batches(proxy.bootstrap, topic, 1, 1_000_000, results, max_bytes=1_040_000)  # one ~1 MB request
        assert results == [1]
    finally:
        stop.set()
        for t in competitors:
            t.join(60)


@pytest.mark.parametrize("mode", ["observe"])
def test_observe_mode_never_blocks_but_counts_would_be_waits(tansu, start_proxy, mode: str) -> None:
    proxy = start_proxy(tansu.bootstrap, policies={**POOL, "memory.pool.mode": mode})
    host, port = proxy.bootstrap.rsplit(":", 1)
    socks = [socket.create_connection((host, int(port))) for _ in range(4)]
    for sock in socks:
        sock.sendall(MIB.to_bytes(4, "big") + b"\0" * 100)
    wait_until(lambda: proxy.metric("kafka_admission_decisions_total", policy="memory_pool", mode="observe") >= 1)
    assert proxy.metric("kafka_admission_memory_pool_waiting_requests") == 0
    for sock in socks:
        sock.close()
