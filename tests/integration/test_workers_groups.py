"""``group.max.size`` with ``workers: N`` (issue 29): a classic group whose members' joins went
through different worker processes is refused at exactly the cap, by the owner's one count, with
real confluent-kafka consumers in front of Tansu. (KIP-848's ``group.consumer.max.size``: in
tests/apache_kafka/test_apache_kafka_workers_groups.py, Apache Kafka runs KIP-848 groups.)"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError

from tests.clients import Member, create_topic, produce, unique, wait_for
from tests.conftest import wait_until
from tests.integration.test_group_size_through_proxy import coordinator_members
from tests.workers_groups import group_members_metric_is, joins, members_on_two_workers, refused_join
from tests.workers_util import start_workers


@pytest.mark.parametrize("workers", [2, 4])
def test_a_classic_group_over_two_workers_is_refused_at_exactly_group_max_size(
    tansu: Any, start_proxy: Any, workers: int
) -> None:
    proxy = start_workers(start_proxy, tansu.bootstrap, workers, policies={"group.max.size": 2})
    topic, group = unique("wg"), unique("w-classic")
    create_topic(proxy.bootstrap, topic, partitions=4)
    members: list[Member] = []

    def start(client_id: str) -> Member:
        members.append(Member(proxy.bootstrap, topic, group, **{"client.id": client_id}))
        return members[-1]

    try:
        first, second = members_on_two_workers(proxy, group, start)
        # The owner counts the group once: two members, whichever workers they came through.
        wait_until(group_members_metric_is(proxy, 2))
        third = start("m-over")
        refused_by = refused_join(proxy, group, third, "m-over")
        assert 0 <= refused_by < workers
        assert third.errors[0].code() == KafkaError.GROUP_MAX_SIZE_REACHED and not third.assigned
        # The broker never saw the third join: its coordinator has exactly the two members,
        # and they keep consuming.
        assert coordinator_members(tansu.bootstrap, group) == 2
        produce(proxy.bootstrap, topic, 40)
        assert wait_for(lambda: first.records + second.records >= 40)
        assert all(decision != "refuse-enforce" for client, _, decision in joins(proxy, group) if client != "m-over")
    finally:
        for member in members:
            member.stop()
