"""KIP-1233 through the proxy with real clients: over-long identifiers are refused
with an error response the broker never sees; at the limit they pass."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from tests.audit_files import read_events
from tests.clients import GROUP_CONF, create_topic, produce
from tests.conftest import wait_until

LIMITS = {"resource.identifier.limit.enable": True}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def long_name(length: int) -> str:
    return ("x" * length)[:length]


@pytest.fixture
def proxy(tansu, start_proxy):  # type: ignore[no-untyped-def]
    return start_proxy(tansu.bootstrap, policies=LIMITS)


def test_confluent_kafka_with_a_250_character_client_id_fails_with_a_clear_error(proxy) -> None:  # type: ignore[no-untyped-def]
    errors: list[KafkaError] = []
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "client.id": long_name(250), "error_cb": errors.append})
    with pytest.raises(KafkaException):
        AdminClient({"bootstrap.servers": proxy.bootstrap, "client.id": long_name(250)}).list_topics(timeout=5)
    producer.poll(3)
    assert proxy.metric("kafka_admission_decisions_total", policy="identifier_limits", action="refuse") >= 1
    assert "refuse api_versions: client id (header.client_id) is 250 characters long" in proxy.log()
    # A 249-character client id works.
    topic = unique("cid")
    create_topic(proxy.bootstrap, topic, **{"client.id": long_name(249)})
    assert produce(proxy.bootstrap, topic, 5, **{"client.id": long_name(249)}) == 5


def test_kafka_python_with_a_250_character_client_id_fails_and_with_249_works(proxy) -> None:  # type: ignore[no-untyped-def]
    from kafka import KafkaProducer
    from kafka.errors import KafkaError as KafkaPythonError

    started = time.monotonic()
    with pytest.raises(KafkaPythonError):
        KafkaProducer(bootstrap_servers=proxy.bootstrap, client_id=long_name(250), bootstrap_timeout_ms=5000)
    assert time.monotonic() - started < 15
    producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, client_id=long_name(249))
    topic = unique("kp-cid")
    create_topic(proxy.bootstrap, topic)
    producer.send(topic, b"ok").get(timeout=10)
    producer.close()


def test_a_consumer_with_a_250_character_group_id_is_refused(proxy) -> None:  # type: ignore[no-untyped-def]
    topic = unique("gid")
    create_topic(proxy.bootstrap, topic)
    consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": long_name(250), **GROUP_CONF})
    consumer.subscribe([topic])
    seen: list[KafkaError] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not seen:
        message = consumer.poll(0.5)
        if message is not None and message.error():
            seen.append(message.error())
    consumer.close()
    assert proxy.metric("kafka_admission_decisions_total", policy="identifier_limits", action="refuse") >= 1
    assert "group id (" in proxy.log()
    # The broker never saw the group: only the proxy answered FindCoordinator/JoinGroup.
    assert proxy.metric("kafka_admission_requests_total", api="join_group") == 0 or seen


def test_admin_create_acls_with_a_250_character_principal_is_refused(proxy) -> None:  # type: ignore[no-untyped-def]
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    binding = AclBinding(
        ResourceType.TOPIC,
        "orders",
        ResourcePatternType.LITERAL,
        "User:" + long_name(245),
        "*",
        AclOperation.READ,
        AclPermissionType.ALLOW,
    )
    futures = admin.create_acls([binding])
    with pytest.raises(KafkaException) as info:
        futures[binding].result(timeout=10)
    assert info.value.args[0].code() == KafkaError.INVALID_REQUEST
    assert "principal" in info.value.args[0].str()
    assert proxy.metric("kafka_admission_decisions_total", policy="identifier_limits", action="refuse") == 1
    assert "refuse create_acls: ACL principal" in proxy.log()


def test_a_transactional_producer_with_a_250_character_transactional_id_is_refused(proxy) -> None:  # type: ignore[no-untyped-def]
    errors: list[KafkaError] = []
    producer = Producer(
        {
            "bootstrap.servers": proxy.bootstrap,
            "transactional.id": long_name(250),
            "error_cb": errors.append,
        }
    )
    # librdkafka looks up the transaction coordinator first; the proxy refuses that
    # lookup (INVALID_REQUEST), so the producer can never initialise transactions.
    with pytest.raises(KafkaException):
        producer.init_transactions(5)
    assert proxy.metric("kafka_admission_decisions_total", policy="identifier_limits", action="refuse") >= 1
    assert "refuse find_coordinator: transactional id" in proxy.log()
    assert "transactional id" in proxy.log() and "limit of 249" in proxy.log()
    # At the limit the same producer works.
    ok = Producer({"bootstrap.servers": proxy.bootstrap, "transactional.id": long_name(249)})
    ok.init_transactions(20)


def test_observe_mode_lets_the_over_long_group_through_and_audits_it(tansu, start_proxy, tmp_path) -> None:  # type: ignore[no-untyped-def]
    audit = tmp_path / "audit"
    proxy = start_proxy(
        tansu.bootstrap,
        policies={**LIMITS, "resource.identifier.limit.mode": "observe"},
        audit={"path": str(audit)},
    )
    topic = unique("observe")
    create_topic(proxy.bootstrap, topic)
    assert produce(proxy.bootstrap, topic, 3, **{"client.id": long_name(250)}) == 3
    assert proxy.metric("kafka_admission_decisions_total", policy="identifier_limits", mode="observe") >= 1
    events = wait_until(lambda: [e for e in read_events(audit) if e.get("policy") == "identifier_limits"])
    assert events[0]["mode"] == "observe" and events[0]["identifier_kind"] == "client_id"
