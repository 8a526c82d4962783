"""KIP-1233 through the proxy, for the identifiers Tansu has no API for: ACL principal and
host (CreateAcls: Tansu answers it with a frame librdkafka cannot parse), and the KIP-848
consumer group's member id (36) and rack id (ConsumerGroupHeartbeat). Broker: Apache
Kafka 4.4 itself, one node of this module's own with the StandardAuthorizer (the session
brokers have no authorizer, so no ACL API). Each over-long identifier is refused with the
KIP's code, asserted by code, and read back from the broker directly (not through the
proxy): the broker never saw it. At the limit it reaches the broker, and the read-back
finds it, so the read-back is one that can fail.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from kio.schema.consumer_group_describe.v0 import request as describe_request
from kio.schema.consumer_group_heartbeat.v0 import request as heartbeat_request
from kio.schema.find_coordinator.v4 import request as find_coordinator

from policies.api_keys import CONSUMER_GROUP_DESCRIBE, CONSUMER_GROUP_HEARTBEAT, FIND_COORDINATOR
from tests.apache_kafka.broker import ApacheKafkaBroker, JavaParts
from tests.clients import CLIENT_TIMEOUT_S, create_topic, unique
from tests.conftest import wait_until
from tests.raw_kafka import RawConnection, frame

pytestmark = pytest.mark.apache_kafka
LIMITS = {"resource.identifier.limit.enable": True}
GROUP_ID_NOT_FOUND = 69


@pytest.fixture(scope="module")
def acl_kafka(java_parts: JavaParts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheKafkaBroker]:
    """Apache Kafka with ACLs on; every (anonymous, PLAINTEXT) client is a super user."""
    properties = {
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS",
    }
    broker = ApacheKafkaBroker(java_parts, Path(tmp_path_factory.mktemp("acl-kafka")), properties=properties)
    with broker:
        # FindCoordinator creates __consumer_offsets; until then the coordinator answers every
        # group request NOT_COORDINATOR (and a refused request never reaches it to create it).
        body = find_coordinator.FindCoordinatorRequest(key_type=0, coordinator_keys=("warm-up",))
        wait_until(
            lambda: until_coordinated(broker.bootstrap, FIND_COORDINATOR, body, 4).coordinators[0].error_code == 0
        )
        yield broker


@pytest.fixture
def proxy(acl_kafka: ApacheKafkaBroker, start_proxy: Any) -> Any:
    return start_proxy(acl_kafka.bootstrap, node_ids=(ApacheKafkaBroker.NODE_ID,), policies=LIMITS)


def acls_with(broker: ApacheKafkaBroker, *, principal: str | None = None, host: str | None = None) -> list[AclBinding]:
    """The ACLs the broker has for this principal or host (asked directly)."""
    pattern = AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, principal, host, AclOperation.ANY, AclPermissionType.ANY
    )
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    return list(admin.describe_acls(pattern).result(timeout=CLIENT_TIMEOUT_S))


def create_acl(bootstrap: str, principal: str, host: str) -> None:
    binding = AclBinding(
        ResourceType.TOPIC,
        "orders",
        ResourcePatternType.LITERAL,
        principal,
        host,
        AclOperation.READ,
        AclPermissionType.ALLOW,
    )
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held: futures fail once it is collected
    admin.create_acls([binding])[binding].result(timeout=CLIENT_TIMEOUT_S)


@pytest.mark.parametrize(
    ("what", "principal", "host"),
    [
        ("ACL principal", "User:" + "p" * 245, "*"),  # 250 characters with its "User:"
        ("ACL host", "User:alice", "h" * 250),
    ],
)
def test_an_acl_with_a_250_character_principal_or_host_is_refused_and_never_created(
    acl_kafka: ApacheKafkaBroker, proxy: Any, what: str, principal: str, host: str
) -> None:
    with pytest.raises(KafkaException) as info:
        create_acl(proxy.bootstrap, principal, host)
    assert info.value.args[0].code() == KafkaError.INVALID_REQUEST
    assert f"{what} (creations[0]." in info.value.args[0].str()
    assert f"refuse create_acls: {what}" in proxy.log()
    assert acls_with(acl_kafka, principal=principal, host=host) == []
    # One character shorter: created, and the broker has it.
    shorter_principal, shorter_host = (principal[:249], host) if what == "ACL principal" else (principal, host[:249])
    create_acl(proxy.bootstrap, shorter_principal, shorter_host)
    [acl] = acls_with(acl_kafka, principal=shorter_principal, host=shorter_host)
    assert (acl.principal, acl.host) == (shorter_principal, shorter_host)


COORDINATOR_NOT_READY = {14, 15, 16}  # load in progress, not available, not coordinator: ask again


def heartbeat(bootstrap: str, group_id: str, member_id: str, topic: str, rack_id: str | None = None) -> int:
    """A KIP-848 joining heartbeat (epoch 0) with the member id the client generated; its error code.
    Raw: librdkafka generates its own member id and lets no one choose it."""
    body = heartbeat_request.ConsumerGroupHeartbeatRequest(
        group_id=group_id,
        member_id=member_id,
        member_epoch=0,
        instance_id=None,
        rack_id=rack_id,
        rebalance_timeout=datetime.timedelta(seconds=30),
        subscribed_topic_names=(topic,),
        server_assignor=None,
        topic_partitions=(),
    )
    return int(until_coordinated(bootstrap, CONSUMER_GROUP_HEARTBEAT, body).error_code)


def until_coordinated(bootstrap: str, api_key: int, body: Any, version: int = 0) -> Any:
    """The response to a group request, asked again while the coordinator is not ready
    (the first group of a fresh broker creates __consumer_offsets); at most 30 s."""
    deadline = time.monotonic() + 30
    while True:
        with RawConnection(bootstrap) as conn:
            conn.send(frame(api_key, version, 1, body))
            response = conn.read_response(api_key, version).body
        groups = getattr(response, "groups", None) or getattr(response, "coordinators", None) or [response]
        if groups[0].error_code not in COORDINATOR_NOT_READY or time.monotonic() > deadline:
            return response
        time.sleep(0.2)


def kip848_group(broker: ApacheKafkaBroker, group_id: str) -> Any:
    """The KIP-848 group as the broker's coordinator describes it (ConsumerGroupDescribe, directly)."""
    body = describe_request.ConsumerGroupDescribeRequest(group_ids=(group_id,), include_authorized_operations=False)
    [group] = until_coordinated(broker.bootstrap, CONSUMER_GROUP_DESCRIBE, body).groups
    return group


def test_a_kip848_member_id_over_36_is_refused_and_never_joins(acl_kafka: ApacheKafkaBroker, proxy: Any) -> None:
    """KIP-1233: "In KIPs 848, 932 and 1071, the client library is intended to generate a UUID
    to be used as the member ID": 36 characters, INVALID_REQUEST (42)."""
    topic, group_id = unique("kip848"), unique("kip848-group")
    create_topic(acl_kafka.bootstrap, topic)
    uuid_text = "8D8AC610-566D-4EF0-9C22-186B2A5ED792"
    assert heartbeat(proxy.bootstrap, group_id, uuid_text + "0", topic) == KafkaError.INVALID_REQUEST
    assert "refuse consumer_group_heartbeat: member id (member_id) is 37 characters long" in proxy.log()
    assert kip848_group(acl_kafka, group_id).error_code == GROUP_ID_NOT_FOUND
    # A UUID's 36: the coordinator admits the member.
    assert heartbeat(proxy.bootstrap, group_id, uuid_text, topic) == 0
    group = kip848_group(acl_kafka, group_id)
    assert group.error_code == 0 and [m.member_id for m in group.members] == [uuid_text]


def test_a_kip848_consumer_with_a_250_character_rack_id_is_refused(acl_kafka: ApacheKafkaBroker, proxy: Any) -> None:
    """``client.rack`` goes in ConsumerGroupHeartbeat's rack id (KIP-1233's "Rack ID"); a real
    confluent-kafka consumer of the KIP-848 protocol."""
    topic, group_id = unique("rack"), unique("rack-group")
    create_topic(acl_kafka.bootstrap, topic)
    config = {
        "bootstrap.servers": proxy.bootstrap,
        "group.id": group_id,
        "group.protocol": "consumer",
        "auto.offset.reset": "earliest",
    }
    rack = unique("rack").ljust(250, "r")
    errors: list[KafkaError] = []
    consumer = Consumer({**config, "client.rack": rack, "error_cb": errors.append})
    consumer.subscribe([topic])
    seen: list[KafkaError] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (seen or errors):
        message = consumer.poll(0.5)
        if message is not None and message.error():
            seen.append(message.error())
    consumer.close()
    # librdkafka makes an INVALID_REQUEST heartbeat answer fatal (its code is asserted raw below).
    [first, *_] = seen + errors
    assert first.code() == KafkaError._FATAL
    assert "ConsumerGroupHeartbeat fatal error: Broker: Invalid request" in first.str()
    assert "refuse consumer_group_heartbeat: rack id (rack_id) is 250 characters long" in proxy.log()
    assert kip848_group(acl_kafka, group_id).error_code == GROUP_ID_NOT_FOUND
    member_id = "8D8AC610-566D-4EF0-9C22-186B2A5ED792"
    assert heartbeat(proxy.bootstrap, group_id, member_id, topic, rack_id=rack) == KafkaError.INVALID_REQUEST
    assert kip848_group(acl_kafka, group_id).error_code == GROUP_ID_NOT_FOUND
    # 249: the consumer joins, and the coordinator has its rack.
    consumer = Consumer({**config, "client.rack": rack[:249]})
    consumer.subscribe([topic])
    try:
        wait_until(lambda: consumer.poll(0.2) is None and consumer.assignment(), timeout=30)
        [member] = kip848_group(acl_kafka, group_id).members
        assert member.rack_id == rack[:249]
    finally:
        consumer.close()
