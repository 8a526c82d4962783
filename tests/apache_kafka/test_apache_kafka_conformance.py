"""Conformance with Apache Kafka's own enforcement: each scenario runs twice,
once against a broker with the limit set (``limited_kafka``), once against the
proxy with the same limit in front of a broker without it (``kafka``), and the
client must see the same thing both times: the same error codes and messages,
the same members admitted and refused, the same connections closed.

Each scenario returns a short description of what the client saw; the two must
be equal, and equal to what Kafka's rule says (so a limit that never fired in
either run fails too). ``pytest -m apache_kafka -rA`` prints the table."""

from __future__ import annotations

import datetime
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]
from kio.index import load_request_schema

from policies.api_keys import INT_MAX, METADATA
from proxy.protocol import wire
from tests.apache_kafka.broker import ApacheKafkaBroker
from tests.apache_kafka.conftest import LIMITED_SOURCE, LIMITS, ConformanceRows
from tests.clients import GROUP_CONF, Member, create_topic, unique, wait_for
from tests.raw_kafka import RawConnection, api_versions_frame, frame, join_group_frame

pytestmark = pytest.mark.apache_kafka

JOIN_GROUP, CONSUMER_GROUP_HEARTBEAT = 11, 68
JOIN_GROUP_VERSION, HEARTBEAT_VERSION = 9, 1
MAX_REQUEST = int(LIMITS["socket.request.max.bytes"])
PER_IP = int(LIMITS["max.connections.per.ip"])


@pytest.fixture
def limited_proxy(kafka: ApacheKafkaBroker, start_proxy: Any) -> Any:
    """The proxy with the four limits, in front of the broker that has none."""
    policies = {k: int(v) if v.isdigit() else v for k, v in LIMITS.items()}
    return start_proxy(kafka.bootstrap, node_ids=(ApacheKafkaBroker.NODE_ID,), policies=policies)


# --- scenarios: each takes a bootstrap address, returns what the client saw ---------


def _coordinator_view(bootstrap: str, group: str) -> str:
    """How many members the group's coordinator itself lists (asked through ``bootstrap``)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    described = admin.describe_consumer_groups([group])[group].result(timeout=10)
    return f"coordinator lists {len(described.members)} members"


def _members_outcome(members: list[Member]) -> list[str]:
    seen = []
    for n, m in enumerate(members, 1):
        codes = sorted({(e.code(), e.name()) for e in m.errors})
        seen.append(
            f"consumer {n}: "
            + ("joined" if m.assigned else "not joined")
            + "".join(f", error {name} ({code})" for code, name in codes)
        )
    return seen


def _request_module(api_key: int, version: int) -> Any:
    """kio's module of that request version (the request class and its nested entities)."""
    return __import__(load_request_schema(api_key, version).__module__, fromlist=["x"])


def _exchange(bootstrap: str, api_key: int, version: int, body: Any) -> Any:
    """One request on a connection of its own; the decoded response body."""
    with RawConnection(bootstrap) as conn:
        conn.send(frame(api_key, version, 1, body))
        return conn.read_response(api_key, version).body


def _raw_join(bootstrap: str, group: str, _topic: str) -> str:
    """A JoinGroup from a new member (empty member id) and the broker's whole answer."""
    request_module = _request_module(JOIN_GROUP, JOIN_GROUP_VERSION)
    body = request_module.JoinGroupRequest(
        group_id=group,
        session_timeout=datetime.timedelta(seconds=10),
        rebalance_timeout=datetime.timedelta(seconds=10),
        member_id="",
        group_instance_id=None,
        protocol_type="consumer",
        protocols=(request_module.JoinGroupRequestProtocol(name="range", metadata=b""),),
        reason=None,
    )
    r = _exchange(bootstrap, JOIN_GROUP, JOIN_GROUP_VERSION, body)
    return (
        f"raw JoinGroup v{JOIN_GROUP_VERSION}: error {r.error_code}, member_id {r.member_id!r}, "
        f"generation {r.generation_id}, leader {r.leader!r}, members {len(r.members)}"
    )


def _two_then_a_third(
    bootstrap: str, name: str, conf: dict[str, Any], raw: Callable[[str, str, str], str]
) -> list[str]:
    """Two consumers join, then a third, then ``raw`` asks to join the full group itself."""
    topic, group = unique(name), unique(name)
    create_topic(bootstrap, topic, partitions=4)
    members = [Member(bootstrap, topic, group, **conf), Member(bootstrap, topic, group, **conf)]
    try:
        assert wait_for(lambda: all(m.assigned for m in members), timeout=30)
        members.append(Member(bootstrap, topic, group, **conf))
        assert wait_for(lambda: bool(members[2].errors), timeout=20)
        answer = raw(bootstrap, group, topic)
        time.sleep(1)  # would a refused member get in after all, or an admitted one drop out?
        return [*_members_outcome(members), answer, _coordinator_view(bootstrap, group)]
    finally:
        for m in members:
            m.stop()


def classic_group_over_group_max_size(bootstrap: str) -> list[str]:
    """Two consumers join a classic group, then a third (confluent-kafka), then a raw JoinGroup."""
    return _two_then_a_third(bootstrap, "conf-classic", {"heartbeat.interval.ms": 500}, _raw_join)


def classic_group_joined_by_three_at_once(bootstrap: str) -> list[str]:
    """Three consumers (confluent-kafka) start at the same moment on an empty classic group."""
    topic, group = unique("conf-rush"), unique("conf-rush")
    create_topic(bootstrap, topic, partitions=4)
    # max.poll.interval.ms is a classic group's rebalance timeout: a join round the three
    # race into waits for every member up to it (300 s by default), which on a loaded
    # 2-core machine outlasted the wait below (twice in four full runs, broker and proxy alike).
    quick = {"heartbeat.interval.ms": 500, "max.poll.interval.ms": 10_000}
    members = [Member(bootstrap, topic, group, **quick) for _ in range(3)]
    try:
        assert wait_for(lambda: sum(m.assigned for m in members) >= 2 and any(m.errors for m in members), timeout=45)
        time.sleep(2)  # nobody else gets in, nobody drops out: wait for the last rebalance to settle
        wait_for(lambda: sum(m.assigned for m in members) == 2, timeout=15)
        outcome = sorted(_members_outcome(members))
        # which of the three is refused is a race; how many is the rule
        return [
            f"{sum('joined' in line and 'not' not in line for line in outcome)} joined",
            f"{sum('GROUP_MAX_SIZE_REACHED' in line for line in outcome)} refused with GROUP_MAX_SIZE_REACHED (81)",
            _coordinator_view(bootstrap, group),
        ]
    finally:
        for m in members:
            m.stop()


def _static_restart(bootstrap: str, protocol: dict[str, str]) -> list[str]:
    topic, group = unique("conf-static"), unique("conf-static")
    create_topic(bootstrap, topic, partitions=4)
    quick = {} if protocol else {"heartbeat.interval.ms": 500}
    a = Member(bootstrap, topic, group, **{"group.instance.id": "a"}, **quick, **protocol)
    b = Member(bootstrap, topic, group, **{"group.instance.id": "b"}, **quick, **protocol)
    again = None
    try:
        assert wait_for(lambda: a.assigned and b.assigned, timeout=30)
        a.stop()  # a static member stops without leaving the group ...
        stopped = time.monotonic()
        again = Member(bootstrap, topic, group, **{"group.instance.id": "a"}, **quick, **protocol)  # ... and is back
        wait_for(lambda: again.assigned or bool(again.errors), timeout=20)
        seen = [*_members_outcome([b, again])]
        joined = wait_for(lambda: again.assigned, timeout=40)
        after = time.monotonic() - stopped
        # a's old incarnation's session: librdkafka's session.timeout.ms (6 s) in a classic
        # group, the broker's group.consumer.session.timeout.ms (45 s) in a KIP-848 one
        session_s = 45 if protocol else GROUP_CONF["session.timeout.ms"] / 1000
        seen.append(
            "restarted a "
            + (
                "never joined"
                if not joined
                else "joined once a's old session had ended"
                if after >= session_s
                else "joined before a's old session ended"
            )
        )
        return [*seen, _coordinator_view(bootstrap, group)]
    finally:
        for m in (b, again):
            if m is not None:
                m.stop()


def classic_static_member_restarts_in_a_full_group(bootstrap: str) -> list[str]:
    """Static members a and b (group.instance.id) fill a classic group; a's consumer stops
    without leaving (as static members do) and a new one with instance id a starts."""
    return _static_restart(bootstrap, {})


def kip848_static_member_restarts_in_a_full_group(bootstrap: str) -> list[str]:
    """The same with KIP-848 consumers: a leaves temporarily (epoch -2), a new a joins."""
    return _static_restart(bootstrap, {"group.protocol": "consumer"})


def _raw_heartbeat(bootstrap: str, group: str, topic: str) -> str:
    """A KIP-848 join (member epoch 0) from a new member and the broker's answer."""
    request_module = _request_module(CONSUMER_GROUP_HEARTBEAT, HEARTBEAT_VERSION)
    body = request_module.ConsumerGroupHeartbeatRequest(
        group_id=group,
        member_id=str(uuid.uuid4())[:22],
        member_epoch=0,
        instance_id=None,
        rack_id=None,
        rebalance_timeout=datetime.timedelta(seconds=30),
        subscribed_topic_names=(topic,),
        subscribed_topic_regex=None,
        server_assignor=None,
        topic_partitions=(),
    )
    r = _exchange(bootstrap, CONSUMER_GROUP_HEARTBEAT, HEARTBEAT_VERSION, body)
    return (
        f"raw ConsumerGroupHeartbeat v{HEARTBEAT_VERSION}: error {r.error_code}, "
        f"message {r.error_message!r}, epoch {r.member_epoch}, assignment {r.assignment}"
    )


def kip848_group_over_group_consumer_max_size(bootstrap: str) -> list[str]:
    """Two KIP-848 consumers join, then a third (confluent-kafka), then a raw heartbeat."""
    return _two_then_a_third(bootstrap, "conf-848", {"group.protocol": "consumer"}, _raw_heartbeat)


_FAKE_JOINS = (("v5 unknown member id", 5, "fake-member", None), ("v5 static", 5, "", "fake"), ("v3", 3, "", None))


def fake_joins_then_two_consumers(bootstrap: str) -> list[str]:
    """Issue 33's fake members: per variant (v5 with an unknown member id, v5 static, v3 without a
    member id), two JoinGroups with INT32_MAX timeouts, each followed in the same send by a length
    prefix of -1; then two static JoinGroups v5 on live connections with an INT32_MAX session
    timeout; then two consumers join."""
    topic, group = unique("conf-fake"), unique("conf-fake")
    create_topic(bootstrap, topic, partitions=2)
    for _, version, member_id, instance_id in _FAKE_JOINS:
        for n in range(2):
            iid = instance_id and f"{instance_id}-{n}"
            with RawConnection(bootstrap) as conn:
                conn.send(join_group_frame(1, group, version, member_id, iid, INT_MAX, INT_MAX) + b"\xff" * 4)
                conn.bytes_until_closed()  # Kafka answers the join first, the proxy never forwards it
    seen = []
    for n in range(2):
        with RawConnection(bootstrap) as conn:
            conn.send(join_group_frame(1, group, 5, "", f"live-{n}", INT_MAX, 10_000))
            answer = conn.read_response(JOIN_GROUP, 5).body
            seen.append(f"static JoinGroup with session timeout {INT_MAX} ms: error {answer.error_code}")
    members = [Member(bootstrap, topic, group, **{"heartbeat.interval.ms": 500}) for _ in range(2)]
    try:
        wait_for(lambda: all(m.assigned or m.errors for m in members), timeout=30)
        return [*seen, *_members_outcome(members), _coordinator_view(bootstrap, group)]
    finally:
        for m in members:
            m.stop()


def _answered(conn: RawConnection, correlation_id: int) -> str:
    try:
        conn.send(api_versions_frame(correlation_id))
        conn.read_frame()
        return "answered"
    except (ConnectionError, OSError):  # EOF or reset: which one is a race on the client's side
        return "closed, no bytes"


def connections_over_max_connections_per_ip(bootstrap: str) -> list[str]:
    """From 127.0.0.2: one connection more than allowed, each sending ApiVersions; then
    one closes and a new one is tried until answered (Kafka frees the slot asynchronously)."""
    conns = [RawConnection(bootstrap, 5, source=LIMITED_SOURCE) for _ in range(PER_IP + 1)]
    try:
        seen = [f"connection {n}: {_answered(c, n)}" for n, c in enumerate(conns, 1)]
        conns[0].close()
        freed = False
        deadline = time.monotonic() + 5
        while not freed and time.monotonic() < deadline:
            with RawConnection(bootstrap, 5, source=LIMITED_SOURCE) as again:
                freed = _answered(again, 99) == "answered"
        seen.append("after connection 1 closed, a new one: " + ("answered" if freed else "never answered"))
        return seen
    finally:
        for c in conns:
            c.close()


def _metadata_request_of_size(size: int) -> tuple[bytes, int]:
    """A valid Metadata v12 request whose frame is exactly ``size`` bytes after the length prefix
    (padded with topic names; Kafka strings are at most 32767 bytes, so one long name will not do)."""
    module = _request_module(METADATA, 12)

    def build(names: list[str]) -> bytes:
        topics = tuple(module.MetadataRequestTopic(topic_id=uuid.UUID(int=0), name=n) for n in names)
        body = module.MetadataRequest(
            topics=topics,
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        return frame(METADATA, 12, 3, body)

    # distinct names of 100 bytes (a 1-byte length each) until the size is reached, then the
    # last one trimmed, or dropped and the one before lengthened, to hit it exactly
    names = [f"{n:05d}".ljust(100, "t") for n in range(max(0, size // 118 - 2))]  # ~118 bytes each
    while len(build(names)) - 4 < size:
        names.append(f"{len(names):05d}".ljust(100, "t"))
    excess = len(build(names)) - 4 - size
    if excess <= len(names[-1]) - 5:
        names[-1] = names[-1][: len(names[-1]) - excess]
    else:
        names.pop()
        names[-1] += "t" * (size - (len(build(names)) - 4))
    request = build(names)
    assert len(request) - 4 == size
    return request, len(names)


def requests_over_socket_request_max_bytes(bootstrap: str) -> list[str]:
    """A request of exactly the limit, one a byte over (its connection ends in an EOF the client
    reads, not a reset), and a length prefix over it alone."""
    seen = []
    for size in (MAX_REQUEST, MAX_REQUEST + 1):
        with RawConnection(bootstrap, 10) as conn:
            request, topics = _metadata_request_of_size(size)
            conn.send(request)
            try:
                response = wire.decode_response(conn.read_frame(), METADATA, 12).body
                named = len(response.topics)
                every = "every topic" if named == topics else f"{named} of {topics} topics"
                seen.append(f"request of {size} bytes: answered ({every} named)")
            except ConnectionResetError:
                seen.append(f"request of {size} bytes: reset, no bytes")
            except (ConnectionError, OSError):  # read_frame's EOF
                seen.append(f"request of {size} bytes: closed (EOF), no bytes")
    with RawConnection(bootstrap, 5) as conn:
        conn.send((MAX_REQUEST + 1).to_bytes(4, "big"))  # the length alone, no body follows
        started = time.monotonic()
        closed = conn.closed_by_peer()
        seen.append(
            f"length prefix {MAX_REQUEST + 1} alone: "
            + ("closed at once, no bytes" if closed and time.monotonic() - started < 3 else "not closed at once")
        )
    return seen


EXPECTED: dict[Callable[[str], list[str]], list[str]] = {
    classic_group_over_group_max_size: [
        "consumer 1: joined",
        "consumer 2: joined",
        "consumer 3: not joined, error GROUP_MAX_SIZE_REACHED (81)",
        "raw JoinGroup v9: error 81, member_id '', generation -1, leader '', members 0",
        "coordinator lists 2 members",
    ],
    classic_group_joined_by_three_at_once: [
        "2 joined",
        "1 refused with GROUP_MAX_SIZE_REACHED (81)",
        "coordinator lists 2 members",
    ],
    kip848_group_over_group_consumer_max_size: [
        "consumer 1: joined",
        "consumer 2: joined",
        "consumer 3: not joined, error _FATAL (-150)",
        "raw ConsumerGroupHeartbeat v1: error 81, message 'The consumer group has reached its maximum "
        "capacity of 2 members.', epoch 0, assignment None",
        "coordinator lists 2 members",
    ],
    classic_static_member_restarts_in_a_full_group: [
        "consumer 1: joined",
        "consumer 2: not joined, error GROUP_MAX_SIZE_REACHED (81)",
        "restarted a joined once a's old session had ended",
        "coordinator lists 2 members",
    ],
    kip848_static_member_restarts_in_a_full_group: [
        "consumer 1: joined",
        "consumer 2: joined",
        "restarted a joined before a's old session ended",
        "coordinator lists 2 members",
    ],
    fake_joins_then_two_consumers: [
        *[f"static JoinGroup with session timeout {INT_MAX} ms: error 26"] * 2,  # INVALID_SESSION_TIMEOUT
        "consumer 1: joined",
        "consumer 2: joined",
        "coordinator lists 2 members",
    ],
    connections_over_max_connections_per_ip: [
        *(f"connection {n}: answered" for n in range(1, PER_IP + 1)),
        f"connection {PER_IP + 1}: closed, no bytes",
        "after connection 1 closed, a new one: answered",
    ],
    requests_over_socket_request_max_bytes: [
        f"request of {MAX_REQUEST} bytes: answered (every topic named)",
        f"request of {MAX_REQUEST + 1} bytes: closed (EOF), no bytes",
        f"length prefix {MAX_REQUEST + 1} alone: closed at once, no bytes",
    ],
}
LIMIT_OF = {
    classic_group_over_group_max_size: "group.max.size=2",
    classic_group_joined_by_three_at_once: "group.max.size=2",
    classic_static_member_restarts_in_a_full_group: "group.max.size=2",
    kip848_static_member_restarts_in_a_full_group: "group.consumer.max.size=2",
    kip848_group_over_group_consumer_max_size: "group.consumer.max.size=2",
    fake_joins_then_two_consumers: "group.max.size=2",
    connections_over_max_connections_per_ip: f"max.connections.per.ip={PER_IP}",
    requests_over_socket_request_max_bytes: f"socket.request.max.bytes={MAX_REQUEST}",
}


@pytest.mark.parametrize("scenario", list(EXPECTED), ids=[s.__name__ for s in EXPECTED])
def test_the_proxy_enforces_the_limit_as_the_broker_does(
    scenario: Callable[[str], list[str]],
    limited_kafka: ApacheKafkaBroker,
    limited_proxy: Any,
    conformance_rows: ConformanceRows,
) -> None:
    by_broker = scenario(limited_kafka.bootstrap)
    by_proxy = scenario(limited_proxy.bootstrap)
    conformance_rows.append((LIMIT_OF[scenario], " ".join((scenario.__doc__ or "").split()), by_broker, by_proxy))
    assert by_proxy == by_broker
    assert by_broker == EXPECTED[scenario]
