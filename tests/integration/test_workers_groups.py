"""``group.max.size`` with ``workers: N`` (issue 29): a classic group whose members' joins went
through different worker processes is refused at exactly the cap, by the owner's one count, with
real confluent-kafka consumers in front of Tansu. (KIP-848's ``group.consumer.max.size``: in
tests/apache_kafka/test_apache_kafka_workers_groups.py, Apache Kafka runs KIP-848 groups.)"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
from confluent_kafka import KafkaError

from policies.api_keys import JOIN_GROUP
from tests.clients import Member, create_topic, produce, unique, wait_for
from tests.conftest import wait_until
from tests.integration.test_graceful_shutdown import topic_id
from tests.integration.test_group_size_through_proxy import coordinator_members, settled
from tests.integration.test_workers import close_all, connections_on_every_worker
from tests.raw_kafka import fetch_frame, join_group_frame
from tests.workers_groups import (
    GROUP_MAX_SIZE_REACHED,
    MEMBER_ID_REQUIRED,
    group_members_metric_is,
    joins,
    members_on_two_workers,
    refused_join,
)
from tests.workers_util import start_workers, worker_pids


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
        assert wait_for(lambda: settled(tansu.bootstrap, group, 2))
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


@pytest.mark.kills_workers
def test_a_killed_workers_join_in_flight_is_released_and_its_slot_taken_by_the_next(
    tansu: Any, start_proxy: Any
) -> None:
    """A join in flight on one worker (held behind a Fetch the broker keeps waiting: a broker
    answers a connection's requests in order) takes the group's one slot, so a join through the
    other worker is refused. SIGKILL the first worker: the owner releases its join (counted as
    ``group_joins``), and the other worker's next join is admitted."""
    proxy = start_workers(start_proxy, tansu.bootstrap, 2, policies={"group.max.size": 1})
    topic, group = unique("wg-kill"), unique("w-kill")
    create_topic(proxy.bootstrap, topic)
    by_worker = connections_on_every_worker(proxy, 2, 16)
    victim, survivor = 0, 1
    held, other = by_worker[victim][0], by_worker[survivor][0]
    try:
        tid = topic_id(held, topic)
        held.send(fetch_frame(2, tid, max_wait_ms=20_000) + _join(3, group))
        wait_until(lambda: joins(proxy, group) == [("raw-test", victim, "admit")])
        other.send(_join(4, group))
        assert int(other.read_response(JOIN_GROUP, 3).body.error_code) == GROUP_MAX_SIZE_REACHED
        assert joins(proxy, group)[-1] == ("raw-test", survivor, "refuse-enforce")
        os.kill(worker_pids(proxy)[victim], signal.SIGKILL)
        assert held.closed_by_peer()
        wait_until(lambda: proxy.metric("kafka_admission_worker_released_total", what="group_joins") == 1)
        other.send(_join(5, group))
        answer = other.read_response(JOIN_GROUP, 3).body
        # admitted: forwarded, and the broker answered it (Tansu asks for KIP-394's round even at v3)
        assert joins(proxy, group)[-1] == ("raw-test", survivor, "admit")
        assert int(answer.error_code) in (0, MEMBER_ID_REQUIRED) and answer.member_id, answer
    finally:
        close_all(by_worker)


def _join(correlation_id: int, group: str) -> bytes:
    """A JoinGroup v3 of a new member."""
    return join_group_frame(correlation_id, group, 3, "", None, 30_000, 60_000)
