"""``tls: passthrough`` listeners: the client's TLS reaches a real TLS broker (stunnel in
front of Tansu) undecrypted, so the client sees the broker's own certificate; the
connection caps, max.ssl.connections with LRU eviction of idle connections and
connections.max.idle.ms still hold; audit and metrics name the connections passthrough;
and check-config refuses a frame-level policy written for such a listener."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, Producer

from demo.tansu import TansuBroker, free_port
from policies.api_keys import API_VERSIONS
from tests.audit_files import assert_valid, read_events
from tests.conftest import ROOT, free_node_port_base, wait_until
from tests.integration.kafka_helpers import Stunnel
from tests.raw_kafka import RawConnection, api_versions_frame

LISTENER = "mtls"


@dataclass(frozen=True)
class PassthroughBroker:
    """Tansu behind stunnel (the TLS broker), advertising the proxy's passthrough port."""

    broker: TansuBroker
    stunnel: Stunnel
    proxy_port: int  # where the proxy's passthrough listener must bind (what the broker advertises)


@pytest.fixture(scope="module")
def tls_broker(stunnel_bin: str, certs: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PassthroughBroker]:
    proxy_port = free_port()
    with (
        TansuBroker(advertised=f"127.0.0.1:{proxy_port}") as broker,
        Stunnel(
            stunnel_bin,
            tmp_path_factory.mktemp("stunnel"),
            connect=broker.bootstrap,
            cert_file=certs.server_cert,
            key_file=certs.server_key,
        ) as tunnel,
    ):
        yield PassthroughBroker(broker, tunnel, proxy_port)


def start_passthrough(start_proxy: Any, tls_broker: PassthroughBroker, **sections: Any) -> Any:
    listener = {
        "name": LISTENER,
        "bind": f"127.0.0.1:{tls_broker.proxy_port}",
        "tls": "passthrough",
        "passthrough_brokers": {TansuBroker.NODE_ID: tls_broker.stunnel.address},
    }
    # The proxy's own upstream (readiness) is the broker's plaintext port; clients never use it.
    return start_proxy(tls_broker.broker.bootstrap, listeners=[listener], mode="sidecar", **sections)


def tls_connection(proxy: Any, certs: Any, *, source: str | None = None) -> RawConnection:
    return RawConnection(proxy.bootstrap, ca_file=certs.ca_file, source=source)


def round_trip(conn: RawConnection, correlation_id: int) -> None:
    conn.send(api_versions_frame(correlation_id))
    response = conn.read_response(API_VERSIONS, 3)
    assert response.header.correlation_id == correlation_id
    assert response.body.error_code == 0


def test_a_passthrough_client_sees_the_broker_certificate_and_a_kafka_client_works(
    tls_broker: PassthroughBroker, start_proxy: Any, certs: Any, tmp_path: Path
) -> None:
    proxy = start_passthrough(start_proxy, tls_broker, audit={"path": str(tmp_path / "audit")})
    with tls_connection(proxy, certs) as conn:
        assert isinstance(conn.sock, ssl.SSLSocket)
        # The proxy has no certificate of its own on this listener: the one seen is stunnel's.
        served = conn.sock.getpeercert(binary_form=True)
        assert served == ssl.PEM_cert_to_DER_cert(Path(certs.server_cert).read_text())
        round_trip(conn, 7)

    common = {"bootstrap.servers": proxy.bootstrap, "security.protocol": "SSL", "ssl.ca.location": certs.ca_file}
    topic = "passthrough-topic"
    producer = Producer({**common, "message.timeout.ms": 20000})
    for i in range(5):
        producer.produce(topic, f"m{i}".encode())
    assert producer.flush(30) == 0
    consumer = Consumer({**common, "group.id": "pt", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < 5 and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is not None and msg.error() is None:
            got.append(msg.value())
    consumer.close()
    assert sorted(got) == [f"m{i}".encode() for i in range(5)]

    # No frame was read, so no request was counted; the bytes were, as passthrough.
    assert proxy.metric("kafka_admission_requests_total", listener=LISTENER) == 0
    accepted = proxy.metric("kafka_admission_connections_accepted_total", listener=LISTENER, tls="passthrough")
    assert accepted >= 2
    events = wait_until(
        lambda: [e for e in read_events(tmp_path / "audit") if e["type"] == "connection" and e["event"] == "close"]
    )
    assert all(e["passthrough"] is True and e["tls"] is True for e in events)
    assert all(e["upstream"] == tls_broker.stunnel.address for e in events)
    assert_valid(read_events(tmp_path / "audit"))


def test_max_ssl_connections_evicts_the_least_recently_used_idle_passthrough_connection(
    tls_broker: PassthroughBroker, start_proxy: Any, certs: Any, tmp_path: Path
) -> None:
    proxy = start_passthrough(
        start_proxy, tls_broker, policies={"max.ssl.connections": 2}, audit={"path": str(tmp_path / "audit")}
    )
    with tls_connection(proxy, certs) as first, tls_connection(proxy, certs) as second:
        round_trip(first, 1)
        round_trip(second, 2)
        round_trip(first, 3)  # now second is the least recently used
        with tls_connection(proxy, certs) as third:
            round_trip(third, 4)
            assert second.closed_by_peer()
            round_trip(first, 5)
            round_trip(third, 6)
    evictions = wait_until(
        lambda: [e for e in read_events(tmp_path / "audit") if e["type"] == "decision" and e["action"] == "evict"]
    )
    assert [e["limit_key"] for e in evictions] == ["max.ssl.connections"]
    closes = wait_until(
        lambda: [
            e
            for e in read_events(tmp_path / "audit")
            if e["type"] == "connection" and e["event"] == "close" and e["reason"].startswith("evicted")
        ]
    )
    assert len(closes) == 1 and closes[0]["passthrough"] is True


def test_a_connection_with_bytes_in_flight_is_never_evicted_and_a_stalled_broker_is_idle(
    tls_broker: PassthroughBroker, start_proxy: Any, certs: Any, tmp_path: Path
) -> None:
    """Bytes the broker does not take are in flight: at max.ssl.connections the next
    connection waits for max.connections.wait.ms and is refused rather than cost this one
    its connection; once no byte has moved for connections.max.idle.ms it is closed."""
    # The idle limit is well above the wait, so the refusal comes before the stalled close.
    policies = {"max.ssl.connections": 1, "max.connections.wait.ms": 1500, "connections.max.idle.ms": 8000}
    proxy = start_passthrough(start_proxy, tls_broker, policies=policies, audit={"path": str(tmp_path / "audit")})
    stunnel = tls_broker.stunnel._process
    assert stunnel is not None
    with tls_connection(proxy, certs) as busy:
        round_trip(busy, 1)
        os.kill(stunnel.pid, signal.SIGSTOP)  # the TLS broker takes no more bytes
        try:
            # More than the kernel buffers on the way hold: the proxy's write to the broker blocks.
            writer = threading.Thread(target=_send_until_closed, args=(busy.sock, 64 * 1024 * 1024), daemon=True)
            writer.start()

            def relay_blocked() -> bool:  # in flight, and no more bytes getting through
                relayed = proxy.metric("kafka_admission_request_bytes_total", listener=LISTENER)
                time.sleep(0.3)
                same = proxy.metric("kafka_admission_request_bytes_total", listener=LISTENER) == relayed
                return same and proxy.metric("kafka_admission_connections_counted_busy") == 1

            wait_until(relay_blocked)
            started = time.monotonic()
            with pytest.raises((ssl.SSLError, ConnectionError, TimeoutError)):
                tls_connection(proxy, certs)
            waited = time.monotonic() - started
            assert 1.4 < waited < 8, waited  # refused after max.connections.wait.ms, not at once
            # (the audit writer is a thread: wait for the refusal's event to be written)
            refusals = wait_until(
                lambda: [e for e in read_events(tmp_path / "audit") if e.get("action") in ("evict", "refuse")]
            )
            assert [(e["action"], e["limit_key"]) for e in refusals] == [("refuse", "max.connections.wait.ms")]
            # Stalled: no byte moves, so after connections.max.idle.ms the relay closes it.
            closed = wait_until(
                lambda: [
                    e
                    for e in read_events(tmp_path / "audit")
                    if e["type"] == "connection" and e["event"] == "close" and e["passthrough"]
                ],
                timeout=20,
            )
            assert [e["reason"] for e in closed] == ["closed: connections.max.idle.ms"]
            stalls = [e for e in read_events(tmp_path / "audit") if e["type"] == "decision" and e["action"] == "close"]
            assert [(e["limit_key"], e["limit"], e["conn_id"]) for e in stalls] == [
                ("connections.max.idle.ms", 8000, closed[0]["conn_id"])
            ]
            writer.join(timeout=10)
            assert not writer.is_alive()
        finally:
            os.kill(stunnel.pid, signal.SIGCONT)


def _send_until_closed(sock: ssl.SSLSocket, size: int) -> None:
    try:
        sock.settimeout(30)
        sock.sendall(bytes(size))
    except OSError:
        pass  # closed by the proxy: what the test waits for


def test_per_ip_and_listener_caps_hold_on_a_passthrough_listener(
    tls_broker: PassthroughBroker, start_proxy: Any, certs: Any
) -> None:
    proxy = start_passthrough(
        start_proxy,
        tls_broker,
        policies={"max.connections.per.ip": 1, f"listener.name.{LISTENER}.max.connections": 2},
    )
    with tls_connection(proxy, certs) as first:
        round_trip(first, 1)
        accepted_before = tls_broker.stunnel.accepted_connections()
        # The same address again: refused at accept, before any TLS byte reaches the broker.
        with pytest.raises((ssl.SSLError, ConnectionError)):
            tls_connection(proxy, certs)
        with tls_connection(proxy, certs, source="127.0.0.2") as other:
            round_trip(other, 2)
            # The listener's cap (2) is full: a third address evicts the idle LRU one (first).
            with tls_connection(proxy, certs, source="127.0.0.3") as third:
                round_trip(third, 3)
                assert first.closed_by_peer()
                round_trip(other, 4)
        # other and third reached the broker; the refused one never did
        wait_until(lambda: tls_broker.stunnel.accepted_connections() >= accepted_before + 2)
        assert tls_broker.stunnel.accepted_connections() == accepted_before + 2
    refused = proxy.metric("kafka_admission_decisions_total", policy="connections", action="refuse")
    assert refused == 1


def test_a_passthrough_connection_moving_no_bytes_is_closed_after_connections_max_idle_ms(
    tls_broker: PassthroughBroker, start_proxy: Any, certs: Any
) -> None:
    proxy = start_passthrough(start_proxy, tls_broker, policies={"connections.max.idle.ms": 1000})
    with tls_connection(proxy, certs) as silent, tls_connection(proxy, certs) as talking:
        round_trip(silent, 1)
        started = time.monotonic()
        # Bytes every 0.2 s for 2.5 s (twice the idle limit): the talking one stays open.
        for i in range(12):
            round_trip(talking, 10 + i)
            time.sleep(0.2)
        assert silent.closed_by_peer()
        assert time.monotonic() - started < 10  # closed around 1 s, not held for ever
        round_trip(talking, 99)


def test_check_config_refuses_a_frame_level_policy_for_a_passthrough_listener(tmp_path: Path) -> None:
    config: dict[str, Any] = {
        "upstream": {"bootstrap_servers": ["127.0.0.1:9"]},
        "listeners": [
            {"name": "plain", "bind": "127.0.0.1:0"},
            {"name": LISTENER, "bind": "127.0.0.1:1", "tls": "passthrough", "passthrough_brokers": {0: "b:9093"}},
        ],
        # A broker-wide frame-level key is fine: it applies to "plain" (and is documented not
        # to reach a passthrough listener); one written for the passthrough listener is not.
        "policies": {"max.response.size": 1048576, f"listener.name.{LISTENER}.max.connections": 10},
    }

    def check_config() -> subprocess.CompletedProcess[str]:
        path = tmp_path / "proxy.yaml"
        path.write_text(yaml.safe_dump(config))
        return subprocess.run(
            [sys.executable, "-m", "proxy.cli", "check-config", "--config", str(path)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )

    assert check_config().returncode == 0
    config["policies"][f"listener.name.{LISTENER}.max.response.size"] = 1048576
    result = check_config()
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert [line.strip() for line in result.stderr.splitlines() if line.strip()][1:] == [
        f"policies: listener.name.{LISTENER}.max.response.size: listener {LISTENER} is tls: passthrough "
        "(its bytes are not decrypted), so max.response.size cannot apply to it; only max.connections can"
    ], result.stderr


def test_in_cluster_mode_each_passthrough_broker_has_its_node_port(
    tls_broker: PassthroughBroker, start_proxy: Any, certs: Any
) -> None:
    node = TansuBroker.NODE_ID
    listener: dict[str, Any] = {
        "name": LISTENER,
        "bind": f"127.0.0.1:{tls_broker.proxy_port}",
        "tls": "passthrough",
        "passthrough_brokers": {node: tls_broker.stunnel.address},
    }
    proxy = start_proxy(tls_broker.broker.bootstrap, listeners=[listener], mode="cluster")
    node_port = listener["node_port_base"] + node  # chosen free by start_proxy
    accepted_before = tls_broker.stunnel.accepted_connections()
    with RawConnection(f"127.0.0.1:{node_port}", ca_file=certs.ca_file) as conn:
        round_trip(conn, 1)
    with tls_connection(proxy, certs) as conn:  # the bootstrap port too
        round_trip(conn, 2)
    wait_until(lambda: tls_broker.stunnel.accepted_connections() >= accepted_before + 2)
    assert tls_broker.stunnel.accepted_connections() == accepted_before + 2
    assert proxy.metric("kafka_admission_connections_accepted_total", listener=LISTENER, tls="passthrough") == 2


def test_with_workers_a_passthrough_node_port_another_process_serves_is_logged_and_joined_by_none(
    tls_broker: PassthroughBroker, start_proxy: Any, certs: Any
) -> None:
    """Each worker binds with SO_REUSEPORT, which would join a listener of another process that set
    it too (another proxy's worker, as this socket stands for) and take half of its clients. The
    supervisor binds the node port plainly before any worker starts: in use, it is logged as one
    process logs it and no worker opens it; the bootstrap port serves."""
    node = TansuBroker.NODE_ID
    base = free_node_port_base([node])
    node_port = base + node
    other = socket.socket()
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    other.bind(("127.0.0.1", node_port))
    other.listen()
    try:
        listener: dict[str, Any] = {
            "name": LISTENER,
            "bind": f"127.0.0.1:{tls_broker.proxy_port}",
            "tls": "passthrough",
            "passthrough_brokers": {node: tls_broker.stunnel.address},
            "node_port_base": base,
        }
        proxy = start_proxy(tls_broker.broker.bootstrap, listeners=[listener], mode="cluster", workers=2)
        line = (
            f"cannot open the port for broker node {node}: listener {LISTENER}: cannot listen on 127.0.0.1:{node_port}"
        )
        wait_until(lambda: line + ": Address already in use" in proxy.log())
        with tls_connection(proxy, certs) as conn:
            round_trip(conn, 1)
        assert f"bind=127.0.0.1:{node_port} " not in proxy.log()
    finally:
        other.close()
