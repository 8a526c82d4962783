"""The group size policy's reading of the protocol (KIP-389, KIP-848): which group
requests and responses it decodes, and what the policy is told about each. The
requests and responses of JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
OffsetCommit and ConsumerGroupHeartbeat are small and infrequent, so decoding
them costs the Produce/Fetch path nothing.

The policy object lives as long as the proxy (it holds the groups it counts); a
config reload reconfigures it in place. With ``workers: N`` the owner runs the one
policy: a worker's hook (proxy/workers/worker_groups.py) asks the owner for each
join and tells it the rest, through the same ``GroupFacts`` calls this hook makes
on the policy.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import trio
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from policies.api_keys import (
    CONSUMER_GROUP_HEARTBEAT,
    HEARTBEAT,
    JOIN_GROUP,
    LEAVE_GROUP,
    OFFSET_COMMIT,
    SYNC_GROUP,
)
from policies.decision import Decision
from policies.group_size import JOIN_EPOCH, GroupKind, GroupSizePolicy, GroupView
from proxy.evidence.observation_window import ObservationWindow
from proxy.hooks.api_hooks import ApiHook
from proxy.hooks.group_reconcile import describe_group
from proxy.hooks.request import Request

log = logging.getLogger("kafka_admission_proxy.groups")

GROUP_APIS = frozenset({OFFSET_COMMIT, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP, CONSUMER_GROUP_HEARTBEAT})
_JOINS = frozenset({JOIN_GROUP, CONSUMER_GROUP_HEARTBEAT})
_KNOWN_STATES = {
    GroupKind.CLASSIC: {"Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead"},
    GroupKind.CONSUMER: {"empty", "assigning", "reconciling", "stable", "dead"},
}


def duration_ms(value: Any) -> int | None:
    return int(value.total_seconds() * 1000) if isinstance(value, datetime.timedelta) else None


def protocols_fingerprint(protocols: Iterable[Any]) -> bytes:
    """A JoinGroup's protocols (names and metadata) as a digest the policy compares across joins:
    the same in every process (``hash`` of bytes is salted per process, and with workers a
    member may rejoin through another one)."""
    digest = hashlib.blake2b(digest_size=16)
    for protocol in protocols:
        name = protocol.name.encode()
        digest.update(len(name).to_bytes(4, "big") + name)
        digest.update(len(protocol.metadata).to_bytes(4, "big") + protocol.metadata)
    return digest.digest()


def state_to_trust(state: str, kind: GroupKind) -> str | None:
    """A described group's state, when it is one of Kafka's own names (Tansu reports e.g.
    "Assigning" for classic groups)."""
    return state if state in _KNOWN_STATES[kind] else None


class GroupFacts(Protocol):
    """What the group traffic tells the policy besides the joins it decides on: the policy
    itself in one process; with workers, the worker's end of the owner's policy."""

    def on_sync_request(
        self, group_id: str, member_id: str, now: float, *, group_instance_id: str | None = None
    ) -> None: ...

    def on_consumer_heartbeat_request(
        self, group_id: str, member_id: str, member_epoch: int, instance_id: str | None, now: float
    ) -> object: ...

    def on_join_response(
        self,
        group_id: str,
        request_member_id: str,
        group_instance_id: str | None,
        error_code: int,
        assigned_member_id: str | None,
        generation_id: int,
        now: float,
        *,
        leader_id: str | None = None,
        members: Iterable[tuple[str, str | None]] | None = None,
        ticket: int | None = None,
        session_timeout_ms: int | None = None,
    ) -> None: ...

    def on_member_response(
        self,
        api_key: int,
        group_id: str,
        member_id: str,
        error_code: int,
        now: float,
        *,
        group_instance_id: str | None = None,
        generation_id: int | None = None,
    ) -> None: ...

    def on_leave_group(self, group_id: str, members: Iterable[tuple[str, str | None]], now: float) -> object: ...

    def on_consumer_heartbeat_response(
        self,
        group_id: str,
        member_id: str,
        error_code: int,
        assigned_member_id: str | None,
        member_epoch: int,
        now: float,
        *,
        instance_id: str | None = None,
        ticket: int | None = None,
    ) -> None: ...

    def on_join_unanswered(self, group_id: str, member_id: str, group_instance_id: str | None, ticket: int) -> None: ...


class GroupHookSource(Protocol):
    """With workers, what a config generation asks for the group hook (instead of a policy)."""

    def hook(self, window: ObservationWindow | None) -> ApiHook: ...


class GroupTraffic(ApiHook, ABC):
    """The group APIs' requests and responses read into the policy's facts; how a join is
    decided (and how a tracked group's size is read) is the subclass's."""

    request_api_keys = GROUP_APIS
    decoded_api_keys = GROUP_APIS
    prepare_api_keys = frozenset({JOIN_GROUP, CONSUMER_GROUP_HEARTBEAT})

    def __init__(self, facts: GroupFacts, window: ObservationWindow | None = None) -> None:
        self.facts = facts
        self._window = window

    def reads_response(self, api_key: int, api_version: int) -> bool:
        return api_key in GROUP_APIS

    @abstractmethod
    def on_join(self, request: Request) -> Decision | None:
        """The decision on a join (JoinGroup, or ConsumerGroupHeartbeat with epoch 0); sets ``request.ticket``."""

    @abstractmethod
    async def group_view(self, group_id: str) -> GroupView | None:
        """The policy's view of a group after a join's answer (the observation windows' group sizes)."""

    def on_request(self, request: Request) -> Decision | None:
        api, body = request.api_key, request.body
        if api == JOIN_GROUP:
            return self.on_join(request)
        if api == CONSUMER_GROUP_HEARTBEAT:
            if body.member_epoch == JOIN_EPOCH:
                return self.on_join(request)
            # any other heartbeat keeps the member alive and is never refused
            self.facts.on_consumer_heartbeat_request(
                body.group_id, body.member_id, body.member_epoch, body.instance_id, request.now
            )
        elif api == SYNC_GROUP:
            self.facts.on_sync_request(
                body.group_id, body.member_id, request.now, group_instance_id=getattr(body, "group_instance_id", None)
            )
        return None

    def on_unanswered(self, request: Request) -> None:
        """The connection ended before this join's answer came: its slot goes (a join that
        never reached the broker, or whose client will never hear the answer, is no member)."""
        ticket, request.ticket = request.ticket, None
        if ticket is None:
            return
        body = request.body
        if request.api_key == CONSUMER_GROUP_HEARTBEAT:
            instance_id = body.instance_id
        else:
            instance_id = getattr(body, "group_instance_id", None)
        self.facts.on_join_unanswered(body.group_id, body.member_id, instance_id, ticket)

    async def on_response(self, request: Request, body: Any) -> Any:
        api_key, req, now, policy = request.api_key, request.body, request.now, self.facts
        ticket, request.ticket = request.ticket, None  # answered: on_unanswered has nothing to undo
        instance_id = getattr(req, "group_instance_id", None)
        if api_key == JOIN_GROUP:
            members = [(m.member_id, getattr(m, "group_instance_id", None)) for m in body.members] or None
            policy.on_join_response(
                req.group_id,
                req.member_id,
                instance_id,
                int(body.error_code),
                body.member_id,
                int(body.generation_id),
                now,
                leader_id=body.leader,
                members=members,
                ticket=ticket,
                session_timeout_ms=duration_ms(req.session_timeout),
            )
        elif api_key in (SYNC_GROUP, HEARTBEAT):
            policy.on_member_response(
                api_key,
                req.group_id,
                req.member_id,
                int(body.error_code),
                now,
                group_instance_id=instance_id,
                generation_id=int(req.generation_id),
            )
        elif api_key == OFFSET_COMMIT:
            errors = [int(p.error_code) for t in body.topics for p in t.partitions if int(p.error_code)]
            generation = getattr(req, "generation_id_or_member_epoch", getattr(req, "generation_id", None))
            policy.on_member_response(
                OFFSET_COMMIT,
                req.group_id,
                getattr(req, "member_id", ""),
                errors[0] if errors else 0,
                now,
                group_instance_id=instance_id,
                generation_id=int(generation) if generation is not None else None,
            )
        elif api_key == LEAVE_GROUP:
            if request.api_version >= 3:
                left = [(m.member_id, m.group_instance_id) for m in body.members if int(m.error_code) == 0]
            else:
                left = [(req.member_id, None)] if int(body.error_code) == 0 else []
            policy.on_leave_group(req.group_id, left, now)
        elif api_key == CONSUMER_GROUP_HEARTBEAT:
            policy.on_consumer_heartbeat_response(
                req.group_id,
                req.member_id,
                int(body.error_code),
                body.member_id,
                int(body.member_epoch),
                now,
                instance_id=req.instance_id,
                ticket=ticket,
            )
        if self._window is not None and api_key in _JOINS:
            view = await self.group_view(req.group_id)
            if view is not None:
                self._window.on_group_size(req.group_id, view.kind.value, view.members)
        return body


class GroupSizes(GroupTraffic):
    """The one process's hook: it runs the policy itself."""

    def __init__(self, policy: GroupSizePolicy, window: ObservationWindow | None = None) -> None:
        super().__init__(policy, window)
        self.policy = policy

    async def prepare(self, request: Request) -> None:
        """Before a join near the cap, recount the group at its coordinator (I/O: only
        JoinGroup and a KIP-848 join, epoch 0)."""
        body = request.body
        if request.api_key == JOIN_GROUP:
            await self._reconcile(request, body.group_id, GroupKind.CLASSIC)
        elif body.member_epoch == JOIN_EPOCH:
            await self._reconcile(request, body.group_id, GroupKind.CONSUMER)

    def on_join(self, request: Request) -> Decision | None:
        body, now, policy = request.body, request.now, self.policy
        if request.api_key == JOIN_GROUP:
            decision, request.ticket = policy.on_join_request(
                body.group_id,
                body.member_id,
                getattr(body, "group_instance_id", None),
                now,
                session_timeout_ms=duration_ms(body.session_timeout),
                rebalance_timeout_ms=duration_ms(getattr(body, "rebalance_timeout", None)),
                require_known_member_id=request.api_version >= 4,
                protocols=protocols_fingerprint(body.protocols),
            )
            return decision
        decision, request.ticket = policy.on_consumer_heartbeat_request(
            body.group_id, body.member_id, body.member_epoch, body.instance_id, now
        )
        return decision

    async def group_view(self, group_id: str) -> GroupView | None:
        return self.policy.view(group_id)

    async def _reconcile(self, request: Request, group_id: str, kind: GroupKind) -> None:
        """Before a join near the cap, recount the group at its coordinator."""
        sent_at = request.now
        if not self.policy.needs_reconcile(group_id, sent_at):
            return
        self.policy.reconcile_started(group_id, sent_at)
        described = await describe_group(request.connect_coordinator, request.api_key, group_id)
        if described is None:
            return
        state = state_to_trust(described.state, kind)
        self.policy.observe_group_size(
            group_id, described.members, trio.current_time(), state=state, kind=kind, sent_at=sent_at
        )
        log.info("reconciled group size with the coordinator", extra={"members": len(described.members)})


class GroupSizeCollector(Collector):
    """Groups tracked and the distribution of their sizes (no group ids as labels)."""

    _BUCKETS = (1, 2, 5, 10, 20, 50, 100, 500, 1000)

    def __init__(self, policy: GroupSizePolicy) -> None:
        self._policy = policy

    def collect(self) -> Iterator[GaugeMetricFamily | HistogramMetricFamily]:
        yield GaugeMetricFamily(
            "kafka_admission_groups_tracked", "Consumer groups tracked", value=self._policy.groups_tracked
        )
        sizes = list(self._policy.member_counts())
        buckets = [(str(b), float(sum(1 for s in sizes if s <= b))) for b in self._BUCKETS]
        buckets.append(("+Inf", float(len(sizes))))
        yield HistogramMetricFamily(
            "kafka_admission_group_members", "Members per tracked group", buckets=buckets, sum_value=float(sum(sizes))
        )
