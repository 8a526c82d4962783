"""The proxy in front of Apache Kafka's SSL listener (upstream TLS with
certificate verification) and its SASL_PLAINTEXT listener (SCRAM-SHA-512
between client and broker, passed through the proxy untouched)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trustme
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from tests.apache_kafka.broker import ApacheKafkaBroker
from tests.apache_kafka.conftest import SCRAM_PASSWORD, SCRAM_USER
from tests.clients import consume, create_topic, kafka_python_roundtrip, produce_values, unique
from tests.conftest import Certs, wait_until
from tests.raw_kafka import RawConnection

pytestmark = pytest.mark.apache_kafka
NODES = (ApacheKafkaBroker.NODE_ID,)


def upstream_tls(address: str, ca_file: str) -> dict[str, Any]:
    return {"bootstrap_servers": [address], "tls": {"enabled": True, "ca_file": ca_file}}


def scram(password: str = SCRAM_PASSWORD) -> dict[str, str]:
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": SCRAM_USER,
        "sasl.password": password,
    }


def test_the_proxy_speaks_verified_tls_to_the_brokers_ssl_listener(
    kafka: ApacheKafkaBroker, start_proxy: Any, certs: Certs
) -> None:
    ssl_address = kafka.address("SSL")
    proxy = start_proxy(ssl_address, node_ids=NODES, upstream=upstream_tls(ssl_address, certs.ca_file))
    topic, group = unique("ak-tls"), unique("ak-tls")
    create_topic(proxy.bootstrap, topic)
    values = [f"t{i}".encode() for i in range(100)]
    produced = produce_values(proxy.bootstrap, topic, values, acks="all")
    assert not produced.errors and len(produced.delivered) == len(values)
    assert sorted(consume(proxy.bootstrap, topic, group, len(values))) == sorted(values)
    # The clients spoke plaintext to the proxy; the broker saw only TLS (its SSL listener is the upstream).
    assert proxy.metric("kafka_admission_connections_accepted_total", tls="false") >= 2
    assert "speaks TLS" not in proxy.log()


def test_the_audit_topic_on_the_brokers_ssl_listener_is_reached_with_the_upstreams_tls(
    kafka: ApacheKafkaBroker, start_proxy: Any, certs: Certs
) -> None:
    """audit.topic with neither its own brokers nor producer settings: the audit producer
    reaches the upstream's SSL listener as the proxy does (verified TLS), so events arrive."""
    ssl_address, topic = kafka.address("SSL"), unique("ak-audit-tls")
    proxy = start_proxy(
        ssl_address,
        node_ids=NODES,
        upstream=upstream_tls(ssl_address, certs.ca_file),
        audit={"topic": topic, "instance_id": "proxy-tls", "window": {"seconds": 0.5}},
    )
    wait_until(lambda: proxy.metric("kafka_admission_audit_events_total", sink="topic", type="window") >= 2, timeout=60)
    assert proxy.metric("kafka_admission_audit_events_dropped_total", sink="topic") == 0
    tls = {"security.protocol": "ssl", "ssl.ca.location": certs.ca_file}
    events = [json.loads(value) for value in consume(ssl_address, topic, unique("ak-audit-tls"), 2, **tls)]
    assert len(events) == 2 and {e["instance"] for e in events} == {"proxy-tls"}
    assert {e["type"] for e in events} == {"window"}


def test_a_broker_certificate_from_another_ca_is_refused(
    kafka: ApacheKafkaBroker, start_proxy: Any, tmp_path: Path
) -> None:
    other_ca = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other_ca))
    ssl_address = kafka.address("SSL")
    proxy = start_proxy(ssl_address, node_ids=NODES, upstream=upstream_tls(ssl_address, str(other_ca)))
    with pytest.raises(KafkaException):
        AdminClient({"bootstrap.servers": proxy.bootstrap}).list_topics(timeout=3)
    assert proxy.metric("kafka_admission_upstream_connect_failures_total", upstream=ssl_address) >= 1
    assert "CERTIFICATE_VERIFY_FAILED" in proxy.log() or "certificate verify failed" in proxy.log()


def test_scram_sha_512_passes_through_the_proxy_untouched(kafka: ApacheKafkaBroker, start_proxy: Any) -> None:
    proxy = start_proxy(kafka.address("SASL_PLAINTEXT"), node_ids=NODES)
    topic, group = unique("ak-sasl"), unique("ak-sasl")
    create_topic(proxy.bootstrap, topic, **scram())
    values = [f"s{i}".encode() for i in range(100)]
    produced = produce_values(proxy.bootstrap, topic, values, **scram())
    assert not produced.errors and len(produced.delivered) == len(values)
    assert sorted(consume(proxy.bootstrap, topic, group, len(values), **scram())) == sorted(values)
    kp_topic, kp_values = unique("ak-sasl-kp"), [b"kafka-python-1", b"kafka-python-2"]
    create_topic(proxy.bootstrap, kp_topic, **scram())
    got = kafka_python_roundtrip(
        proxy.bootstrap,
        kp_topic,
        unique("ak-sasl-kp"),
        kp_values,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_plain_username=SCRAM_USER,
        sasl_plain_password=SCRAM_PASSWORD,
    )
    assert got == kp_values
    assert proxy.metric("kafka_admission_requests_total", api="sasl_handshake") >= 3
    assert proxy.metric("kafka_admission_requests_total", api="sasl_authenticate") >= 3
    # The listener is not marked sasl: the operator is told that nothing bounds frames before authentication.
    assert "listener external carries SASL authentication but is not marked sasl: true" in proxy.log()


def test_a_wrong_scram_password_is_refused_by_the_broker_through_the_proxy(
    kafka: ApacheKafkaBroker, start_proxy: Any
) -> None:
    proxy = start_proxy(kafka.address("SASL_PLAINTEXT"), node_ids=NODES)
    errors: list[KafkaError] = []
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap, **scram("not-the-password"), "error_cb": errors.append})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=3)
    admin.poll(1)
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
    assert any("Authentication failed during authentication due to invalid credentials" in e.str() for e in errors)


def test_after_scram_authentication_a_produce_over_sasl_server_max_receive_size_passes(
    kafka: ApacheKafkaBroker, start_proxy: Any
) -> None:
    """On a listener marked sasl, a 700 kB Produce (over Kafka's 512 KiB before authentication)
    is delivered once the broker accepted the client's SaslAuthenticate; the same length from a
    client that has not authenticated is refused at its prefix, as the broker refuses it."""
    proxy = start_proxy(kafka.address("SASL_PLAINTEXT"), node_ids=NODES, listeners=[{"name": "sasl", "sasl": True}])
    topic = unique("ak-preauth")
    create_topic(proxy.bootstrap, topic, **scram())
    produced = produce_values(proxy.bootstrap, topic, [bytes(700_000)], **scram(), **{"compression.type": "none"})
    assert not produced.errors and len(produced.delivered) == 1
    assert proxy.metric("kafka_admission_requests_total", api="sasl_authenticate") >= 1
    limit = "sasl.server.max.receive.size"
    assert proxy.metric("kafka_admission_decisions_total", limit=limit) == 0
    assert "not marked sasl" not in proxy.log()
    unauthenticated = (700_000).to_bytes(4, "big") + b"\0\x00\0\x09" + bytes(60_000)
    for address in (kafka.address("SASL_PLAINTEXT"), proxy.bootstrap):  # the broker itself, then the proxy
        with RawConnection(address) as conn:
            try:
                conn.send(unauthenticated)
            except OSError:
                pass  # closed while sending: refused at the prefix
            assert conn.closed_by_peer(), address
    assert proxy.metric("kafka_admission_decisions_total", policy="request_size", action="close", limit=limit) == 1
