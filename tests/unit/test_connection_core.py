"""The sans-I/O connection core, driven directly: bytes and events in, actions out. No
socket, no task, no clock (time is passed in). The parts it books against are the real
ones (a config generation, the memory pool and its gate, the decision recorder, the
traffic stats); only the connection quotas' activity timestamps are a list."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from kio.index import load_request_schema

from policies.api_keys import API_VERSIONS, JOIN_GROUP, METADATA, PRODUCE, SASL_AUTHENTICATE
from policies.close_cause import CloseCause, Closing
from policies.decision import Policy
from policies.group_size import GroupSizePolicy
from policies.memory_pool import MemoryPool
from policies.mode import Mode
from proxy.config.model import parse_config
from proxy.evidence.audit import AuditSink
from proxy.evidence.decisions import DecisionRecorder, Where
from proxy.evidence.metrics import Metrics
from proxy.evidence.observation_window import ObservationWindow
from proxy.hooks.generation import Generation
from proxy.hooks.request import Request
from proxy.links.brokers import BrokerDirectory
from proxy.links.upstream import UpstreamLink
from proxy.protocol import wire
from proxy.protocol.core import (
    HTTP_400,
    MAX_PENDING_REQUESTS,
    Actions,
    Answer,
    Close,
    Connect,
    ConnectionCore,
    Forward,
    Inspect,
    Note,
    Prepare,
    ResumeReading,
    SetDeadline,
    StopReading,
    WaitForPool,
)
from proxy.serve.pool_gate import PoolGate
from tests.raw_kafka import join_group_frame

MAX_REQUEST = 4096


class Activity:
    """The connection quotas' side: what the core told them, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []

    def on_request(self, conn_id: str, now: float) -> None:
        self.calls.append(("request", now))

    def on_response(self, conn_id: str, now: float) -> None:
        self.calls.append(("response", now))

    def touched(self, conn_id: str, now: float) -> None:
        self.calls.append(("touched", now))


class World:
    """What every connection of one proxy shares: its config generation (swapped on reload),
    the memory pool, the recorder."""

    def __init__(self, pool_bytes: int = 0, **policies: object) -> None:
        self.metrics = Metrics()
        self.number = 0
        self.rules = self.reload(**policies)
        self.pool = PoolGate(MemoryPool(pool_bytes, MAX_REQUEST, 0, Mode.ENFORCE), self.metrics, self.recorder, None)

    def reload(self, mode: str = "sidecar", **policies: object) -> Generation:
        config = parse_config(
            {
                "mode": mode,
                "upstream": {"bootstrap_servers": ["127.0.0.1:9092"]},
                "listeners": [{"name": "l", "bind": "127.0.0.1:1"}],
                "policies": {"socket.request.max.bytes": MAX_REQUEST, **policies},
            }
        )
        self.recorder = DecisionRecorder(self.metrics, AuditSink(config.audit, self.metrics))
        self.number += 1
        self.rules = Generation(
            self.number,
            config,
            groups=GroupSizePolicy(config.policies.group_size_config()),
            directory=BrokerDirectory(self.metrics),
            recorder=self.recorder,
        )
        return self.rules

    def core(
        self, conn_id: str = "l-1", *, sasl: bool = False, window: ObservationWindow | None = None
    ) -> tuple[ConnectionCore, Activity]:
        activity = Activity()
        where = Where("l", "127.0.0.1:5", conn_id)

        core = ConnectionCore(
            conn_id,
            "l",
            client_tls=False,
            upstream_tls=False,
            sasl=sasl,
            pool=self.pool,
            quotas=activity,
            stats=self.metrics.traffic_of("l"),
            window=window,
            recorder=self.recorder,
            where=where,
            make_request=Request,
            coordinator=_no_coordinator,
        )
        return core, activity

    def connected(self, first: bytes, conn_id: str = "l-1", **kw: Any) -> tuple[ConnectionCore, Activity, Actions]:
        """A core whose client sent ``first`` (at least a length prefix) and whose upstream connected."""
        core, activity = self.core(conn_id, **kw)
        assert kinds(core.client_bytes(first, self.rules, 1.0)) == [Connect]
        return core, activity, core.upstream_ready("127.0.0.1:9092", self.rules, 1.0)


async def _no_coordinator() -> UpstreamLink:
    raise AssertionError("no coordinator in these tests")


def kinds(actions: Actions) -> list[type]:
    return [a.__class__ for a in actions]


def forwarded(actions: Actions) -> bytes:
    return b"".join(bytes(a.data) for a in actions if isinstance(a, Forward))


def answered(actions: Actions) -> bytes:
    return b"".join(bytes(a.data) for a in actions if isinstance(a, Answer))


def closed(actions: Actions) -> Closing:
    assert actions and isinstance(actions[-1], Close), actions
    return actions[-1].closing


def request(api_key: int, version: int, correlation_id: int, client_id: str = "app", **fields: Any) -> bytes:
    return wire.encode_frame(
        wire.request_header_for(api_key, version, correlation_id, client_id),
        load_request_schema(api_key, version)(**fields),
    )


def api_versions(correlation_id: int, client_id: str = "app") -> bytes:
    return request(API_VERSIONS, 3, correlation_id, client_id, client_software_name="t", client_software_version="1")


def api_versions_of_size(correlation_id: int, size: int) -> bytes:
    """An ApiVersions request whose frame is ``size`` bytes after its length prefix."""
    for n in range(size):
        frame = request(
            API_VERSIONS, 3, correlation_id, "app", client_software_name="n" * n, client_software_version="1"
        )
        if len(frame) - 4 == size:
            return frame
    raise AssertionError(size)


def metadata(correlation_id: int) -> bytes:
    return request(
        METADATA,
        12,
        correlation_id,
        topics=None,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )


def produce(correlation_id: int, acks: int, transactional_id: str | None = None) -> bytes:
    m: Any = __import__("kio.schema.produce.v9.request", fromlist=["x"])
    body = m.ProduceRequest(
        transactional_id=transactional_id,
        acks=acks,
        timeout=datetime.timedelta(seconds=1),
        topic_data=(m.TopicProduceData(name="t", partition_data=(m.PartitionProduceData(index=0, records=None),)),),
    )
    return wire.encode_frame(wire.request_header_for(PRODUCE, 9, correlation_id, "app"), body)


def response(correlation_id: int, body: bytes = b"\x00\x00") -> bytes:
    """A response frame as the broker sends it (the core reads only its correlation id)."""
    return (4 + len(body)).to_bytes(4, "big") + correlation_id.to_bytes(4, "big") + body


def delivered(core: ConnectionCore, actions: Actions, now: float = 2.0) -> Actions:
    """The shell wrote every Answer: what the core does next."""
    after: Actions = []
    for action in actions:
        if isinstance(action, Answer):
            after += core.delivered(action.delivered, now, 0.001)
    return after


# -- every action ---------------------------------------------------------------------------


def test_connect_only_once_a_first_kafka_prefix_is_here() -> None:
    world = World()
    core, _ = world.core()
    frame = api_versions(1)
    assert core.client_bytes(frame[:3], world.rules, 1.0) == []
    assert kinds(core.client_bytes(frame[3:], world.rules, 1.0)) == [Connect]
    actions = core.upstream_ready("127.0.0.1:9092", world.rules, 1.0)
    assert kinds(actions) == [Forward] and forwarded(actions) == frame
    assert core.upstream_address == "127.0.0.1:9092"


def test_forward_then_answer_then_delivered_releases_and_marks_activity() -> None:
    world = World(pool_bytes=1 << 20)
    core, activity, actions = world.connected(api_versions(7))
    assert [p.correlation_id for p in actions[0].sent] == [7]
    assert world.pool.pool.used == len(api_versions(7)) - 4
    answer = core.broker_bytes(response(7), world.rules, 2.0)
    assert kinds(answer) == [Answer] and answered(answer) == response(7)
    assert delivered(core, answer) == []
    assert world.pool.pool.used == 0
    assert activity.calls == [("request", 1.0), ("response", 2.0)]


def test_inspect_a_response_a_hook_reads_and_carry_on_after_it() -> None:
    world = World(**{"resource.identifier.limit.enable": True})  # ApiVersions answers are capped
    core, _, actions = world.connected(api_versions(1) + metadata(2))
    assert forwarded(actions) == api_versions(1) + metadata(2)
    actions = core.broker_bytes(response(1) + response(2), world.rules, 2.0)
    assert kinds(actions) == [Inspect]
    assert actions[0].pending.correlation_id == 1 and actions[0].frame == response(1)
    rewritten = response(1, b"\x00\x01")
    actions = core.inspected(rewritten)
    assert kinds(actions) == [Answer] and answered(actions) == rewritten + response(2)
    assert [p.correlation_id for p in actions[0].delivered] == [1, 2]


def test_prepare_a_request_whose_hook_needs_io_first() -> None:
    world = World(**{"group.max.size": 2})
    join = join_group_frame(5, "g", 9, "", None, 10000, 10000)
    core, _, actions = world.connected(join)
    assert kinds(actions) == [Prepare]
    assert actions[0].request.api_key == JOIN_GROUP
    actions = core.prepared(1.5)
    assert kinds(actions) == [Forward] and forwarded(actions) == join


def test_a_deadline_for_a_body_still_to_come_and_none_once_it_is_whole() -> None:
    world = World(**{"request.body.timeout.ms": 3000})
    frame = metadata(1)
    core, _, actions = world.connected(frame[:10])
    assert kinds(actions) == [SetDeadline] and actions[0].at == 1.0 + 3.0
    assert core.deadline_passed(3.9) == []  # not yet
    actions = core.client_bytes(frame[10:], world.rules, 2.0)
    assert kinds(actions) == [Forward, SetDeadline] and actions[1].at == float("inf")
    assert forwarded(actions) == frame


def test_stop_reading_at_the_cap_of_pending_requests_and_resume_at_half() -> None:
    world = World()
    core, _, actions = world.connected(b"".join(api_versions(n) for n in range(MAX_PENDING_REQUESTS)))
    assert kinds(actions) == [Forward, StopReading] and not core.reading
    half = MAX_PENDING_REQUESTS // 2
    answer = core.broker_bytes(b"".join(response(n) for n in range(half - 1)), world.rules, 2.0)
    assert delivered(core, answer) == []  # one over half still pending
    answer = core.broker_bytes(response(half - 1), world.rules, 2.0)
    assert kinds(delivered(core, answer)) == [ResumeReading] and core.reading


def test_a_note_for_sasl_on_a_listener_not_marked_sasl() -> None:
    world = World()
    frame = request(SASL_AUTHENTICATE, 2, 3, auth_bytes=b"x")
    core, _, _ = world.connected(frame)
    actions = core.broker_bytes(response(3), world.rules, 2.0)
    assert kinds(actions) == [Note, Answer]
    assert "not marked sasl: true" in actions[0].message


def test_wait_for_pool_memory_then_forward_once_granted() -> None:
    """Pool waits and releases: a connection whose request arrives with the pool spent waits; the
    bytes another connection's answered request gives back grant it."""
    world = World(pool_bytes=MAX_REQUEST)
    big = api_versions_of_size(1, MAX_REQUEST)
    first, _, actions = world.connected(big[:100], "l-1")  # KIP-72: its body's memory, before reading it
    assert world.pool.pool.used == MAX_REQUEST
    second, _, actions = world.connected(api_versions(2), "l-2")
    assert kinds(actions) == [WaitForPool]
    ticket = actions[0].ticket
    assert world.pool.pool.waiting == 1
    actions = first.client_bytes(big[100:], world.rules, 1.5)
    assert forwarded(actions) == big
    delivered(first, first.broker_bytes(response(1), world.rules, 2.0))  # gives its bytes back
    assert world.pool.pool.waiting == 0 and world.pool.pool.used == len(api_versions(2)) - 4
    assert ticket not in world.pool._woken  # the waiting connection was woken
    actions = second.pool_granted(2.5)
    assert kinds(actions) == [Forward] and forwarded(actions) == api_versions(2)
    assert actions[0].sent[0].ticket == ticket
    delivered(second, second.broker_bytes(response(2), world.rules, 3.0))
    assert world.pool.pool.used == 0


def test_wait_for_pool_memory_before_reading_a_body_says_what_it_waits_for() -> None:
    world = World(pool_bytes=MAX_REQUEST, **{"request.body.timeout.ms": 1000})
    world.pool.reserve("another", MAX_REQUEST, 0.0, Where())
    core, _, actions = world.connected(metadata(1)[:10])
    assert kinds(actions) == [SetDeadline, WaitForPool]
    close = core.deadline_passed(2.0)
    assert closed(close).cause is CloseCause.REQUEST_BODY_TIMEOUT
    assert "waiting for pool memory" in closed(close).reason


def test_acks_zero_produce_expects_no_answer_and_releases_its_memory_at_once() -> None:
    world = World(pool_bytes=1 << 20)
    core, activity, actions = world.connected(produce(4, acks=0) + api_versions(5))
    assert forwarded(actions) == produce(4, acks=0) + api_versions(5)
    assert [p.correlation_id for p in actions[0].sent] == [5]
    assert activity.calls == [("touched", 1.0), ("request", 1.0)]
    # a broker (Tansu) that answers the acks=0 Produce anyway: dropped
    actions = core.broker_bytes(response(4) + response(5), world.rules, 2.0)
    assert answered(actions) == response(5)


# -- pipelining and framing -------------------------------------------------------------------


def test_pipelined_requests_go_on_as_one_send_and_their_answers_as_one() -> None:
    world = World()
    frames = api_versions(1) + metadata(2) + api_versions(3)
    core, _, actions = world.connected(frames)
    assert kinds(actions) == [Forward] and bytes(actions[0].data) == frames
    actions = core.broker_bytes(response(1) + response(2) + response(3), world.rules, 2.0)
    assert kinds(actions) == [Answer] and [p.correlation_id for p in actions[0].delivered] == [1, 2, 3]


def test_the_proxys_own_answer_keeps_its_place_among_pipelined_requests() -> None:
    world = World(**{"resource.identifier.limit.enable": True})
    refused = produce(2, acks=-1, transactional_id="t" * 250)  # over the transactional id's limit
    core, _, actions = world.connected(metadata(1) + refused + metadata(3))
    assert kinds(actions) == [Forward, Forward]  # the refused request never reaches the broker
    assert forwarded(actions) == metadata(1) + metadata(3)
    actions = core.broker_bytes(response(1) + response(3), world.rules, 2.0)
    assert [p.correlation_id for p in actions[0].delivered] == [1, 2, 3]
    data = answered(actions)
    assert data.startswith(response(1)) and data.endswith(response(3))
    assert wire.response_correlation_id(data, len(response(1))) == 2


def test_the_observation_window_counts_requests_and_responses_by_client_id_and_api_own_answers_too() -> None:
    world = World(**{"resource.identifier.limit.enable": True})
    window = ObservationWindow(0.0)
    refused = produce(2, acks=-1, transactional_id="t" * 250)  # answered by the proxy, behind the Metadata
    core, _, _ = world.connected(metadata(1) + refused, window=window)
    broker = response(1, b"\x00" * 10)
    actions = core.broker_bytes(broker, world.rules, 2.0)
    own_answer = answered(actions)[len(broker) :]
    assert delivered(core, actions) == []
    rows = {row["api"]: row for row in window.roll(3.0) if row["section"] == "client_api"}
    assert {
        api: (r["listener"], r["client_id"], r["requests"], r["bytes_in"], r["bytes_out"]) for api, r in rows.items()
    } == {
        "metadata": ("l", "app", 1, len(metadata(1)), len(broker)),
        "produce": ("l", "app", 1, len(refused), len(own_answer)),
    }


def test_an_answer_with_nothing_ahead_of_it_goes_out_at_once() -> None:
    world = World(**{"resource.identifier.limit.enable": True})
    _, _, actions = world.connected(produce(2, acks=-1, transactional_id="t" * 250))
    assert kinds(actions) == [Answer] and wire.response_correlation_id(answered(actions), 0) == 2


@pytest.mark.parametrize("direction", ["requests", "responses"])
def test_frames_split_at_every_byte_boundary_come_out_the_same(direction: str) -> None:
    frames = [api_versions(1), metadata(2), api_versions(3)]
    responses = [response(1, b"\x00\x01\x02"), response(2), response(3, b"")]
    stream = b"".join(frames if direction == "requests" else responses)
    for cut in range(1, len(stream)):
        world = World(pool_bytes=1 << 20)
        if direction == "requests":
            core, _ = world.core()
            seen = b""
            for piece in (stream[:cut], stream[cut:]):
                actions = core.client_bytes(piece, world.rules, 1.0)
                if actions and actions[0].__class__ is Connect:
                    actions = core.upstream_ready("b:1", world.rules, 1.0)
                assert not any(isinstance(a, Close) for a in actions), (cut, actions)
                seen += forwarded(actions)
            assert seen == stream, cut
            assert [p.correlation_id for p in core.session.pending] == [1, 2, 3]
        else:
            core, _, _ = world.connected(b"".join(frames))
            seen = b""
            for piece in (stream[:cut], stream[cut:]):
                actions = core.broker_bytes(piece, world.rules, 2.0)
                seen += answered(actions)
                delivered(core, actions)
            assert seen == stream, cut
            assert core.session.in_flight == 0 and world.pool.pool.used == 0


# -- a reload between a request and its response ----------------------------------------------


def test_a_response_is_judged_by_the_generation_current_when_it_arrives() -> None:
    world = World(**{"max.response.size": 1 << 20})
    core, _, _ = world.connected(api_versions(1) + api_versions(2))
    answer = core.broker_bytes(response(1, b"\x00" * 100), world.rules, 2.0)
    assert kinds(answer) == [Answer]
    world.reload(**{"max.response.size": 50})  # reloaded while request 2 is in flight
    actions = core.broker_bytes(response(2, b"\x00" * 100), world.rules, 3.0)
    assert closed(actions).cause is CloseCause.RESPONSE_TOO_LARGE
    world.reload(**{"max.response.size": 50, "response.size.mode": "observe"})
    core, _, _ = world.connected(api_versions(3), "l-2")
    actions = core.broker_bytes(response(3, b"\x00" * 100), world.rules, 4.0)
    assert kinds(actions) == [Answer]  # observed: recorded, let through


def test_a_request_keeps_the_hooks_of_its_generation_across_a_reload() -> None:
    world = World(**{"resource.identifier.limit.enable": True})  # reads ApiVersions responses
    core, _, _ = world.connected(api_versions(1))
    old = world.rules
    world.reload()  # no hook any more
    actions = core.broker_bytes(response(1), world.rules, 2.0)
    assert kinds(actions) == [Inspect]  # its response is still shown to the hooks it was sent under
    assert actions[0].pending.on_response[1] == old.plan(API_VERSIONS, 3).response_hooks
    assert kinds(core.inspected(None)) == [Answer]
    actions = core.client_bytes(api_versions(2), world.rules, 3.0)
    assert actions[0].sent[0].on_response is None  # a request after the reload: the new plan


# -- every close cause --------------------------------------------------------------------------


def _refused_prefix(first: bytes, cause: CloseCause) -> Actions:
    world = World()
    core, _ = world.core()
    actions = core.client_bytes(first, world.rules, 1.0)
    assert closed(actions).cause is cause and core.closing == closed(actions)
    return actions


def _after_connect(frames: bytes, world: World | None = None) -> Actions:
    world = world or World()
    _, _, actions = world.connected(frames)
    return actions


def _response(frames: bytes, world: World | None = None) -> Actions:
    world = world or World()
    core, _, _ = world.connected(api_versions(1))
    return core.broker_bytes(frames, world.rules, 2.0)


CORE_CAUSES: dict[CloseCause, Any] = {
    CloseCause.CLIENT_CLOSED: lambda: World().connected(api_versions(1))[0].client_bytes(b"", World().rules, 2.0),
    CloseCause.DRAINED: lambda: World().connected(api_versions(1))[0].stop() or [],  # checked apart below
    CloseCause.UPSTREAM_UNAVAILABLE: lambda: World().core()[0].upstream_unavailable("down"),
    CloseCause.NO_CLIENT_IDENTITY: lambda: World().core()[0].upstream_unavailable("no id", no_identity=True),
    CloseCause.UPSTREAM_CLOSED: lambda: _response(b""),
    CloseCause.CLIENT_TLS_ON_PLAINTEXT: lambda: _refused_prefix(
        b"\x16\x03\x01\x02\x00", CloseCause.CLIENT_TLS_ON_PLAINTEXT
    ),
    CloseCause.CLIENT_HTTP_ON_KAFKA_PORT: lambda: _refused_prefix(
        b"GET / HTTP/1.1\r\n", CloseCause.CLIENT_HTTP_ON_KAFKA_PORT
    ),
    CloseCause.REQUEST_TOO_LARGE: lambda: _refused_prefix(
        (MAX_REQUEST + 1).to_bytes(4, "big"), CloseCause.REQUEST_TOO_LARGE
    ),
    CloseCause.REQUEST_INVALID_SIZE: lambda: _refused_prefix(b"\xff\xff\xff\xfe", CloseCause.REQUEST_INVALID_SIZE),
    CloseCause.TRUNCATED_FRAME: lambda: _truncated(),
    CloseCause.UNREADABLE_VERSION: lambda: _after_connect(_join_of_version(99), World(**{"group.max.size": 2})),
    CloseCause.REQUEST_BODY_TIMEOUT: lambda: _body_timeout(),
    CloseCause.UPSTREAM_TLS_ON_PLAINTEXT: lambda: _response(b"\x15\x03\x03\x00\x02\x02\x28"),
    CloseCause.RESPONSE_TOO_LARGE: lambda: _response(response(1, b"\x00" * 100), World(**{"max.response.size": 50})),
    CloseCause.RESPONSE_INVALID_SIZE: lambda: _response(b"\x00\x00\x00\x00"),
    CloseCause.IDENTIFIER_LIMITS: lambda: _after_connect(
        produce(1, acks=0, transactional_id="t" * 250), World(**{"resource.identifier.limit.enable": True})
    ),
    CloseCause.MALFORMED_FRAME: lambda: _after_connect(b"\x00\x00\x00\x02\x00\x12"),
    CloseCause.UNEXPECTED_RESPONSE: lambda: _response(response(99)),
}
# Causes only the shell or the connection gate know (I/O failures, TLS, quotas).
SHELL_CAUSES = {
    CloseCause.BROKER_CLOSED,
    CloseCause.EVICTED,
    CloseCause.CLOSED_BY_LIMIT,
    CloseCause.TLS_HANDSHAKE,
    CloseCause.CLIENT_PLAINTEXT_ON_TLS,
    CloseCause.GROUP_SIZE,  # no group decision closes a connection today; the cause is ready for one
    CloseCause.BROKEN,
    CloseCause.INTERNAL_ERROR,
}


def _join_of_version(version: int) -> bytes:
    """A JoinGroup whose header names a version the codec does not know."""
    join = join_group_frame(1, "g", 9, "", None, 10000, 10000)
    return join[:6] + version.to_bytes(2, "big") + join[8:]


def _truncated() -> Actions:
    world = World()
    core, _, _ = world.connected(metadata(1)[:9])
    return core.client_bytes(b"", world.rules, 2.0)


def _body_timeout() -> Actions:
    world = World(**{"request.body.timeout.ms": 500})
    core, _, _ = world.connected(metadata(1)[:9])
    return core.deadline_passed(1.5)


def test_every_cause_is_tested_here_or_belongs_to_the_shell() -> None:
    assert set(CORE_CAUSES) | SHELL_CAUSES == set(CloseCause)
    assert not set(CORE_CAUSES) & SHELL_CAUSES


@pytest.mark.parametrize("cause", [c for c in CORE_CAUSES if c is not CloseCause.DRAINED], ids=lambda c: c.value)
def test_every_close_cause_the_core_decides(cause: CloseCause) -> None:
    actions = CORE_CAUSES[cause]()
    assert closed(actions).cause is cause
    assert closed(actions).label == cause.value


def test_requests_taken_with_a_refused_prefix_never_reach_the_broker() -> None:
    """A receive that ends in a prefix the proxy refuses closes the connection before anything
    taken from it goes on (a join followed by garbage holds no place in the group)."""
    world = World()
    core, _, actions = world.connected(api_versions(1))
    actions = core.client_bytes(metadata(2) + b"\xff\xff\xff\xfe", world.rules, 2.0)
    assert kinds(actions) == [Close] and closed(actions).cause is CloseCause.REQUEST_INVALID_SIZE
    assert [p.correlation_id for p in core.unanswered()] == []  # none read a response
    assert [p.correlation_id for p in core.session.pending] == [1, 2]


def test_http_is_answered_in_http_before_the_close() -> None:
    actions = _refused_prefix(b"GET / HTTP/1.1\r\n", CloseCause.CLIENT_HTTP_ON_KAFKA_PORT)
    assert actions[-1].last_words == HTTP_400
    assert actions[-1].decision is not None and actions[-1].decision.policy is Policy.PROTOCOL


def test_drained_at_once_when_idle_or_once_in_flight_is_answered() -> None:
    world = World()
    core, _, _ = world.connected(api_versions(1))
    assert core.stop() == []  # request 1 in flight
    actions = core.client_bytes(api_versions(2), world.rules, 2.0)
    assert kinds(actions) == [StopReading] and forwarded(actions) == b""  # taken no more
    actions = core.broker_bytes(response(1), world.rules, 3.0)
    assert kinds(actions) == [Answer, Close] and closed(actions).cause is CloseCause.DRAINED
    idle, _, _ = world.connected(api_versions(3), "l-2")
    delivered(idle, idle.broker_bytes(response(3), world.rules, 2.0))
    assert closed(idle.stop()).cause is CloseCause.DRAINED


def test_a_client_id_over_its_limit_is_answered_then_closed() -> None:
    world = World(**{"resource.identifier.limit.enable": True})
    core, _, actions = world.connected(api_versions(1, client_id="c" * 300))
    assert kinds(actions) == [Answer]
    after = core.delivered(actions[0].delivered, 2.0, 0.0)
    assert closed(after).cause is CloseCause.IDENTIFIER_LIMITS
    assert closed(after).reason.endswith("closed after the answer")


def test_causes_from_outside_keep_the_first_and_label_quota_closes_with_their_property() -> None:
    core, _ = World().core()
    evicted = Closing(CloseCause.EVICTED, "evicted", "max.connections")
    core.closed_by(evicted)
    core.closed_by(Closing(CloseCause.BROKEN, "reset"))
    assert core.closing is evicted and evicted.label == "evicted: max.connections" and not evicted.failure
    assert Closing(CloseCause.CLOSED_BY_LIMIT, "", "connections.max.idle.ms").label == "closed: connections.max.idle.ms"
    assert Closing(CloseCause.BROKEN).failure and not Closing(CloseCause.CLIENT_CLOSED).failure
    assert CloseCause.of_policy(Policy.IDENTIFIER_LIMITS) is CloseCause.IDENTIFIER_LIMITS
