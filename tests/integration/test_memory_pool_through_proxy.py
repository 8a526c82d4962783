"""KIP-72 through the proxy: the byte budget for requests in flight, with real
producers to a real Tansu, and raw slow senders."""

from __future__ import annotations

import socket
import threading
import time
import uuid

import pytest
from confluent_kafka import Producer
from kio.index import load_request_schema

from policies.api_keys import API_VERSIONS, METADATA
from proxy.protocol import wire
from tests.audit_files import read_events
from tests.clients import consume, create_topic, produce
from tests.conftest import wait_until
from tests.raw_kafka import RawConnection, api_versions_frame, fetch_frame, frame, metadata_frame

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
    assert (
        proxy.metric(
            "kafka_admission_decisions_total",
            policy="memory_pool",
            action="wait",
            limit="queued.max.request.bytes",
            mode="enforce",
        )
        > 0
    )


def slow_sender(address: str, announced: int) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.sendall(announced.to_bytes(4, "big") + b"\0\x00\0\x09" + b"\0" * 60)  # a Produce header start
    return sock


def test_500_slow_senders_hold_no_more_than_the_pool_and_a_normal_client_is_served(tansu, start_proxy) -> None:
    proxy = start_proxy(tansu.bootstrap, policies={**POOL, "request.body.timeout.ms": 3000})
    topic = unique("slow")
    create_topic(proxy.bootstrap, topic)
    rss_before = proxy.rss_kib()
    senders = [slow_sender(proxy.bootstrap, MIB) for _ in range(500)]
    try:
        wait_until(lambda: proxy.metric("kafka_admission_memory_pool_waiting_requests") >= 490, timeout=20)
        # Trickle: the senders that hold memory get a byte now and then, never enough.
        for sock in senders[:10]:
            sock.sendall(b"\0" * 100)
        grown_mib = (proxy.rss_kib() - rss_before) / 1024
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


def padded_api_versions(correlation_id: int, size: int) -> bytes:
    """An ApiVersions request of about ``size`` bytes (a long client software name): a request
    any broker answers at once, as large as a test needs."""
    schema = load_request_schema(API_VERSIONS, 3)
    body = schema(client_software_name="a" * size, client_software_version="1")
    return frame(API_VERSIONS, 3, correlation_id, body)


def test_a_connection_over_its_share_waits_while_another_is_served(tansu, start_proxy) -> None:
    """queued.max.request.bytes.per.connection through the proxy. Connection A holds a Fetch
    that Tansu long-polls for 8 s (an empty partition, min_bytes 1); Tansu answers a
    connection's requests in order, so A's next request (40 KB, small enough to sit in the
    sockets' buffers on its way to Tansu) is held behind it, and A's third (40 KB more: 80 KB
    over its 64 KiB share) must wait at the proxy, though the pool (4 MiB) has room. Meanwhile
    connection B's 40 KB requests are served one after another."""
    share, size = 64 * 1024, 40_000
    proxy = start_proxy(
        tansu.bootstrap,
        policies={
            "queued.max.request.bytes": 4 * MIB,
            "socket.request.max.bytes": MIB,
            "queued.max.request.bytes.per.connection": share,
        },
    )
    topic = unique("share")
    create_topic(proxy.bootstrap, topic)
    wait_metric = {"policy": "memory_pool", "action": "wait", "limit": "queued.max.request.bytes.per.connection"}
    with RawConnection(proxy.bootstrap, timeout=30) as a, RawConnection(proxy.bootstrap) as b:
        a.send(metadata_frame(1))
        topic_id = next(t.topic_id for t in a.read_response(METADATA, 12).body.topics if t.name == topic)
        a.send(fetch_frame(2, topic_id, max_wait_ms=8000))
        a.send(padded_api_versions(3, size))
        a.send(padded_api_versions(4, size))
        wait_until(lambda: proxy.metric("kafka_admission_decisions_total", **wait_metric) == 1, timeout=5)
        assert proxy.metric("kafka_admission_memory_pool_waiting_requests") == 1
        assert size < proxy.metric("kafka_admission_memory_pool_used_bytes") < share  # A's Fetch and 40 KB
        for correlation_id in range(3):  # B goes ahead of A's waiting request, three times
            b.send(padded_api_versions(correlation_id, size))
            assert wire.decode_response(b.read_frame(), API_VERSIONS, 3).header.correlation_id == correlation_id
        # Still within A's long poll: A's request still waits, and nothing of B's did.
        assert proxy.metric("kafka_admission_memory_pool_waiting_requests") == 1
        assert proxy.metric("kafka_admission_decisions_total", **wait_metric) == 1
        # Once Tansu answers the Fetch, A's requests follow, in order.
        assert [a.read_frame()[4:8] for _ in range(3)] == [n.to_bytes(4, "big") for n in (2, 3, 4)]
    wait_until(lambda: proxy.metric("kafka_admission_memory_pool_used_bytes") == 0)


def test_observe_mode_forwards_a_produce_over_the_budget_and_audits_the_would_be_wait(
    tansu, start_proxy, tmp_path
) -> None:
    """With the pool (1 MiB) held whole by a raw sender's unfinished 1 MiB request, enforcing
    would hold every request back for request.body.timeout.ms (60 s here). In observe mode a
    real producer's record goes through at once: read back straight from the broker, and the
    wait that enforcing would have made is counted and audited."""
    audit = tmp_path / "audit"
    proxy = start_proxy(
        tansu.bootstrap,
        policies={
            "queued.max.request.bytes": MIB,
            "socket.request.max.bytes": MIB,
            "memory.pool.mode": "observe",
            "request.body.timeout.ms": 60_000,
        },
        audit={"path": str(audit)},
    )
    topic = unique("observe")
    create_topic(tansu.bootstrap, topic)
    hog = slow_sender(proxy.bootstrap, MIB)
    try:
        wait_until(lambda: proxy.metric("kafka_admission_memory_pool_used_bytes") >= MIB)
        value = uuid.uuid4().bytes
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "acks": "all"})
        producer.produce(topic, value=value)
        assert producer.flush(15) == 0  # enforced, it would wait for the hog's 60 s
        assert proxy.metric("kafka_admission_memory_pool_used_bytes") >= MIB  # the hog still holds the pool
    finally:
        hog.close()
    assert consume(tansu.bootstrap, topic, unique("observe"), 1) == [value]  # at the broker
    would_wait = {"policy": "memory_pool", "action": "wait", "limit": "queued.max.request.bytes"}
    assert proxy.metric("kafka_admission_decisions_total", mode="observe", **would_wait) >= 1
    assert proxy.metric("kafka_admission_decisions_total", mode="enforce", policy="memory_pool") == 0
    assert proxy.metric("kafka_admission_memory_pool_waiting_requests") == 0

    audited = {
        "type": "decision",
        "policy": "memory_pool",
        "action": "wait",
        "mode": "observe",
        "limit_key": "queued.max.request.bytes",
    }

    def produce_audited() -> list[dict[str, object]]:
        return [e for e in read_events(audit) if audited.items() <= e.items()]

    assert wait_until(produce_audited)
