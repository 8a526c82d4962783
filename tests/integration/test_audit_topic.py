"""The audit topic sink (audit.topic) inside the real proxy (subprocess) with real Tansu
brokers and real clients: events read back from the topic with a consumer are valid v2
events keyed by the instance id; the producer is no client of the proxy; and while the
audit topic's broker is down the proxy keeps forwarding, drops and counts audit events
with bounded memory, and delivers again when the broker is back."""

from __future__ import annotations

import json
import socket
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

from demo.tansu import TansuBroker, free_port
from tests.audit_files import assert_valid
from tests.clients import create_topic, produce, unique
from tests.conftest import wait_until

LONG_ID = "c" * 250  # over KIP-1233's default 249: one identifier_limits decision per request


def read_topic(
    bootstrap: str, topic: str, until: Callable[[list[dict[str, Any]]], bool], timeout: float = 30.0
) -> list[tuple[bytes | None, dict[str, Any]]]:
    """The records of ``topic`` from its start, (key, the JSON value), read until ``until``
    holds for the values (Tansu's high watermark lags what a fetch returns: not a stop rule)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("reader"), "enable.auto.commit": False})
    try:
        md = consumer.list_topics(topic, timeout=10).topics[topic]
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in md.partitions])
        records: list[tuple[bytes | None, dict[str, Any]]] = []
        deadline = time.monotonic() + timeout
        while not until([v for _, v in records]):
            assert time.monotonic() < deadline, (
                f"{len(records)} records read in {timeout}s, by instance and type: "
                f"{sorted(Counter((v['instance'], v['type']) for _, v in records).items())}; the last: {records[-3:]}"
            )
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                records.append((message.key(), json.loads(message.value() or b"")))
        return records
    finally:
        consumer.close()


def delivered(proxy: Any, **labels: str) -> float:
    return float(proxy.metric("kafka_admission_audit_events_total", sink="topic", **labels))


def test_the_topic_sink_produces_valid_v2_events_keyed_by_the_instance(tansu, start_proxy) -> None:  # type: ignore[no-untyped-def]
    topic = unique("audit-topic")
    proxy = start_proxy(
        tansu.bootstrap,  # audit.bootstrap_servers defaults to the upstream's
        policies={"resource.identifier.limit.enable": True, "resource.identifier.limit.mode": "observe"},
        audit={"topic": topic, "instance_id": "proxy-topic-1", "window": {"seconds": 0.5}},
    )
    # Before any client: the proxy created the topic (a week's retention) and delivered
    # observation windows to it, and not one of its connections went through a listener.
    wait_until(lambda: delivered(proxy, type="window") >= 1, timeout=30)
    assert proxy.metric("kafka_admission_connections_accepted_total") == 0
    assert proxy.metric("kafka_admission_connections_active") == 0
    resource = ConfigResource("topic", topic)
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    described = admin.describe_configs([resource])[resource].result(10)
    assert described["retention.ms"].value == "604800000" and described["cleanup.policy"].value == "delete"

    target = unique("traffic")
    create_topic(proxy.bootstrap, target)
    assert produce(proxy.bootstrap, target, 3, **{"client.id": LONG_ID}) == 3
    wait_until(lambda: delivered(proxy, type="decision") >= 1, timeout=30)
    decided = proxy.metric("kafka_admission_decisions_total", policy="identifier_limits")
    assert proxy.metric("kafka_admission_audit_events_dropped_total", sink="topic") == 0
    proxy.stop()
    assert proxy.returncode == 0, proxy.log()

    # Everything queued was delivered at stop: as many decisions in the topic as decided.
    # With workers, each instance's events are in order in its key's partition, not across them;
    # a worker the kernel gave no connection has no event at all (windows carry only traffic).
    instances = proxy.audit_instances("proxy-topic-1")

    def decisions_and_last_window(events: list[dict[str, Any]]) -> bool:
        decisions = [e for e in events if e["type"] == "decision"]
        last = {e["instance"]: e["type"] for e in events}  # each instance's last, partial window
        return len(decisions) >= decided and "proxy-topic-1" in last and set(last.values()) == {"window"}

    records = read_topic(tansu.bootstrap, topic, decisions_and_last_window)
    events = [value for _, value in records]
    assert_valid(events)
    # Keyed by the instance that made each event: with workers, the supervisor's windows
    # are the proxy's instance and each worker's events its own <instance>-w<i>.
    assert all(key == value["instance"].encode() for key, value in records)
    wrote = {e["instance"] for e in events}
    assert "proxy-topic-1" in wrote and wrote <= instances
    decisions = [e for e in events if e["type"] == "decision"]
    assert len(decisions) == decided > 0
    assert all(d["policy"] == "identifier_limits" and d["client_id"] == LONG_ID for d in decisions)
    assert {d["instance"] for d in decisions} <= proxy.deciding_instances("proxy-topic-1")
    assert {e["type"] for e in events} == {"decision", "connection", "window"}


def _churn(bootstrap: str, count: int) -> None:
    """``count`` connections opened and closed: two audit events each (open, close)."""
    host, port = bootstrap.rsplit(":", 1)
    for _ in range(count):
        socket.create_connection((host, int(port)), timeout=5).close()


def test_with_the_audit_broker_down_the_proxy_forwards_drops_and_counts_then_delivers_again(  # type: ignore[no-untyped-def]
    tansu, start_proxy
) -> None:
    """Two brokers: the upstream (the session's Tansu) and the audit topic's own, stopped
    and started again on the same port. Sizes: queue_events 2000, librdkafka's buffer
    2000 messages: each flood of 3000 connections (per worker) makes 6000 events, far over both."""
    audit_broker = TansuBroker(port=free_port()).start()
    try:
        topic = unique("audit-down")
        proxy = start_proxy(
            tansu.bootstrap,
            policies={"resource.identifier.limit.enable": True, "resource.identifier.limit.mode": "observe"},
            audit={
                "topic": topic,
                "instance_id": "proxy-down",
                "bootstrap_servers": [audit_broker.bootstrap],
                "queue_events": 2000,
                "producer": {"queue.buffering.max.messages": 2000, "message.timeout.ms": 5000},
            },
        )
        # With workers the connections are spread over them, each an instance with its own queue
        # and producer buffer: each flood is as many connections per worker.
        instances = proxy.audit_instances("proxy-down")
        serving = max(1, len(instances) - 1)  # the supervisor serves no connection
        target = unique("traffic")
        create_topic(proxy.bootstrap, target)
        assert produce(proxy.bootstrap, target, 2, **{"client.id": LONG_ID}) == 2
        wait_until(lambda: delivered(proxy, type="decision") >= 1, timeout=30)
        assert proxy.metric("kafka_admission_audit_events_dropped_total", sink="topic") == 0

        audit_broker.stop()
        # The data path does not care: produce through the proxy still works.
        started = time.monotonic()
        assert produce(proxy.bootstrap, target, 5, **{"client.id": LONG_ID}) == 5
        forward_s = time.monotonic() - started
        _churn(proxy.bootstrap, 3000 * serving)
        wait_until(lambda: proxy.metric("kafka_admission_audit_events_dropped_total", sink="topic") > 1000, timeout=30)
        rss_after_first = proxy.rss_kib() * 1024
        _churn(proxy.bootstrap, 3000 * serving)
        # Bounded: the queue and librdkafka's buffer are full after the first flood; the second
        # one's 6000 events are dropped, not held (6000 events held would be several MB;
        # measured: 16 KiB of growth on 85 MB). Each instance holds at most 4000 (with workers the
        # supervisor's too: it writes the connections' open events, each worker their closes).
        wait_until(
            lambda: (
                proxy.metric("kafka_admission_audit_events_dropped_total", sink="topic")
                >= serving * 12000 - len(instances) * 4000 - 200
            )
        )
        grown = proxy.rss_kib() * 1024 - rss_after_first
        assert grown < 2_000_000, f"RSS grew {grown} bytes over {6000 * serving} dropped events"
        assert proxy.metric("kafka_admission_audit_queue_events", sink="topic") <= 2000 * len(instances)
        # Said at a limited rate: a few lines, not one per event or reconnect.
        log = proxy.log()
        assert "audit topic" in log and log.count("audit topic") < 50, log[-3000:]
        # Generous (measured ~0.5 s): forwarding never waits on the audit topic.
        assert forward_s < 30, f"produce through the proxy took {forward_s:.1f}s with the audit broker down"

        # Back (a new, empty broker on the same port): events flow again.
        audit_broker = TansuBroker(port=audit_broker.port).start()
        # Events recorded while the producer still holds the outage's records (until they time
        # out, message.timeout.ms 5 s here) or backs off are dropped too: new events are made
        # until one arrives.
        before = delivered(proxy, type="decision")

        def a_new_decision_delivered() -> bool:
            assert produce(proxy.bootstrap, target, 1, **{"client.id": "after-" + LONG_ID}) == 1
            return delivered(proxy, type="decision") > before

        wait_until(a_new_decision_delivered, timeout=60, interval=1)
        records = read_topic(
            audit_broker.bootstrap, topic, lambda events: any(e.get("client_id") == "after-" + LONG_ID for e in events)
        )
        assert all(k == v["instance"].encode() for k, v in records)
        assert {v["instance"] for _, v in records} <= instances
        assert_valid([v for _, v in records])
    finally:
        audit_broker.stop()
