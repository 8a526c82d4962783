"""KIP-498 through the proxy: response size guard and named protocol mismatches."""

from __future__ import annotations

import io
import logging
import math
import socket
import ssl
import subprocess
import time
import uuid
from collections import Counter

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from demo.tansu import TansuBroker
from proxy.protocol import wire
from tests.audit_files import read_events
from tests.clients import consume, create_topic, produce, unique
from tests.conftest import wait_until
from tests.fake_upstreams import OversizeRelay, TurnsTls, tls_alert_broker
from tests.raw_kafka import RawConnection, api_versions_frame, fetch_frame, metadata_frame
from tests.workers_util import client_address, served_by, start_workers


@pytest.fixture
def tls_speaking_upstream():  # type: ignore[no-untyped-def]
    server = tls_alert_broker()
    yield server
    server.stop()


def test_a_broker_answering_with_a_tls_alert_is_named_and_clients_fail_fast(tls_speaking_upstream, start_proxy) -> None:
    proxy = start_proxy(tls_speaking_upstream.address)
    rss_before = proxy.rss_kib()
    errors: list[KafkaError] = []
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "error_cb": errors.append})
    started = time.monotonic()
    with pytest.raises(KafkaException):
        AdminClient({"bootstrap.servers": proxy.bootstrap}).list_topics(timeout=5)
    wait_until(lambda: producer.poll(0.2) is not None or errors, timeout=10)
    assert time.monotonic() - started < 15
    assert {e.code() for e in errors} & {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN}

    from kafka import KafkaProducer
    from kafka.errors import KafkaTimeoutError

    started = time.monotonic()
    with pytest.raises(KafkaTimeoutError, match="Unable to bootstrap"):
        KafkaProducer(bootstrap_servers=proxy.bootstrap, request_timeout_ms=3000, bootstrap_timeout_ms=5000)
    assert time.monotonic() - started < 15

    assert proxy.rss_kib() - rss_before < 20 * 1024  # no 352 MB allocation, ever
    expected = f"upstream {tls_speaking_upstream.address} speaks TLS; set upstream.tls.enabled"
    assert expected in proxy.log()
    status, body = proxy.get("/readyz")
    assert status == 503 and expected in body
    assert proxy.metric("kafka_admission_decisions_total", policy="protocol", limit="upstream_tls_on_plaintext") >= 1
    # How few upstream connections the backoff lets through: the test below.


def backoff_attempts(elapsed: float, initial: float = 1.0) -> int:
    """The most connections to a mismatched upstream within ``elapsed`` seconds of the first:
    each mismatch blocks it for twice the last block (1 s, 2 s, 4 s ... from the first),
    so attempt k comes no earlier than (2^(k-1) - 1) * initial seconds after the first."""
    return 1 + int(math.log2(1 + elapsed / initial))


def test_clients_in_the_backoff_window_do_not_reach_the_tls_broker(tls_speaking_upstream, start_proxy) -> None:
    """20 client connections, one after another, to a proxy whose upstream answers with the
    Java broker's TLS alert. The upstream is a fake that replays the 7 bytes Apache Kafka's TLS
    listener writes to a plaintext client (15 03 03 00 02 02 50, TOOLS.md; test_apache_kafka_kip498
    checks them against the real broker): the faithful fixture, since only a server of ours can
    count the connections the proxy opens to it. The test
    server keeps the first bytes of each connection, so the clients' requests that reached it
    are told from the proxy's readiness probes (which try even while backing off, and back
    off themselves: 1 s, 2 s, 4 s ...). Without the backoff each client costs one connection."""
    proxy = start_proxy(tls_speaking_upstream.address)
    clients = 20
    started = time.monotonic()
    for correlation_id in range(clients):
        with RawConnection(proxy.bootstrap) as conn:
            conn.send(api_versions_frame(correlation_id))
            assert conn.closed_by_peer()  # closed, with no 352 MB "response" read
    elapsed = time.monotonic() - started
    reached = sum(wire.peek_client_id(data, 0) == "raw-test" for data in list(tls_speaking_upstream.requests))
    assert reached <= backoff_attempts(elapsed) < clients, (reached, elapsed)
    # Each client that reached the upstream found the mismatch; the rest were refused at the proxy.
    failures = "kafka_admission_connection_failures_total"
    assert proxy.metric(failures, cause="upstream_tls_on_plaintext") == reached
    assert proxy.metric(failures, cause="upstream_unavailable") == clients - reached
    assert "speaks TLS; set upstream.tls.enabled (backing off)" in proxy.log()


def test_with_workers_a_broker_turned_tls_is_reached_once_per_backoff_by_the_whole_proxy(tansu, start_proxy) -> None:
    """workers: 2 in front of a real Tansu whose port then turns to TLS (a relay that starts answering
    with the Java broker's TLS alert: tests/fake_upstreams.py). The clients that follow land on both
    workers (asserted, from the proxy's log) within the first block (1 s), and one of them reaches
    the broker: the worker that meets the mismatch tells the others, which back off too
    (proxy/workers/shared_backoff.py). Each worker backing off on its own, each worker's first
    client reached it. The probes at start found the broker healthy: none runs meanwhile."""
    relay = TurnsTls(tansu.bootstrap)
    try:
        proxy = start_workers(start_proxy, relay.address, 2)
        wait_until(lambda: "proxy ready" in proxy.log())
        relay.speaks_tls = True
        addresses = []
        started = time.monotonic()
        for correlation_id in range(12):
            with RawConnection(proxy.bootstrap) as conn:
                addresses.append(client_address(conn))
                conn.send(api_versions_frame(correlation_id))
                assert conn.closed_by_peer()
            if correlation_id == 0:  # the other worker has the block (its DEBUG line) before the next client
                wait_until(lambda: "(another worker backs off)" in proxy.log())
            time.sleep(0.02)
        elapsed = time.monotonic() - started
        wait_until(lambda: set(addresses) <= set(served_by(proxy)))
        landed = Counter(served_by(proxy)[address] for address in addresses)
        assert set(landed) == {0, 1}, f"every client on one worker: {landed}"
        reached = sum(wire.peek_client_id(data, 0) == "raw-test" for data in list(relay.requests))
        assert 1 <= reached <= backoff_attempts(elapsed), (reached, elapsed, landed)
        failures = "kafka_admission_connection_failures_total"
        assert proxy.metric(failures, cause="upstream_tls_on_plaintext") == reached
        assert proxy.metric(failures, cause="upstream_unavailable") == len(addresses) - reached
    finally:
        relay.stop()


def test_a_200_mb_response_closes_that_client_only_and_allocates_nothing(start_proxy) -> None:
    relay = OversizeRelay(victim_client_id="victim", announced=200 * 1024 * 1024)
    # Tansu advertises the relay, so every connection the proxy opens passes it.
    with TansuBroker(advertised=relay.address) as broker:
        relay.broker = broker.bootstrap
        try:
            proxy = start_proxy(relay.address)
            rss_before = proxy.rss_kib()
            with RawConnection(proxy.bootstrap) as victim:
                victim.send(api_versions_frame(5, client_id="victim"))
                assert victim.closed_by_peer()
            assert proxy.rss_kib() - rss_before < 20 * 1024
            assert proxy.metric("kafka_admission_decisions_total", policy="response_size", mode="enforce") == 1
            assert (
                "response to api_versions v3 correlation id 5 is 209715200 bytes, over max.response.size=104857600"
                in proxy.log()
            )
            # Everyone else keeps working through the same proxy and relay.
            topic = f"after-{uuid.uuid4().hex[:6]}"
            create_topic(proxy.bootstrap, topic)
            assert produce(proxy.bootstrap, topic, 20) == 20
        finally:
            relay.stop()


def test_a_real_consumer_fetching_over_max_response_size_is_disconnected_and_gets_nothing(
    tansu, start_proxy, tmp_path
) -> None:
    """A confluent-kafka consumer through a proxy with max.response.size=200000 fetches a
    500 KB record (produced straight to Tansu, one batch, so one Fetch response of ~500 KB).
    What the client sees: the connection closed by the proxy ("Disconnected ... closed by
    peer" in librdkafka's log, "brokers are down" errors), no record, and the same again at
    each of its reconnects; each close is counted and audited with the Fetch it refused. A
    small record through the same proxy is fetched: it is the size that is refused."""
    audit = tmp_path / "audit"
    proxy = start_proxy(tansu.bootstrap, policies={"max.response.size": 200_000}, audit={"path": str(audit)})
    big, small = unique("big"), unique("small")
    for topic, value in ((big, b"x" * 500_000), (small, b"y" * 1000)):
        create_topic(tansu.bootstrap, topic)
        producer = Producer({"bootstrap.servers": tansu.bootstrap})
        producer.produce(topic, value=value)
        assert producer.flush(10) == 0
    errors: list[KafkaError] = []
    logged = io.StringIO()
    logger = logging.getLogger(f"rdkafka-{big}")
    logger.addHandler(logging.StreamHandler(logged))
    logger.setLevel(logging.INFO)
    consumer = Consumer(
        {"bootstrap.servers": proxy.bootstrap, "group.id": big, "error_cb": errors.append, "logger": logger}
    )
    received: list[Message] = []
    refused = {"policy": "response_size", "action": "close", "limit": "max.response.size", "mode": "enforce"}
    try:
        consumer.assign([TopicPartition(big, 0, 0)])

        def refused_twice() -> bool:  # the first Fetch and one retry after reconnecting
            if (message := consumer.poll(0.2)) is not None:
                received.append(message)
            return proxy.metric("kafka_admission_decisions_total", **refused) >= 2

        wait_until(refused_twice, timeout=30)
        assert [m for m in received if m.error() is None] == []
        assert "Disconnected: connection closed by peer" in logged.getvalue()
        assert {e.code() for e in errors} & {KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT}
    finally:
        consumer.close()
    assert "is 500146 bytes, over max.response.size=200000" in proxy.log()

    def audited() -> list[dict[str, object]]:
        events = read_events(audit)
        return [e for e in events if e.get("policy") == "response_size" and e.get("api") == "fetch"]

    event = wait_until(audited)[0]
    assert (event["action"], event["limit"], event["size"]) == ("close", 200_000, 500_146)
    assert consume(proxy.bootstrap, small, unique("small"), 1) == [b"y" * 1000]


def test_observe_mode_counts_an_oversized_response_and_forwards_it(tansu, start_proxy) -> None:
    proxy = start_proxy(tansu.bootstrap, policies={"max.response.size": 64, "response.size.mode": "observe"})
    with RawConnection(proxy.bootstrap) as conn:
        conn.send(api_versions_frame(3))  # Tansu's answer is a few hundred bytes
        assert conn.read_response(18, 3).body.error_code == 0
    assert proxy.metric("kafka_admission_decisions_total", policy="response_size", mode="observe") == 1
    assert "(observe mode)" in proxy.log()


def test_a_per_listener_limit_applies_to_that_listener_only(tansu, start_proxy) -> None:
    proxy = start_proxy(
        tansu.bootstrap,
        listeners=[{"name": "small"}, {"name": "big"}],
        policies={"listener.name.small.max.response.size": 64},
    )
    with RawConnection(proxy.listener_bind("small")) as conn:
        conn.send(api_versions_frame(1))
        assert conn.closed_by_peer()
    with RawConnection(proxy.listener_bind("big")) as conn:
        conn.send(api_versions_frame(1))
        assert conn.read_response(18, 3).body.error_code == 0
    assert proxy.metric("kafka_admission_decisions_total", policy="response_size", listener="small") == 1
    assert proxy.metric("kafka_admission_decisions_total", policy="response_size", listener="big") == 0


def test_a_tls_client_on_the_plaintext_listener_fails_fast_and_is_named(tansu, start_proxy) -> None:
    proxy = start_proxy(tansu.bootstrap)
    host, port = proxy.bootstrap.rsplit(":", 1)
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=5) as sock, pytest.raises((ssl.SSLError, OSError)):
        ssl.create_default_context().wrap_socket(sock, server_hostname="localhost")
    assert time.monotonic() - started < 3
    errors: list[KafkaError] = []
    Producer({"bootstrap.servers": proxy.bootstrap, "security.protocol": "SSL", "error_cb": errors.append}).poll(3)
    assert errors
    assert proxy.metric("kafka_admission_decisions_total", policy="protocol", limit="client_tls_on_plaintext") >= 2
    assert "client speaks TLS on a plaintext link; use TLS only on a TLS listener" in proxy.log()


def test_a_plaintext_client_on_the_tls_listener_gets_no_alert_bytes(tansu, start_proxy, certs) -> None:
    tls = {"cert_file": certs.server_cert, "key_file": certs.server_key}
    proxy = start_proxy(tansu.bootstrap, listeners=[{"name": "tls", "tls": tls}])
    with RawConnection(proxy.bootstrap) as conn:
        conn.send(api_versions_frame(1))
        # Closed with nothing written: no TLS alert for the client to read as a 352 MB length.
        assert conn.bytes_until_closed() == b""
    errors: list[KafkaError] = []
    Producer({"bootstrap.servers": proxy.bootstrap, "error_cb": errors.append}).poll(3)
    assert errors
    assert proxy.metric("kafka_admission_decisions_total", policy="protocol", limit="client_plaintext_on_tls") >= 2
    assert "client sent plaintext (first bytes" in proxy.log()
    assert "to a TLS listener; it needs TLS" in proxy.log()


def test_curl_on_the_kafka_port_gets_a_400_saying_so(tansu, start_proxy) -> None:
    proxy = start_proxy(tansu.bootstrap)
    result = subprocess.run(
        ["curl", "-s", "-i", "--max-time", "5", f"http://{proxy.bootstrap}/"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("HTTP/1.1 400 Bad Request")
    assert "This is a Kafka port (kafka-admission-proxy), not HTTP." in result.stdout
    assert proxy.metric("kafka_admission_decisions_total", policy="protocol", limit="http_on_kafka_port") == 1
    assert "HTTP request on a Kafka port" in proxy.log()


def test_a_legitimate_50_mb_fetch_response_passes_with_the_default_limit(tansu, start_proxy) -> None:
    proxy = start_proxy(tansu.bootstrap)
    topic = f"big-{uuid.uuid4().hex[:6]}"
    create_topic(proxy.bootstrap, topic)
    # One 53 MB record: Tansu answers a Fetch with whole batches, so this is one 53 MB response.
    record = 53_000_000
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "message.max.bytes": record + 100_000})
    producer.produce(topic, value=b"\x05" * record)
    assert producer.flush(60) == 0
    with RawConnection(proxy.bootstrap, timeout=60) as conn:
        conn.send(metadata_frame(1))
        topic_id = next(t.topic_id for t in conn.read_response(3, 12).body.topics if t.name == topic)
        conn.send(fetch_frame(2, topic_id, max_wait_ms=500, max_bytes=64 * 1024 * 1024))
        response = conn.read_frame()
    assert len(response) > 50 * 1024 * 1024
    assert proxy.metric("kafka_admission_decisions_total", policy="response_size") == 0


def test_tls_toward_a_plaintext_broker_is_named_in_readyz(tansu, start_proxy, certs) -> None:
    proxy = start_proxy(
        tansu.bootstrap,
        upstream={
            "bootstrap_servers": [tansu.bootstrap],
            "tls": {"enabled": True, "ca_file": certs.ca_file},
        },
    )
    status, body = proxy.get("/readyz")
    assert status == 503
    assert f"upstream {tansu.bootstrap} does not speak TLS (handshake timed out); check upstream.tls.enabled" in body
    assert proxy.metric("kafka_admission_decisions_total", policy="protocol", limit="upstream_plaintext_on_tls") >= 1
