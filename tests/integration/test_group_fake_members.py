"""Issue 33, attack 1: filling a consumer group with fake members through the proxy.

A raw client sends a JoinGroup for the group with both timeouts at INT32_MAX and, in the same TCP
send, a frame whose length prefix is -1: the proxy reads the join, then closes the connection on the
bad prefix before the batch goes on, so the broker never sees the join. On main such a join held a
slot for about 2 x 24.8 days (its own timeouts), and ``group.max.size`` of them refused every real
consumer of the group with GROUP_MAX_SIZE_REACHED. Kafka counts a member only when its coordinator
admits it: a join that never reached the broker holds no slot here either, and a join in flight dies
with its connection (``GroupSizePolicy.on_join_unanswered``).

Each variant alone filled the group on main: JoinGroup v5 with an unknown member id, v5 static
(``group.instance.id``, no member id), v3 without a member id; and KIP-848 ConsumerGroupHeartbeat
joins (epoch 0) against ``group.consumer.max.size``."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import pytest
from kio.index import load_request_schema

from policies.api_keys import CONSUMER_GROUP_HEARTBEAT, INT_MAX
from tests.clients import Member, create_topic, refused, unique, wait_for
from tests.raw_kafka import RawConnection, frame, join_group_frame

CAP = 3
POLICIES = {"group.max.size": CAP, "group.consumer.max.size": CAP}
_FOREVER = datetime.timedelta(milliseconds=INT_MAX)
_BAD_PREFIX = (-1).to_bytes(4, "big", signed=True)


def _join_group(group: str, version: int, member_id: str, instance_id: str | None) -> bytes:
    return join_group_frame(1, group, version, member_id, instance_id, INT_MAX, INT_MAX)


def _consumer_join(group: str, member_id: str) -> bytes:
    schema: Any = load_request_schema(CONSUMER_GROUP_HEARTBEAT, 0)
    body = schema(
        group_id=group,
        member_id=member_id,
        member_epoch=0,
        instance_id=None,
        rack_id=None,
        rebalance_timeout=_FOREVER,
        subscribed_topic_names=("t",),
        server_assignor=None,
        topic_partitions=(),
    )
    return frame(CONSUMER_GROUP_HEARTBEAT, 0, 1, body)


def _send_and_be_closed(bootstrap: str, request: bytes) -> None:
    """The join and the bad prefix in one send; the proxy closes the connection on the prefix."""
    with RawConnection(bootstrap) as conn:
        conn.send(request + _BAD_PREFIX)
        assert conn.bytes_until_closed() == b""  # closed without an answer to the join


def _fake_joins(bootstrap: str, group: str, variant: str) -> None:
    for i in range(CAP):
        if variant == "v5-unknown-member-id":
            request = _join_group(group, 5, f"fake-{uuid.uuid4()}", None)
        elif variant == "v5-static":
            request = _join_group(group, 5, "", f"fake-instance-{i}")
        elif variant == "v3-no-member-id":
            request = _join_group(group, 3, "", None)
        else:
            request = _consumer_join(group, str(uuid.uuid4()))
        _send_and_be_closed(bootstrap, request)


@pytest.mark.parametrize("variant", ["v5-unknown-member-id", "v5-static", "v3-no-member-id"])
def test_joins_that_never_reach_the_broker_leave_room_for_a_real_consumer(
    tansu: Any, start_proxy: Any, variant: str
) -> None:
    proxy = start_proxy(tansu.bootstrap, policies=POLICIES)
    topic, group = unique("fake-members"), unique("payments")
    create_topic(proxy.bootstrap, topic, partitions=2)
    joins_before = proxy.metric("kafka_admission_requests_total", api="join_group")
    _fake_joins(proxy.bootstrap, group, variant)
    # The proxy did read every fake join (the attack happened), and closed on the bad prefix.
    assert proxy.metric("kafka_admission_requests_total", api="join_group") - joins_before == CAP
    assert proxy.metric("kafka_admission_connection_failures_total", cause="request_invalid_size") >= CAP
    real = Member(proxy.bootstrap, topic, group)
    try:
        assert wait_for(lambda: real.has_assignment() or refused(real), timeout=40), real.errors
        assert not refused(real), real.errors
        assert real.has_assignment()
    finally:
        real.stop()
    assert proxy.metric("kafka_admission_decisions_total", policy="group_size", action="refuse") == 0


def test_kip848_joins_that_never_reach_the_broker_hold_no_slot(tansu: Any, start_proxy: Any) -> None:
    """ConsumerGroupHeartbeat joins (epoch 0) the same way; then a fourth join is forwarded, not
    answered GROUP_MAX_SIZE_REACHED by the proxy (what the broker answers is its own business:
    Tansu may not run KIP-848 groups)."""
    proxy = start_proxy(tansu.bootstrap, policies=POLICIES)
    group = unique("payments")
    _fake_joins(proxy.bootstrap, group, "kip848")
    assert proxy.metric("kafka_admission_requests_total", api="consumer_group_heartbeat") == CAP
    with RawConnection(proxy.bootstrap) as conn:
        conn.send(_consumer_join(group, str(uuid.uuid4())))
        try:
            answer = conn.read_response(CONSUMER_GROUP_HEARTBEAT, 0).body
        except (ConnectionError, TimeoutError):
            answer = None  # the broker closed instead of answering: it was forwarded
    assert answer is None or int(answer.error_code) != 81, answer
    assert proxy.metric("kafka_admission_decisions_total", policy="group_size", action="refuse") == 0
