"""The owner's group service (issue 29): the one ``GroupSizePolicy`` of the whole proxy, so
``group.max.size``, ``group.consumer.max.size`` and ``group.join.rate.per.minute`` count each
group once, whichever workers its members' connections landed on.

A join (JoinGroup, ConsumerGroupHeartbeat with epoch 0) is an ask: the answer is the policy's
decision, or first a ``Describe`` when the group is due a recount at its coordinator (the worker
holds the broker connection; it tells the owner what the coordinator said and asks again). Every
other fact the policy reads is a tell, applied in the order it arrives. The owner stamps each
with its own clock when it arrives (a message is microseconds old), so sessions time out on one
clock. A worker names its joins by its own ids; the owner keeps, per worker, the tickets of the
joins it admitted and whose answer has not come, and lets them go when that worker dies, as when
a join's connection ends before its answer.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import trio
from prometheus_client.registry import Collector

from policies.group_size import GroupKind, GroupSizePolicy
from policies.mode import Mode
from proxy.config.model import Config
from proxy.hooks.group_hook import GroupSizeCollector
from proxy.workers.link import Handler, Link

EXPIRY_INTERVAL_S = 1.0  # as ProxyServer's expiry of groups in one process


@dataclass(frozen=True, slots=True)
class ClassicJoin:
    """A JoinGroup's fields the policy decides on."""

    group_id: str
    member_id: str
    group_instance_id: str | None
    session_timeout_ms: int | None
    rebalance_timeout_ms: int | None
    require_known_member_id: bool
    protocols: bytes


@dataclass(frozen=True, slots=True)
class ConsumerJoin:
    """A ConsumerGroupHeartbeat with member epoch 0 (KIP-848)."""

    group_id: str
    member_id: str
    instance_id: str | None


@dataclass(frozen=True, slots=True)
class Describe:
    """The answer to a join whose group is due a recount at its coordinator: describe it, tell
    ``group.observed`` with ``sent_at``, then ask for the join again."""

    sent_at: float  # the owner's clock when it asked for the recount


@dataclass(frozen=True, slots=True)
class _Join:
    group_id: str
    member_id: str
    instance_id: str | None
    ticket: int


class GroupOwner:
    """A shared service of the owner (see WORKERS_CONTRACT / docs/workers.md)."""

    def __init__(self, config: Config) -> None:
        policies = config.policies
        self.policy = GroupSizePolicy(policies.group_size_config(), Mode(policies.mode_of(policies.group_size_mode)))
        self._joins: dict[int, dict[int, _Join]] = {}  # worker -> its join id -> a join in flight

    # -- the shared-service interface --------------------------------------------------------

    def handlers(self, worker: int) -> dict[str, Handler]:
        joins = self._joins.setdefault(worker, {})  # a restarted worker starts with none
        return {
            "group.join": functools.partial(self._join, joins),
            "group.observed": self._observed,
            "group.sync": self._sync,
            "group.heartbeat": self._heartbeat,
            "group.join_response": functools.partial(self._join_response, joins),
            "group.member_response": self._member_response,
            "group.leave": self._leave,
            "group.consumer_response": functools.partial(self._consumer_response, joins),
            "group.unanswered": functools.partial(self._unanswered, joins),
            "group.view": self.policy.view,
        }

    def attach(self, worker: int, link: Link) -> None:
        """Nothing to keep: the owner never asks a worker about groups (workers ask it)."""

    def worker_gone(self, worker: int) -> dict[str, int]:
        """Its joins still unanswered hold no slot (as when their connections end); members that
        did join stay counted until their sessions end, as with one process."""
        joins = self._joins.pop(worker, {})
        for join in joins.values():
            self.policy.on_join_unanswered(join.group_id, join.member_id, join.instance_id, join.ticket)
        return {"group_joins": len(joins)}

    def reconfigure(self, config: Config) -> None:
        policies = config.policies
        self.policy.reconfigure(policies.group_size_config(), Mode(policies.mode_of(policies.group_size_mode)))

    def collectors(self) -> list[Collector]:
        return [GroupSizeCollector(self.policy)]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Session expiry and idle-group eviction on the owner's clock, as ProxyServer does in one process."""
        task_status.started()
        while True:
            await trio.sleep(EXPIRY_INTERVAL_S)
            self.policy.expire(trio.current_time())

    # -- the messages -------------------------------------------------------------------------

    def _join(self, joins: dict[int, _Join], join_id: int, join: ClassicJoin | ConsumerJoin, recounted: bool) -> object:
        """A join's decision (None: admitted), or a Describe first when the group is due a recount."""
        policy, now = self.policy, trio.current_time()
        if not recounted and policy.needs_reconcile(join.group_id, now):
            policy.reconcile_started(join.group_id, now)
            return Describe(now)
        if isinstance(join, ClassicJoin):
            instance_id = join.group_instance_id
            decision, ticket = policy.on_join_request(
                join.group_id,
                join.member_id,
                instance_id,
                now,
                session_timeout_ms=join.session_timeout_ms,
                rebalance_timeout_ms=join.rebalance_timeout_ms,
                require_known_member_id=join.require_known_member_id,
                protocols=join.protocols,
            )
        else:
            instance_id = join.instance_id
            decision, ticket = policy.on_consumer_heartbeat_request(join.group_id, join.member_id, 0, instance_id, now)
        if ticket is not None:
            joins[join_id] = _Join(join.group_id, join.member_id, instance_id, ticket)
        return decision

    def _observed(
        self,
        group_id: str,
        members: list[tuple[str, str | None]],
        state: str | None,
        kind: GroupKind,
        sent_at: float,
    ) -> None:
        self.policy.observe_group_size(group_id, members, trio.current_time(), state=state, kind=kind, sent_at=sent_at)

    def _sync(self, group_id: str, member_id: str, group_instance_id: str | None) -> None:
        self.policy.on_sync_request(group_id, member_id, trio.current_time(), group_instance_id=group_instance_id)

    def _heartbeat(self, group_id: str, member_id: str, member_epoch: int, instance_id: str | None) -> None:
        self.policy.on_consumer_heartbeat_request(group_id, member_id, member_epoch, instance_id, trio.current_time())

    def _join_response(
        self,
        joins: dict[int, _Join],
        join_id: int | None,
        group_id: str,
        request_member_id: str,
        group_instance_id: str | None,
        error_code: int,
        assigned_member_id: str | None,
        generation_id: int,
        leader_id: str | None,
        members: list[tuple[str, str | None]] | None,
        session_timeout_ms: int | None,
    ) -> None:
        join = joins.pop(join_id, None) if join_id is not None else None
        self.policy.on_join_response(
            group_id,
            request_member_id,
            group_instance_id,
            error_code,
            assigned_member_id,
            generation_id,
            trio.current_time(),
            leader_id=leader_id,
            members=members,
            ticket=join.ticket if join is not None else None,
            session_timeout_ms=session_timeout_ms,
        )

    def _member_response(
        self,
        api_key: int,
        group_id: str,
        member_id: str,
        error_code: int,
        group_instance_id: str | None,
        generation_id: int | None,
    ) -> None:
        self.policy.on_member_response(
            api_key,
            group_id,
            member_id,
            error_code,
            trio.current_time(),
            group_instance_id=group_instance_id,
            generation_id=generation_id,
        )

    def _leave(self, group_id: str, members: list[tuple[str, str | None]]) -> None:
        self.policy.on_leave_group(group_id, members, trio.current_time())

    def _consumer_response(
        self,
        joins: dict[int, _Join],
        join_id: int | None,
        group_id: str,
        member_id: str,
        error_code: int,
        assigned_member_id: str | None,
        member_epoch: int,
        instance_id: str | None,
    ) -> None:
        join = joins.pop(join_id, None) if join_id is not None else None
        self.policy.on_consumer_heartbeat_response(
            group_id,
            member_id,
            error_code,
            assigned_member_id,
            member_epoch,
            trio.current_time(),
            instance_id=instance_id,
            ticket=join.ticket if join is not None else None,
        )

    def _unanswered(self, joins: dict[int, _Join], join_id: int) -> None:
        """The join's connection ended before its answer, or the join was never forwarded."""
        join = joins.pop(join_id, None)
        if join is not None:
            self.policy.on_join_unanswered(join.group_id, join.member_id, join.instance_id, join.ticket)
