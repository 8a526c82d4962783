"""Group sizes counted once by the owner (issue 29), in one trio process: one GroupOwner and two
workers' config generations, each joined to it by a real Unix socket pair (``Link.pair()``),
fed real kio-encoded requests and responses the way a connection feeds its generation (prepare,
check_request, on_response, on_unanswered)."""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio
import trio.testing
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode

from policies.api_keys import CONSUMER_GROUP_HEARTBEAT, JOIN_GROUP
from policies.decision import Action, Decision, Policy
from policies.group_size import GroupKind
from policies.mode import Mode
from proxy.config.model import Config, parse_config
from proxy.evidence.audit import AuditSink
from proxy.evidence.decisions import DecisionRecorder, Where
from proxy.evidence.metrics import Metrics
from proxy.evidence.observation_window import ObservationWindow
from proxy.hooks.generation import Generation
from proxy.hooks.request import Request
from proxy.links.brokers import BrokerDirectory
from proxy.links.upstream import UpstreamLink, UpstreamUnavailable
from proxy.protocol import wire
from proxy.workers.link import Link
from proxy.workers.owner_groups import ClassicJoin, Describe, GroupOwner
from proxy.workers.worker_groups import SharedGroups

GROUP = "orders"
CLASSIC_VERSION = 5  # KIP-394: a first join with no member id is answered MEMBER_ID_REQUIRED
GROUP_MAX_SIZE_REACHED = 81


def config(**policies: object) -> Config:
    return parse_config(
        {
            "mode": "sidecar",
            "upstream": {"bootstrap_servers": ["127.0.0.1:9092"]},
            "listeners": [{"name": "l", "bind": "127.0.0.1:1"}],
            "policies": policies,
        }
    )


async def _no_coordinator() -> UpstreamLink:
    raise UpstreamUnavailable("no coordinator in these tests")  # the recount is skipped, as when a broker is down


def join_group(member_id: str = "", client_id: str = "app", instance_id: str | None = None) -> bytes:
    schema: Any = load_request_schema(JOIN_GROUP, CLASSIC_VERSION)
    protocols = (_join_protocol()(name="range", metadata=b"\x00\x01"),)
    body = schema(
        group_id=GROUP,
        session_timeout=datetime.timedelta(seconds=10),
        rebalance_timeout=datetime.timedelta(seconds=30),
        member_id=member_id,
        group_instance_id=instance_id,
        protocol_type="consumer",
        protocols=protocols,
    )
    return wire.encode_frame(wire.request_header_for(JOIN_GROUP, CLASSIC_VERSION, 7, client_id), body)


def _join_protocol() -> Any:
    module: Any = __import__(f"kio.schema.join_group.v{CLASSIC_VERSION}.request", fromlist=["x"])
    return module.JoinGroupRequestProtocol


def join_answer(
    error_code: int, member_id: str, generation: int = -1, leader: str = "", members: tuple[str, ...] = ()
) -> Any:
    schema: Any = load_response_schema(JOIN_GROUP, CLASSIC_VERSION)
    module: Any = __import__(f"kio.schema.join_group.v{CLASSIC_VERSION}.response", fromlist=["x"])
    return schema(
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode(error_code),
        generation_id=generation,
        protocol_name="range",
        leader=leader,
        member_id=member_id,
        members=tuple(module.JoinGroupResponseMember(member_id=m, metadata=b"") for m in members),
    )


def consumer_heartbeat(member_id: str = "", epoch: int = 0) -> bytes:
    schema: Any = load_request_schema(CONSUMER_GROUP_HEARTBEAT, 0)
    body = schema(
        group_id=GROUP,
        member_id=member_id,
        member_epoch=epoch,
        rebalance_timeout=datetime.timedelta(seconds=30),
        subscribed_topic_names=("t",) if epoch == 0 else None,
        server_assignor=None,
        topic_partitions=() if epoch == 0 else None,
    )
    return wire.encode_frame(wire.request_header_for(CONSUMER_GROUP_HEARTBEAT, 0, 7, "app"), body)


def consumer_answer(member_id: str, epoch: int, error_code: int = 0) -> Any:
    schema: Any = load_response_schema(CONSUMER_GROUP_HEARTBEAT, 0)
    return schema(
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode(error_code),
        member_id=member_id,
        member_epoch=epoch,
        heartbeat_interval=datetime.timedelta(seconds=5),
    )


@dataclass
class Worker:
    """One worker's generation, fed as its connections feed it."""

    index: int
    generation: Generation
    shared: SharedGroups
    metrics: Metrics

    async def send(self, frame: bytes) -> tuple[Request, Decision | None]:
        """A request read from a client: prepared, then decided (an enforced decision is answered by the proxy)."""
        api_key, api_version, correlation_id = wire.peek_head(frame, 0)
        request = Request(
            frame, 0, len(frame), api_key, api_version, correlation_id, Where("l"), _no_coordinator, trio.current_time()
        )
        plan = self.generation.plan(api_key, api_version)
        await self.generation.prepare(request, plan.prepare_hooks)
        return request, self.generation.check_request(request, plan.request_hooks)

    async def answer(self, request: Request, body: Any) -> None:
        """The broker's response to a forwarded request."""
        schema: Any = load_response_schema(request.api_key, request.api_version)
        header = schema.__header_schema__(correlation_id=request.correlation_id)
        plan = self.generation.plan(request.api_key, request.api_version)
        await self.generation.on_response(request, plan.response_hooks, wire.encode_frame(header, body))

    def connection_ended(self, request: Request) -> None:
        """The request's connection ended before its response came (Connection._unanswered)."""
        for hook in self.generation.plan(request.api_key, request.api_version).response_hooks:
            hook.on_unanswered(request)

    async def settled(self) -> None:
        """Every tell this worker sent has reached the owner (the link keeps order): an ask answered."""
        await self.shared.view(GROUP)

    def decisions(self, **labels: str) -> float:
        """The group size decisions this worker recorded."""
        labels["policy"] = "group_size"
        return sum(
            sample.value
            for family in self.metrics.registry.collect()
            for sample in family.samples
            if sample.name == "kafka_admission_decisions_total"
            and all(sample.labels[k] == v for k, v in labels.items())
        )


@asynccontextmanager
async def owner_and_workers(
    cfg: Config, n: int = 2, windows: list[ObservationWindow] | None = None
) -> AsyncIterator[tuple[GroupOwner, list[Worker]]]:
    owner = GroupOwner(cfg)
    workers = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(owner.run)
        for index in range(n):
            owner_end, worker_end = Link.pair()
            owner_end.handlers.update(owner.handlers(index))
            owner.attach(index, owner_end)
            nursery.start_soon(owner_end.run)
            nursery.start_soon(worker_end.run)
            metrics = Metrics()
            recorder = DecisionRecorder(metrics, AuditSink(cfg.audit, metrics))
            shared = SharedGroups(worker_end)
            window = windows[index] if windows is not None else None
            generation = Generation(
                1, cfg, groups=shared, directory=BrokerDirectory(metrics), recorder=recorder, window=window
            )
            workers.append(Worker(index, generation, shared, metrics))
        yield owner, workers
        nursery.cancel_scope.cancel()


def refused_at(decision: Decision | None, limit_key: str, limit: int) -> Decision:
    assert decision is not None
    assert (decision.policy, decision.action, decision.mode) == (Policy.GROUP_SIZE, Action.REFUSE, Mode.ENFORCE)
    assert (decision.error_code, decision.limit_key, decision.limit) == (GROUP_MAX_SIZE_REACHED, limit_key, limit)
    return decision


async def classic_member(worker: Worker, name: str) -> Request:
    """A KIP-394 join through ``worker``: answered MEMBER_ID_REQUIRED, then joined again with its id
    (that second join is returned, in flight)."""
    first, decision = await worker.send(join_group())
    assert decision is None
    await worker.answer(first, join_answer(79, name))  # MEMBER_ID_REQUIRED
    second, decision = await worker.send(join_group(name))
    assert decision is None, decision
    return second


async def test_a_classic_group_joined_through_two_workers_is_refused_at_exactly_group_max_size() -> None:
    cfg = config(**{"group.max.size": 2})
    async with owner_and_workers(cfg) as (owner, (w0, w1)):
        a = await classic_member(w0, "A")
        b = await classic_member(w1, "B")
        # Both joins are in flight, one in each worker: the third member is over the cap in either.
        for worker in (w0, w1):
            request, decision = await worker.send(join_group())
            refused_at(decision, "group.max.size", 2)
            answer = wire.decode_response(worker.generation.answer(request, decision), JOIN_GROUP, CLASSIC_VERSION)
            assert answer.body.error_code == GROUP_MAX_SIZE_REACHED
        # The join phase completes: A leads generation 1 of A and B, still refused past them.
        await w0.answer(a, join_answer(0, "A", 1, "A", ("A", "B")))
        await w1.answer(b, join_answer(0, "B", 1, "A"))
        await w0.settled()
        await w1.settled()
        view = owner.policy.view(GROUP)
        assert view is not None and (view.members, view.awaiting_join) == (2, 0)
        _, decision = await w1.send(join_group())
        refused_at(decision, "group.max.size", 2)
        # Each worker recorded the refusals it answered.
        assert (w0.decisions(), w1.decisions()) == (1, 2)


async def test_a_kip_848_group_joined_through_two_workers_is_refused_at_exactly_group_consumer_max_size() -> None:
    cfg = config(**{"group.consumer.max.size": 2})
    async with owner_and_workers(cfg) as (owner, (w0, w1)):
        m1, decision = await w0.send(consumer_heartbeat())
        assert decision is None
        m2, decision = await w1.send(consumer_heartbeat())
        assert decision is None
        request, decision = await w0.send(consumer_heartbeat())
        assert refused_at(decision, "group.consumer.max.size", 2).reason.startswith(
            "The consumer group has reached its maximum capacity of 2 members."
        )
        answer = wire.decode_response(w0.generation.answer(request, decision), CONSUMER_GROUP_HEARTBEAT, 0)
        assert answer.body.error_code == GROUP_MAX_SIZE_REACHED
        await w0.answer(m1, consumer_answer("m1", 1))
        await w1.answer(m2, consumer_answer("m2", 1))
        # heartbeats of the members (not joins) through the other worker are never refused
        _, decision = await w1.send(consumer_heartbeat("m1", 1))
        assert decision is None
        await w0.settled()
        await w1.settled()
        view = owner.policy.view(GROUP)
        assert view is not None and (view.members, view.awaiting_join) == (2, 0)
        _, decision = await w1.send(consumer_heartbeat())
        refused_at(decision, "group.consumer.max.size", 2)


async def test_a_dead_workers_joins_in_flight_are_released_and_its_members_stay() -> None:
    cfg = config(**{"group.consumer.max.size": 2})
    async with owner_and_workers(cfg) as (owner, (w0, w1)):
        m1, _ = await w0.send(consumer_heartbeat())
        await w0.answer(m1, consumer_answer("m1", 1))  # a member
        await w0.send(consumer_heartbeat())  # a join in flight when worker 0 dies
        _, decision = await w1.send(consumer_heartbeat())
        refused_at(decision, "group.consumer.max.size", 2)
        await w0.settled()
        assert owner.worker_gone(0) == {"group_joins": 1}
        _, decision = await w1.send(consumer_heartbeat())
        assert decision is None  # the dead worker's join no longer holds a slot
        _, decision = await w1.send(consumer_heartbeat())
        refused_at(decision, "group.consumer.max.size", 2)  # its member m1 still does
        assert owner.worker_gone(1) == {"group_joins": 1}  # m3's, unanswered
        assert owner.worker_gone(1) == {"group_joins": 0}


async def test_a_join_whose_connection_ends_unanswered_gives_its_slot_back_at_the_owner() -> None:
    cfg = config(**{"group.max.size": 1})
    async with owner_and_workers(cfg) as (_, (w0, w1)):
        a = await classic_member(w0, "A")
        _, decision = await w1.send(join_group())
        refused_at(decision, "group.max.size", 1)
        w0.connection_ended(a)
        await w0.settled()
        _, decision = await w1.send(join_group())
        assert decision is None


async def test_a_join_cancelled_while_it_asks_the_owner_gives_its_slot_back() -> None:
    cfg = config(**{"group.consumer.max.size": 1})
    async with owner_and_workers(cfg) as (_, (w0, w1)):
        with trio.CancelScope() as scope:
            scope.cancel()  # the connection ends while the ask is out: the owner admits it anyway
            await w0.send(consumer_heartbeat())
        assert scope.cancelled_caught
        await w0.settled()
        _, decision = await w1.send(consumer_heartbeat())
        assert decision is None


async def test_a_join_another_hook_refuses_first_gives_back_the_slot_the_owner_gave_it() -> None:
    cfg = config(**{"group.max.size": 1, "resource.identifier.limit.enable": True})
    async with owner_and_workers(cfg) as (_, (w0, w1)):
        _, decision = await w0.send(join_group("A", client_id="c" * 300))
        assert decision is not None and decision.policy is Policy.IDENTIFIER_LIMITS and decision.enforced
        await w0.settled()
        _, decision = await w1.send(join_group("B"))
        assert decision is None


async def test_observe_mode_is_the_owners_the_worker_records_and_forwards() -> None:
    cfg = config(**{"group.max.size": 1, "group.size.mode": "observe"})
    async with owner_and_workers(cfg) as (_, (w0, w1)):
        await classic_member(w0, "A")
        request, decision = await w1.send(join_group())
        assert decision is None  # forwarded: the owner counts it until its answer
        assert request.ticket is not None
        assert (w1.decisions(mode="observe"), w1.decisions(mode="enforce")) == (1, 0)


def test_members_that_stop_heartbeating_expire_on_the_owners_clock() -> None:
    async def test() -> None:
        cfg = config(**{"group.consumer.max.size": 1})  # sessions of 45 s (Kafka's default)
        async with owner_and_workers(cfg) as (_, (w0, w1)):
            m1, _ = await w0.send(consumer_heartbeat())
            await w0.answer(m1, consumer_answer("m1", 1))
            _, decision = await w1.send(consumer_heartbeat())
            refused_at(decision, "group.consumer.max.size", 1)
            await trio.sleep(47)  # virtual time: past m1's session, with the owner's expiry each second
            _, decision = await w1.send(consumer_heartbeat())
            assert decision is None

    trio.run(test, clock=trio.testing.MockClock(autojump_threshold=0))  # type: ignore[arg-type]


async def test_a_reload_reaches_the_owners_policy() -> None:
    async with owner_and_workers(config(**{"group.consumer.max.size": 1})) as (owner, (w0, w1)):
        await w0.send(consumer_heartbeat())
        _, decision = await w1.send(consumer_heartbeat())
        refused_at(decision, "group.consumer.max.size", 1)
        owner.reconfigure(config(**{"group.consumer.max.size": 2}))
        _, decision = await w1.send(consumer_heartbeat())
        assert decision is None


async def test_the_owner_exports_the_group_size_metrics() -> None:
    async with owner_and_workers(config(**{"group.consumer.max.size": 3})) as (owner, (w0, w1)):
        await w0.send(consumer_heartbeat())
        await w1.send(consumer_heartbeat())
        [collector] = owner.collectors()
        samples = {s.name: s.value for family in collector.collect() for s in family.samples}
        assert samples["kafka_admission_groups_tracked"] == 1
        assert samples["kafka_admission_group_members_sum"] == 2


async def test_a_recount_the_owner_asks_for_counts_members_another_proxy_admitted() -> None:
    """The owner answers a join of a group due a recount with Describe; the worker (which has the
    broker connection) tells what the coordinator listed, asks again, and the owner decides on
    that count: here a member that joined through another proxy fills a cap of 2."""
    async with owner_and_workers(config(**{"group.max.size": 2})) as (owner, (w0, w1)):
        join = ClassicJoin(GROUP, "", None, 10_000, 30_000, False, b"")
        assert await w1.shared.join(1, join, False) is None  # first contact: tracked from here, A's join in flight
        answer = await w0.shared.join(1, join, False)
        assert isinstance(answer, Describe)
        # the coordinator lists the other proxy's member; A's join, in flight, is kept
        w0.shared.observed(GROUP, [("x", None)], "Stable", GroupKind.CLASSIC, answer.sent_at)
        decision = await w0.shared.join(1, join, True)
        refused_at(decision, "group.max.size", 2)
        view = owner.policy.view(GROUP)
        assert view is not None and view.members == 2 and view.reconciled_at is not None


async def test_a_workers_observation_window_records_the_owners_group_size() -> None:
    """The audit's group sizes after a join's answer are the whole group's (the owner's count),
    not the members that joined through this worker."""
    windows = [ObservationWindow(0.0), ObservationWindow(0.0)]
    async with owner_and_workers(config(**{"group.consumer.max.size": 5}), windows=windows) as (_, (w0, w1)):
        m1, _ = await w0.send(consumer_heartbeat())
        await w0.answer(m1, consumer_answer("m1", 1))
        m2, _ = await w1.send(consumer_heartbeat())
        await w1.answer(m2, consumer_answer("m2", 1))
    [row] = [r for r in windows[1].roll(1.0) if r["section"] == "group"]
    assert (row["group_id"], row["group_kind"], row["max_members"]) == (GROUP, "consumer", 2)


async def test_the_join_rate_is_one_bucket_per_group_across_workers() -> None:
    """group.join.rate.per.minute=2: the third new member is throttled, whichever worker each came through."""
    async with owner_and_workers(config(**{"group.join.rate.per.minute": 2})) as (_, (w0, w1)):
        for worker in (w0, w1):
            _, decision = await worker.send(consumer_heartbeat())
            assert decision is None
        _, decision = await w0.send(consumer_heartbeat())
        assert decision is not None and decision.enforced
        assert (decision.action, decision.limit_key) == (Action.THROTTLE, "group.join.rate.per.minute")
