"""The group size policy's reading of the protocol (KIP-389, KIP-848): which group
requests and responses it decodes, and what the policy is told about each. The
requests and responses of JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
OffsetCommit and ConsumerGroupHeartbeat are small and infrequent, so decoding
them costs the Produce/Fetch path nothing.

The policy object lives as long as the proxy (it holds the groups it counts); a
config reload reconfigures it in place.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterator
from typing import Any

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
from policies.group_size import GroupKind, GroupSizePolicy
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


def _ms(value: Any) -> int | None:
    return int(value.total_seconds() * 1000) if isinstance(value, datetime.timedelta) else None


class GroupSizes(ApiHook):
    request_api_keys = GROUP_APIS
    decoded_api_keys = GROUP_APIS
    prepare_api_keys = frozenset({JOIN_GROUP, CONSUMER_GROUP_HEARTBEAT})

    def __init__(self, policy: GroupSizePolicy, window: ObservationWindow | None = None) -> None:
        self.policy = policy
        self._window = window

    def reads_response(self, api_key: int, api_version: int) -> bool:
        return api_key in GROUP_APIS

    async def prepare(self, request: Request) -> None:
        """Before a join near the cap, recount the group at its coordinator (I/O: only
        JoinGroup and a KIP-848 join, epoch 0)."""
        body = request.body
        if request.api_key == JOIN_GROUP:
            await self._reconcile(request, body.group_id, GroupKind.CLASSIC)
        elif body.member_epoch == 0:
            await self._reconcile(request, body.group_id, GroupKind.CONSUMER)

    def on_request(self, request: Request) -> Decision | None:
        api, body, now = request.api_key, request.body, request.now
        policy = self.policy
        if api == JOIN_GROUP:
            decision, request.ticket = policy.on_join_request(
                body.group_id,
                body.member_id,
                getattr(body, "group_instance_id", None),
                now,
                session_timeout_ms=_ms(body.session_timeout),
                rebalance_timeout_ms=_ms(getattr(body, "rebalance_timeout", None)),
                require_known_member_id=request.api_version >= 4,
                protocols=hash(tuple((p.name, p.metadata) for p in body.protocols)),
            )
            return decision
        if api == CONSUMER_GROUP_HEARTBEAT:
            decision, request.ticket = policy.on_consumer_heartbeat_request(
                body.group_id, body.member_id, body.member_epoch, body.instance_id, now
            )
            return decision
        if api == SYNC_GROUP:
            policy.on_sync_request(
                body.group_id, body.member_id, now, group_instance_id=getattr(body, "group_instance_id", None)
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
        self.policy.on_join_unanswered(body.group_id, body.member_id, instance_id, ticket)

    async def on_response(self, request: Request, body: Any) -> Any:
        api_key, req, now, policy = request.api_key, request.body, request.now, self.policy
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
                session_timeout_ms=_ms(req.session_timeout),
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
            view = policy.view(req.group_id)
            if view is not None:
                self._window.on_group_size(req.group_id, view.kind.value, view.members)
        return body

    async def _reconcile(self, request: Request, group_id: str, kind: GroupKind) -> None:
        """Before a join near the cap, recount the group at its coordinator."""
        sent_at = request.now
        if not self.policy.needs_reconcile(group_id, sent_at):
            return
        self.policy.reconcile_started(group_id, sent_at)
        described = await describe_group(request.connect_coordinator, request.api_key, group_id)
        if described is None:
            return
        # Only Kafka's own state names are trusted (Tansu reports e.g. "Assigning" for classic groups).
        state = described.state if described.state in _KNOWN_STATES[kind] else None
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
