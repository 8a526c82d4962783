"""KIP-498 against Apache Kafka itself: what its SSL listener writes to a plaintext
Kafka request, and the proxy (plaintext upstream) pointed at that listener."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from tests.apache_kafka.broker import ApacheKafkaBroker
from tests.fake_upstreams import JAVA_BROKER_TLS_ALERT
from tests.raw_kafka import RawConnection, api_versions_frame

pytestmark = pytest.mark.apache_kafka


def test_the_brokers_ssl_listener_answers_plaintext_with_the_fixtures_tls_alert(kafka: ApacheKafkaBroker) -> None:
    with RawConnection(kafka.address("SSL")) as conn:
        conn.send(api_versions_frame(1))
        answer = conn.bytes_until_closed()
    # An alert record (0x15), TLS 1.2 framing, 2 bytes: fatal (2), unexpected_message (80 = 0x50) ...
    assert answer == bytes.fromhex("15030300020250")
    # ... exactly the bytes tests/fake_upstreams.py replays for brokers that are not Kafka,
    # and what a plaintext client would read as a 352,518,912-byte length.
    assert answer == JAVA_BROKER_TLS_ALERT
    assert int.from_bytes(answer[:4], "big") == 352_518_912


def test_a_plaintext_proxy_in_front_of_the_ssl_listener_names_the_mismatch(
    kafka: ApacheKafkaBroker, start_proxy: Any
) -> None:
    ssl_address = kafka.address("SSL")
    proxy = start_proxy(ssl_address, node_ids=(ApacheKafkaBroker.NODE_ID,))
    with pytest.raises(KafkaException):
        AdminClient({"bootstrap.servers": proxy.bootstrap}).list_topics(timeout=3)
    with RawConnection(proxy.bootstrap) as conn:  # a clean disconnect, never a TLS alert
        conn.send(api_versions_frame(2))
        assert conn.bytes_until_closed() == b""
    expected = f"upstream {ssl_address} speaks TLS; set upstream.tls.enabled"
    assert expected in proxy.log()
    status, body = proxy.get("/readyz")
    assert status == 503 and expected in body
    assert proxy.metric("kafka_admission_decisions_total", policy="protocol", limit="upstream_tls_on_plaintext") >= 1
