"""KIP-1233 through the proxy with real clients, or raw requests (kio) where no client can
send the identifier: over-long identifiers are refused with the error code the KIP names
(asserted by code), and the broker never sees the request (read back from the broker
directly, not through the proxy); at the limit they pass and reach the broker.

Broker: Tansu (fixture ``tansu``), which admits every one of these over-long identifiers
itself (250-character topics and groups, 287-character member ids, 5,000-character offset
metadata), so a read-back that finds nothing shows the proxy kept the request from it.
The identifiers Tansu has no API for (ACL principal and host: Tansu's CreateAcls answer
aborts librdkafka; KIP-848 member id and rack id) are tested against Apache Kafka in
tests/apache_kafka/test_apache_kafka_identifier_limits.py.
"""

from __future__ import annotations

import datetime
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)
from kio.schema.describe_groups.v5 import request as describe_groups
from kio.schema.join_group.v9 import request as join_group

from tests.audit_files import read_events
from tests.clients import CLIENT_TIMEOUT_S, GROUP_CONF, create_topic, produce
from tests.conftest import wait_until
from tests.raw_kafka import RawConnection, frame

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


def group_members(bootstrap: str, group_id: str) -> list[Any]:
    """The group's members as the broker at ``bootstrap`` describes them (DescribeGroups v5, raw)."""
    body = describe_groups.DescribeGroupsRequest(groups=(group_id,), include_authorized_operations=False)
    with RawConnection(bootstrap) as conn:
        conn.send(frame(15, 5, 1, body))
        [group] = conn.read_response(15, 5).body.groups
    assert group.error_code == 0, group
    return list(group.members)


def join_with_member_id(bootstrap: str, group_id: str, member_id: str) -> int:
    """A JoinGroup v9 with the given member id (no client lets one choose it); its error code."""
    timeout = datetime.timedelta(seconds=6)
    body = join_group.JoinGroupRequest(
        group_id=group_id,
        session_timeout=timeout,
        rebalance_timeout=timeout,
        member_id=member_id,
        group_instance_id=None,
        protocol_type="consumer",
        protocols=(join_group.JoinGroupRequestProtocol(name="range", metadata=b""),),
        reason=None,
    )
    with RawConnection(bootstrap) as conn:
        conn.send(frame(11, 9, 1, body))
        return int(conn.read_response(11, 9).body.error_code)


def poll_errors(consumer: Consumer, seconds: float) -> list[KafkaError]:
    """The errors a subscribed consumer reports within ``seconds`` (stops at the first)."""
    seen: list[KafkaError] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not seen:
        message = consumer.poll(0.5)
        if message is not None and message.error():
            seen.append(message.error())
    return seen


def test_a_consumer_with_a_250_character_group_id_is_refused(tansu, proxy) -> None:  # type: ignore[no-untyped-def]
    topic = unique("gid")
    create_topic(proxy.bootstrap, topic)
    group_id = unique("g").ljust(250, "g")
    consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": group_id, **GROUP_CONF})
    consumer.subscribe([topic])
    seen = poll_errors(consumer, 10)
    consumer.close()
    # The proxy answers the coordinator lookup itself, with the KIP's code.
    assert [e.code() for e in seen] == [KafkaError.INVALID_REQUEST]
    assert "group id (key) is 250 characters long" in seen[0].str()
    assert "group id (" in proxy.log()
    # The broker never saw the group (Tansu admits a 250-character group when asked directly).
    assert group_members(tansu.bootstrap, group_id) == []
    # At 249 the same consumer joins, and the broker has it.
    at_limit = group_id[:249]
    consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": at_limit, **GROUP_CONF})
    consumer.subscribe([topic])
    try:
        wait_until(lambda: consumer.poll(0.2) is None and consumer.assignment(), timeout=30)
        assert len(group_members(tansu.bootstrap, at_limit)) == 1
    finally:
        consumer.close()


def test_a_250_character_topic_name_is_refused_with_invalid_topic_exception_and_never_created(  # type: ignore[no-untyped-def]
    tansu, proxy
) -> None:
    topic = unique("topic").ljust(250, "t")
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    futures = admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    with pytest.raises(KafkaException) as info:
        futures[topic].result(timeout=CLIENT_TIMEOUT_S)
    assert info.value.args[0].code() == KafkaError.TOPIC_EXCEPTION  # 17, INVALID_TOPIC_EXCEPTION
    assert "topic name (topics[0].name) is 250 characters long" in info.value.args[0].str()
    direct = AdminClient({"bootstrap.servers": tansu.bootstrap})
    assert topic not in direct.list_topics(timeout=CLIENT_TIMEOUT_S).topics
    # 249 characters: created, as the broker itself lists it.
    create_topic(proxy.bootstrap, topic[:249])
    assert topic[:249] in direct.list_topics(timeout=CLIENT_TIMEOUT_S).topics


def test_offset_metadata_over_4096_is_refused_with_offset_metadata_too_large_and_not_committed(  # type: ignore[no-untyped-def]
    tansu, proxy
) -> None:
    """kafka-python commits, as it sends the metadata as given: confluent-kafka 2.16 sends a
    trailing NUL too (the proxy measured 4,097 characters for 4,096), as Kafka would count it."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KafkaPythonPartition
    from kafka.errors import OffsetMetadataTooLargeError
    from kafka.structs import OffsetAndMetadata

    topic, group_id = unique("meta"), unique("meta-group")
    create_topic(tansu.bootstrap, topic)
    partition = KafkaPythonPartition(topic, 0)
    through_proxy = KafkaConsumer(bootstrap_servers=proxy.bootstrap, group_id=group_id, enable_auto_commit=False)
    direct = Consumer({"bootstrap.servers": tansu.bootstrap, "group.id": group_id, **GROUP_CONF})

    def committed_at_the_broker() -> int:
        [committed] = direct.committed([TopicPartition(topic, 0)], timeout=CLIENT_TIMEOUT_S)
        return int(committed.offset)

    try:
        with pytest.raises(OffsetMetadataTooLargeError) as info:
            through_proxy.commit({partition: OffsetAndMetadata(5, "m" * 4097, -1)})
        assert info.value.errno == 12  # OFFSET_METADATA_TOO_LARGE
        # Nothing committed at the broker (Tansu commits 5,000 characters of metadata when asked directly).
        assert committed_at_the_broker() == -1001  # OFFSET_INVALID: no commit
        # 4,096 is the limit itself: committed.
        through_proxy.commit({partition: OffsetAndMetadata(5, "m" * 4096, -1)})
        assert committed_at_the_broker() == 5
    finally:
        through_proxy.close()
        direct.close()


def test_a_config_change_on_a_250_character_resource_name_is_refused_and_never_applied(  # type: ignore[no-untyped-def]
    tansu, proxy
) -> None:
    """KIP-1233's "Resource name for configs and ACLs": a config set on a resource whose name
    is over 249 (here a topic Tansu created with a 250-character name, asked directly)."""
    topic = unique("cfg").ljust(250, "c")
    direct = AdminClient({"bootstrap.servers": tansu.bootstrap})
    direct.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(CLIENT_TIMEOUT_S)

    def alter(admin: AdminClient, value: str) -> None:
        entry = ConfigEntry("retention.ms", value, incremental_operation=AlterConfigOpType.SET)
        [future] = admin.incremental_alter_configs(
            [ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])]
        ).values()
        future.result(timeout=CLIENT_TIMEOUT_S)

    def retention() -> str | None:
        [future] = direct.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
        entry = future.result(timeout=CLIENT_TIMEOUT_S).get("retention.ms")
        return None if entry is None else str(entry.value)

    with pytest.raises(KafkaException) as info:
        alter(AdminClient({"bootstrap.servers": proxy.bootstrap}), "12345")
    assert info.value.args[0].code() == KafkaError.INVALID_REQUEST
    assert "resource name (resources[0].resource_name) is 250 characters long" in info.value.args[0].str()
    assert retention() != "12345"
    # The read-back would see the change: made directly, it is there.
    alter(direct, "12345")
    assert retention() == "12345"


def test_a_classic_member_id_over_286_is_refused_and_never_joins(tansu, proxy) -> None:  # type: ignore[no-untyped-def]
    """Classic member ids are the broker's ``<client.id>-<UUID>``, up to 249 + 1 + 36 = 286
    (KIP-848's client-generated 36 is tested against Apache Kafka). A raw JoinGroup: no
    client lets one choose the member id; Tansu admits any when asked directly."""
    group_id = unique("member")
    assert join_with_member_id(proxy.bootstrap, group_id, "m" * 287) == KafkaError.INVALID_REQUEST
    assert group_members(tansu.bootstrap, group_id) == []
    assert join_with_member_id(proxy.bootstrap, group_id, "m" * 286) == 0
    assert [len(m.member_id) for m in group_members(tansu.bootstrap, group_id)] == [286]


def test_a_consumer_with_a_250_character_group_instance_id_is_refused(tansu, proxy) -> None:  # type: ignore[no-untyped-def]
    topic, group_id = unique("static"), unique("static-group")
    create_topic(tansu.bootstrap, topic)
    instance_id = unique("instance").ljust(250, "i")
    config = {"bootstrap.servers": proxy.bootstrap, "group.id": group_id, **GROUP_CONF}
    consumer = Consumer({**config, "group.instance.id": instance_id})
    consumer.subscribe([topic])
    seen = poll_errors(consumer, 10)
    consumer.close()
    assert [e.code() for e in seen] == [KafkaError.INVALID_REQUEST]  # JoinGroup, answered by the proxy
    assert "refuse join_group: group instance id (group_instance_id) is 250 characters long" in proxy.log()
    assert group_members(tansu.bootstrap, group_id) == []
    # 249: joins, and the broker has the static member (Tansu names it after the instance id).
    consumer = Consumer({**config, "group.instance.id": instance_id[:249]})
    consumer.subscribe([topic])
    try:
        wait_until(lambda: consumer.poll(0.2) is None and consumer.assignment(), timeout=30)
        [member] = group_members(tansu.bootstrap, group_id)
        assert member.member_id.startswith(instance_id[:249])
    finally:
        consumer.close()


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


@pytest.mark.parametrize(
    ("api_key", "version", "path", "value", "where"),
    [
        (78, 1, "member_id", "m" * 37, "error_code"),  # ShareFetch: KIP-932's member id
        (79, 2, "group_id", "g" * 250, "error_code"),  # ShareAcknowledge
        (88, 0, "member_id", "m" * 37, "error_code"),  # StreamsGroupHeartbeat: KIP-1071's member id
        (84, 0, "group_id", "g" * 250, "results[0].partitions[0].error_code"),  # ReadShareGroupState
    ],
)
def test_share_and_streams_group_requests_over_the_limit_are_answered_by_the_proxy(  # type: ignore[no-untyped-def]
    proxy, api_key: int, version: int, path: str, value: str, where: str
) -> None:
    """The APIs the hand-written KIP table added to the policy, through the running proxy (raw:
    Tansu has none of them, so what answers is the proxy, with the KIP's code where Kafka puts it)."""
    from tests.kio_entities import make_request

    body = make_request(api_key, version, {path: value})
    with RawConnection(proxy.bootstrap) as conn:
        conn.send(frame(api_key, version, 3, body))
        response = conn.read_response(api_key, version)
    assert response.header.correlation_id == 3
    found: Any = response.body
    for part in where.split("."):
        name, _, index = part.partition("[")
        found = getattr(found, name)
        if index:
            found = found[int(index.rstrip("]"))]
    assert found == KafkaError.INVALID_REQUEST
    assert f"({path}) is {len(value)} characters long" in proxy.log()
