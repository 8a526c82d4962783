"""TLS with real clients and a real broker: termination on a listener
(optionally mTLS), and verified TLS from the proxy to a broker (stunnel in
front of Tansu, with the test CA)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme
from confluent_kafka import KafkaException
from kafka_helpers import Stunnel

from demo.tansu import TansuBroker, free_port
from tests.clients import (
    broker_addresses,
    consume,
    create_topic,
    kafka_python_roundtrip,
    metadata,
    produce_values,
    unique,
)


def tls_listener(certs: Any, **tls: Any) -> dict[str, Any]:
    return {
        "name": "tls",
        "tls": {"cert_file": certs.server_cert, "key_file": certs.server_key, **tls},
    }


def confluent_tls(certs: Any, *, client_cert: bool = False) -> dict[str, Any]:
    conf = {"security.protocol": "SSL", "ssl.ca.location": certs.ca_file}
    if client_cert:
        conf |= {"ssl.certificate.location": certs.client_cert, "ssl.key.location": certs.client_key}
    return conf


def kafka_python_tls(certs: Any, *, client_cert: bool = False) -> dict[str, Any]:
    conf = {"security_protocol": "SSL", "ssl_cafile": certs.ca_file}
    if client_cert:
        conf |= {"ssl_certfile": certs.client_cert, "ssl_keyfile": certs.client_key}
    return conf


def node_port(proxy: Any) -> int:
    return int(proxy.config["listeners"][0]["node_port_base"]) + TansuBroker.NODE_ID


# --- TLS listener -------------------------------------------------------------


def test_confluent_kafka_creates_produces_and_consumes_through_a_tls_listener(
    tansu: TansuBroker,
    start_proxy: Any,
    certs: Any,
) -> None:
    proxy = start_proxy(tansu.bootstrap, listeners=[tls_listener(certs)])
    ssl = confluent_tls(certs)
    assert broker_addresses(metadata(proxy.bootstrap, **ssl)) == {TansuBroker.NODE_ID: ("127.0.0.1", node_port(proxy))}
    topic = unique("tls")
    create_topic(proxy.bootstrap, topic, partitions=2, **ssl)
    values = [f"secret-{i}".encode() for i in range(20)]
    result = produce_values(proxy.bootstrap, topic, values, acks="all", **ssl)
    assert result.errors == []
    assert len(result.delivered) == len(values)

    consumed = consume(proxy.bootstrap, topic, unique("tls-group"), len(values), **ssl)

    assert sorted(consumed) == sorted(values)
    # Bootstrap and node port both terminated TLS; no handshake failed.
    assert proxy.metric("kafka_admission_connections_accepted_total", listener="tls", tls="true") >= 2
    assert proxy.metric("kafka_admission_connections_accepted_total", tls="false") == 0
    assert proxy.metric("kafka_admission_tls_handshake_failures_total") == 0
    assert proxy.metric("kafka_admission_requests_total", listener="tls", api="create_topics") >= 1


def test_kafka_python_creates_produces_and_consumes_through_a_tls_listener(
    tansu: TansuBroker,
    start_proxy: Any,
    certs: Any,
) -> None:
    from kafka import KafkaAdminClient

    proxy = start_proxy(tansu.bootstrap, listeners=[tls_listener(certs)])
    ssl = kafka_python_tls(certs)
    topic = unique("tls-kp")
    admin = KafkaAdminClient(bootstrap_servers=proxy.bootstrap, request_timeout_ms=10000, **ssl)
    try:
        created = admin.create_topics(
            {topic: {"num_partitions": 2, "replication_factor": 1}},
            wait_for_metadata=True,
        )
        described = admin.describe_cluster()
    finally:
        admin.close()
    assert [(t["name"], t["error_code"]) for t in created["topics"]] == [(topic, 0)]
    assert [(b["host"], b["port"]) for b in described["brokers"]] == [("127.0.0.1", node_port(proxy))]
    values = [f"kp-secret-{i}".encode() for i in range(20)]

    consumed = kafka_python_roundtrip(proxy.bootstrap, topic, unique("tls-kp-group"), values, **ssl)

    assert sorted(consumed) == sorted(values)
    assert proxy.metric("kafka_admission_connections_accepted_total", listener="tls", tls="true") >= 2
    assert proxy.metric("kafka_admission_tls_handshake_failures_total") == 0


def test_plaintext_client_on_a_tls_listener_gets_no_metadata(
    tansu: TansuBroker,
    start_proxy: Any,
    certs: Any,
) -> None:
    proxy = start_proxy(tansu.bootstrap, listeners=[tls_listener(certs)])
    with pytest.raises(KafkaException):
        metadata(proxy.bootstrap, timeout=3)
    # Refused before any request reached the broker (how it is classified is not the point).
    assert proxy.metric("kafka_admission_connection_failures_total", listener="tls") >= 1
    assert proxy.metric("kafka_admission_requests_total") == 0


# --- mTLS ----------------------------------------------------------------------


@pytest.fixture
def mtls_proxy(tansu: TansuBroker, start_proxy: Any, certs: Any) -> Any:
    return start_proxy(
        tansu.bootstrap,
        listeners=[tls_listener(certs, ca_file=certs.ca_file, client_auth="required")],
    )


def test_mtls_client_with_a_certificate_from_the_ca_produces_and_consumes(
    mtls_proxy: Any,
    certs: Any,
) -> None:
    ssl = confluent_tls(certs, client_cert=True)
    topic = unique("mtls")
    create_topic(mtls_proxy.bootstrap, topic, **ssl)
    values = [f"m{i}".encode() for i in range(10)]
    assert produce_values(mtls_proxy.bootstrap, topic, values, **ssl).errors == []

    consumed = consume(mtls_proxy.bootstrap, topic, unique("mtls-group"), len(values), **ssl)
    kp_topic = unique("mtls-kp")
    create_topic(mtls_proxy.bootstrap, kp_topic, **ssl)
    kp_values = [f"kpm{i}".encode() for i in range(5)]
    kp_consumed = kafka_python_roundtrip(
        mtls_proxy.bootstrap,
        kp_topic,
        unique("mtls-kp-group"),
        kp_values,
        **kafka_python_tls(certs, client_cert=True),
    )

    assert sorted(consumed) == sorted(values)
    assert sorted(kp_consumed) == sorted(kp_values)
    assert mtls_proxy.metric("kafka_admission_tls_handshake_failures_total") == 0


def test_mtls_client_without_a_certificate_is_refused_and_counted(
    mtls_proxy: Any,
    certs: Any,
) -> None:
    before = mtls_proxy.metric("kafka_admission_tls_handshake_failures_total", listener="tls")
    with pytest.raises(KafkaException):
        metadata(mtls_proxy.bootstrap, timeout=3, **confluent_tls(certs))
    assert mtls_proxy.metric("kafka_admission_tls_handshake_failures_total", listener="tls") > before
    assert mtls_proxy.metric("kafka_admission_requests_total") == 0
    assert "TLS handshake failed" in mtls_proxy.log()


# --- TLS toward the broker (stunnel in front of Tansu) --------------------------


@dataclass
class TlsBroker:
    broker: TansuBroker
    stunnel: Stunnel

    @property
    def address(self) -> str:
        """The broker's only advertised address: TLS."""
        return self.stunnel.address


@pytest.fixture(scope="module")
def tls_broker(
    stunnel_bin: str,
    certs: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[TlsBroker]:
    """Tansu reachable through stunnel (TLS, server cert of the test CA); its
    metadata names only the TLS address, so every connection the proxy makes
    to it, bootstrap or node, is TLS."""
    broker_port, tls_port = free_port(), free_port()
    with (
        TansuBroker(port=broker_port, advertised=f"127.0.0.1:{tls_port}") as broker,
        Stunnel(
            stunnel_bin,
            tmp_path_factory.mktemp("stunnel"),
            accept_port=tls_port,
            connect=broker.bootstrap,
            cert_file=certs.server_cert,
            key_file=certs.server_key,
        ) as tunnel,
    ):
        yield TlsBroker(broker, tunnel)


def upstream_tls(address: str, ca_file: str) -> dict[str, Any]:
    return {"bootstrap_servers": [address], "tls": {"enabled": True, "ca_file": ca_file}}


def test_proxy_verifies_the_broker_certificate_and_carries_plaintext_clients_over_tls(
    tls_broker: TlsBroker,
    start_proxy: Any,
    certs: Any,
) -> None:
    # Without the proxy the broker names only its TLS address.
    direct = broker_addresses(metadata(tls_broker.address, **confluent_tls(certs)))
    assert direct == {TansuBroker.NODE_ID: ("127.0.0.1", tls_broker.stunnel.port)}
    tunnelled_before = tls_broker.stunnel.accepted_connections()

    proxy = start_proxy(tls_broker.address, upstream=upstream_tls(tls_broker.address, certs.ca_file))
    topic = unique("up-tls")
    create_topic(proxy.bootstrap, topic, partitions=2)
    values = [f"u{i}".encode() for i in range(20)]
    result = produce_values(proxy.bootstrap, topic, values, acks="all")
    assert result.errors == []

    consumed = consume(proxy.bootstrap, topic, unique("up-tls-group"), len(values))
    kp_values = [f"kpu{i}".encode() for i in range(5)]
    kp_topic = unique("up-tls-kp")
    create_topic(proxy.bootstrap, kp_topic)
    kp_consumed = kafka_python_roundtrip(proxy.bootstrap, kp_topic, unique("up-tls-kp-g"), kp_values)

    assert sorted(consumed) == sorted(values)
    assert sorted(kp_consumed) == sorted(kp_values)
    assert tls_broker.stunnel.accepted_connections() > tunnelled_before
    assert proxy.metric("kafka_admission_upstream_connect_failures_total") == 0
    assert proxy.metric("kafka_admission_connections_accepted_total", tls="false") >= 2
    status, body = proxy.get("/readyz")
    assert status == 200, body


def test_proxy_refuses_a_broker_whose_certificate_another_ca_signed(
    tls_broker: TlsBroker,
    start_proxy: Any,
    tmp_path: Path,
) -> None:
    wrong_ca = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(wrong_ca))
    proxy = start_proxy(tls_broker.address, upstream=upstream_tls(tls_broker.address, str(wrong_ca)))

    with pytest.raises(KafkaException):
        metadata(proxy.bootstrap, timeout=3)

    assert proxy.metric("kafka_admission_upstream_connect_failures_total", upstream=tls_broker.address) >= 1
    assert proxy.metric("kafka_admission_connection_failures_total", cause="upstream_unavailable") >= 1
    assert "CERTIFICATE_VERIFY_FAILED" in proxy.log()
    status, body = proxy.get("/readyz")
    assert status == 503
    assert "no upstream broker reachable" in body
