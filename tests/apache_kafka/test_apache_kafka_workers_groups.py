"""``group.consumer.max.size`` with ``workers: N`` (issue 29): a KIP-848 group run by Apache
Kafka's own coordinator, whose members' joins (ConsumerGroupHeartbeat, epoch 0) went through
different worker processes, is refused at exactly the cap by the owner's one count, with real
confluent-kafka consumers (``group.protocol: consumer``)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from tests.apache_kafka.broker import ApacheKafkaBroker
from tests.clients import CLIENT_TIMEOUT_S, Member, create_topic, produce, unique, wait_for
from tests.conftest import wait_until
from tests.workers_groups import group_members_metric_is, members_on_two_workers, refused_join
from tests.workers_util import start_workers

pytestmark = pytest.mark.apache_kafka


def broker_members(broker: ApacheKafkaBroker, group: str) -> int:
    """Members of ``group`` as the broker's coordinator reports them (asked directly)."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    return len(admin.describe_consumer_groups([group])[group].result(timeout=CLIENT_TIMEOUT_S).members)


def refused_as_fatal(member: Member) -> bool:
    """librdkafka makes a KIP-848 join answered GROUP_MAX_SIZE_REACHED a fatal error naming it."""
    return any(e.code() == KafkaError._FATAL and "reached maximum size" in e.str() for e in member.errors)


@pytest.mark.parametrize("workers", [2, 4])
def test_a_kip_848_group_over_two_workers_is_refused_at_exactly_group_consumer_max_size(
    kafka: ApacheKafkaBroker, start_proxy: Any, workers: int
) -> None:
    proxy = start_workers(
        start_proxy,
        kafka.bootstrap,
        workers,
        node_ids=(ApacheKafkaBroker.NODE_ID,),
        policies={"group.consumer.max.size": 2},
    )
    topic, group = unique("wg-848"), unique("w-848")
    create_topic(proxy.bootstrap, topic, partitions=4)
    members: list[Member] = []

    def start(client_id: str) -> Member:
        members.append(Member(proxy.bootstrap, topic, group, **{"client.id": client_id, "group.protocol": "consumer"}))
        return members[-1]

    try:
        first, second = members_on_two_workers(proxy, group, start)
        wait_until(group_members_metric_is(proxy, 2))  # the owner's one count
        third = start("m-over")
        refused_by = refused_join(proxy, group, third, "m-over", seen=refused_as_fatal)
        assert 0 <= refused_by < workers
        assert not third.assigned
        assert broker_members(kafka, group) == 2  # the coordinator never saw the third join
        produce(proxy.bootstrap, topic, 40)
        assert wait_for(lambda: first.records + second.records >= 40)
    finally:
        for member in members:
            member.stop()
