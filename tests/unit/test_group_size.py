"""Consumer group size (KIP-389 ``group.max.size``, KIP-848 ``group.consumer.max.size``), sans-I/O.

Most tests put the policy in front of ``FakeCoordinator``, a small model of Kafka's classic
group coordinator that does *not* enforce a size, wired the way the proxy shell wires it: a
join is decided on, forwarded if admitted, and the coordinator's answer is fed back. What the
client sees (the policy's refusal or the coordinator's answer) must match what Kafka's own
enforcing coordinator answers in its tests.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import TypeAlias

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from kio.schema.errors import ErrorCode

from policies.api_keys import HEARTBEAT, INT_MAX, JOIN_GROUP, OFFSET_COMMIT, SYNC_GROUP
from policies.decision import Action, Admission, Decision, Policy
from policies.group_size import (
    TRANSITIONS,
    GroupEvent,
    GroupKind,
    GroupSizeConfig,
    GroupSizePolicy,
    GroupState,
    GroupView,
    InvalidTransition,
    next_state,
)
from policies.mode import Mode

G = "group-id"
SESSION_MS = 10_000
REBALANCE_MS = 30_000

NONE = ErrorCode.none
COORDINATOR_NOT_AVAILABLE = ErrorCode.coordinator_not_available
ILLEGAL_GENERATION = ErrorCode.illegal_generation
UNKNOWN_MEMBER_ID = ErrorCode.unknown_member_id
REBALANCE_IN_PROGRESS = ErrorCode.rebalance_in_progress
MEMBER_ID_REQUIRED = ErrorCode.member_id_required
GROUP_MAX_SIZE_REACHED = ErrorCode.group_max_size_reached
FENCED_INSTANCE_ID = ErrorCode.fenced_instance_id
FENCED_MEMBER_EPOCH = ErrorCode.fenced_member_epoch
UNRELEASED_INSTANCE_ID = ErrorCode.unreleased_instance_id

EMPTY = GroupState.EMPTY
PREPARING = GroupState.PREPARING_REBALANCE
COMPLETING = GroupState.COMPLETING_REBALANCE
STABLE = GroupState.STABLE
DEAD = GroupState.DEAD

Answer: TypeAlias = Admission


def forwarded(answer: Answer) -> int:
    """A plain admit: no decision, and the ticket to settle the forwarded join's answer with."""
    decision, ticket = answer
    assert decision is None, decision
    assert ticket is not None
    return ticket


def refused(answer: Answer) -> Decision:
    """An enforced GROUP_MAX_SIZE_REACHED: the proxy answers it, the coordinator never sees it."""
    decision, ticket = answer
    assert decision is not None and ticket is None
    assert (decision.action, decision.mode, decision.error_code) == (Action.REFUSE, Mode.ENFORCE, 81)
    assert decision.enforced and decision.policy is Policy.GROUP_SIZE
    return decision


def throttled(answer: Answer) -> Decision:
    """An enforced join-rate throttle: COORDINATOR_LOAD_IN_PROGRESS (retriable) with a throttle time."""
    decision, ticket = answer
    assert decision is not None and ticket is None
    assert (decision.action, decision.mode, decision.error_code) == (Action.THROTTLE, Mode.ENFORCE, 14)
    assert decision.limit_key == "group.join.rate.per.minute" and decision.throttle_ms > 0
    return decision


# ---------------------------------------------------------------------------------------------
# A model of Kafka's classic group coordinator (GroupCoordinator.scala) without group.max.size


@dataclass
class JoinResult:
    """What the client is answered; ``error`` is None while the join is parked."""

    error: int | None = None
    member_id: str = ""
    generation: int = -1
    leader: str | None = None
    reason: str = ""
    throttle_ms: int = 0


@dataclass
class _Member:
    member_id: str
    instance_id: str | None
    protocols: int
    last_hb: float
    awaiting: bool = False
    request_member_id: str = ""
    ticket: int | None = None
    result: JoinResult | None = None


@dataclass
class _JoinResp:
    result: JoinResult | None
    request_member_id: str
    instance_id: str | None
    error: int
    member_id: str
    generation: int = -1
    leader: str | None = None
    members: list[tuple[str, str | None]] | None = None
    ticket: int | None = None


@dataclass
class _SyncResp:
    member_id: str
    instance_id: str | None
    error: int
    generation: int


class FakeCoordinator:
    """One classic group under Kafka's rules, no size limit; timers are explicit calls.

    Sessions: members awaiting join or sync are kept alive; after a join phase, members that
    have not sent SyncGroup within the rebalance timeout are removed (pending sync expiry).
    """

    def __init__(self, session_s: float = SESSION_MS / 1000, rebalance_s: float = REBALANCE_MS / 1000) -> None:
        self.session_s = session_s
        self.rebalance_s = rebalance_s
        self.completed_at = 0.0
        self.unsynced: set[str] = set()
        self.removed_at: dict[str, float] = {}
        self.now = 0.0
        self.state = EMPTY
        self.generation = 0
        self.leader: str | None = None
        self.members: dict[str, _Member] = {}
        self.static: dict[str, str] = {}
        self.pending: dict[str, float] = {}
        self.pending_sync: dict[str, str | None] = {}
        self._ids = itertools.count(1)

    def counted(self) -> int:
        """Members the next generation will have (awaiting + static), or the group's size."""
        if self.state is PREPARING:
            return sum(1 for m in self.members.values() if m.awaiting or m.instance_id is not None)
        return len(self.members)

    def member_list(self) -> list[tuple[str, str | None]]:
        return [(m.member_id, m.instance_id) for m in self.members.values()]

    # -- internals
    def _prepare(self) -> list[_JoinResp | _SyncResp]:
        out: list[_JoinResp | _SyncResp] = []
        if self.state is COMPLETING:
            out = [
                _SyncResp(mid, iid, REBALANCE_IN_PROGRESS, self.generation) for mid, iid in self.pending_sync.items()
            ]
            for member_id in self.pending_sync:
                self.members[member_id].last_hb = self.now  # sessions restart with the answer
            self.pending_sync.clear()
        if self.state is not PREPARING:
            self.state = PREPARING
        return out

    def _add(self, member_id: str, instance_id: str | None, protocols: int, now: float) -> _Member:
        m = _Member(member_id, instance_id, protocols, now)
        self.members[member_id] = m
        if instance_id is not None:
            self.static[instance_id] = member_id
        if self.leader is None:
            self.leader = member_id
        self.pending.pop(member_id, None)
        return m

    def _remove(self, m: _Member) -> list[_JoinResp | _SyncResp]:
        out: list[_JoinResp | _SyncResp] = []
        if m.awaiting:
            out.append(_JoinResp(m.result, m.request_member_id, m.instance_id, UNKNOWN_MEMBER_ID, "", ticket=m.ticket))
        del self.members[m.member_id]
        self.removed_at[m.member_id] = self.now
        self.unsynced.discard(m.member_id)
        if m.instance_id is not None and self.static.get(m.instance_id) == m.member_id:
            del self.static[m.instance_id]
        self.pending_sync.pop(m.member_id, None)
        if self.leader == m.member_id:
            self.leader = next(iter(self.members), None)
        return out

    def _after_removal(self) -> list[_JoinResp | _SyncResp]:
        if not self.members:
            if self.state is not EMPTY:
                self.generation += 1
            self.state = EMPTY
            self.pending_sync.clear()
            return []
        if self.state in (STABLE, COMPLETING):
            return self._prepare()
        return []

    @staticmethod
    def _park(m: _Member, request_member_id: str, ticket: int | None, result: JoinResult | None) -> None:
        m.awaiting, m.request_member_id, m.ticket, m.result = True, request_member_id, ticket, result

    def _validate(self, member_id: str, instance_id: str | None) -> int:
        if instance_id is not None:
            current = self.static.get(instance_id)
            if current is None:
                return UNKNOWN_MEMBER_ID
            if current != member_id:
                return FENCED_INSTANCE_ID
        return NONE if member_id in self.members else UNKNOWN_MEMBER_ID

    # -- requests
    def join(
        self,
        member_id: str,
        instance_id: str | None,
        require_known: bool,
        protocols: int,
        now: float,
        ticket: int | None,
        result: JoinResult | None,
    ) -> list[_JoinResp | _SyncResp]:
        self.now = now

        def answer(error: int, assigned: str, **kw: object) -> list[_JoinResp | _SyncResp]:
            return [_JoinResp(result, member_id, instance_id, error, assigned, ticket=ticket, **kw)]  # type: ignore[arg-type]

        if not member_id:
            new_id = f"{instance_id or 'member'}-{next(self._ids)}"
            if instance_id is not None and instance_id in self.static:
                # updateStaticMemberAndRebalance: the new incarnation takes over, the old is fenced
                old_id = self.static[instance_id]
                m = self.members.pop(old_id)
                out: list[_JoinResp | _SyncResp] = []
                if m.awaiting:
                    out.append(
                        _JoinResp(
                            m.result, m.request_member_id, instance_id, FENCED_INSTANCE_ID, old_id, ticket=m.ticket
                        )
                    )
                    m.awaiting = False
                if self.pending_sync.pop(old_id, "absent") != "absent":
                    out.append(_SyncResp(old_id, instance_id, FENCED_INSTANCE_ID, self.generation))
                m.member_id = new_id
                self.members[new_id] = m
                self.removed_at[old_id] = now
                if old_id in self.unsynced:
                    self.unsynced.discard(old_id)
                    self.unsynced.add(new_id)
                self.static[instance_id] = new_id
                if self.leader == old_id:
                    self.leader = new_id
                m.last_hb = now
                changed, m.protocols = m.protocols != protocols, protocols
                if self.state is STABLE and not changed:
                    members = self.member_list() if self.leader == new_id else None
                    return out + answer(NONE, new_id, generation=self.generation, leader=self.leader, members=members)
                self._park(m, "", ticket, result)
                return out + (self._prepare() if self.state is not PREPARING else [])
            if instance_id is None and require_known:
                self.pending[new_id] = now + self.session_s
                return answer(MEMBER_ID_REQUIRED, new_id)
            m = self._add(new_id, instance_id, protocols, now)
            self._park(m, "", ticket, result)
            return self._prepare()
        if member_id in self.pending and instance_id is None:
            m = self._add(member_id, None, protocols, now)
            self._park(m, member_id, ticket, result)
            return self._prepare()
        error = self._validate(member_id, instance_id)
        if error != NONE or self.state is EMPTY:
            return answer(error or UNKNOWN_MEMBER_ID, member_id)
        m = self.members[member_id]
        changed, m.protocols = m.protocols != protocols, protocols
        if self.state is PREPARING:
            self._park(m, member_id, ticket, result)
            return []
        no_rebalance = not changed and (self.state is COMPLETING or member_id != self.leader)
        if no_rebalance:
            members = self.member_list() if self.state is COMPLETING and member_id == self.leader else None
            return answer(NONE, member_id, generation=self.generation, leader=self.leader, members=members)
        self._park(m, member_id, ticket, result)
        return self._prepare()

    def complete_join(self, now: float) -> list[_JoinResp | _SyncResp]:
        """The join phase ends (all joined, or the rebalance timeout)."""
        if self.state is not PREPARING:
            return []
        out: list[_JoinResp | _SyncResp] = []
        for m in list(self.members.values()):
            if not m.awaiting and m.instance_id is None:
                out += self._remove(m)
        if self.members and not any(m.awaiting for m in self.members.values()):
            return out  # postponed until sessions expire
        self.generation += 1
        if not self.members:
            self.state, self.leader = EMPTY, None
            return out
        leader = self.members.get(self.leader or "")
        if leader is None or not leader.awaiting:
            self.leader = next(m.member_id for m in self.members.values() if m.awaiting)
        self.state = COMPLETING
        self.completed_at = now
        self.unsynced = set(self.members)
        for m in self.members.values():
            m.last_hb = now
            if m.awaiting:
                m.awaiting = False
                members = self.member_list() if m.member_id == self.leader else None
                out.append(
                    _JoinResp(
                        m.result,
                        m.request_member_id,
                        m.instance_id,
                        NONE,
                        m.member_id,
                        self.generation,
                        self.leader,
                        members,
                        m.ticket,
                    )
                )
        return out

    def heartbeat(self, member_id: str, instance_id: str | None, generation: int, now: float) -> int:
        error = self._validate(member_id, instance_id)
        if error != NONE:
            return error
        if generation != self.generation:
            return ILLEGAL_GENERATION
        self.members[member_id].last_hb = now
        return REBALANCE_IN_PROGRESS if self.state is PREPARING else NONE

    def sync(self, member_id: str, instance_id: str | None, generation: int, now: float) -> list[_JoinResp | _SyncResp]:
        self.now = now
        error = self._validate(member_id, instance_id)
        if error == NONE and generation != self.generation:
            error = ILLEGAL_GENERATION
        if error == NONE and self.state is PREPARING:
            error = REBALANCE_IN_PROGRESS
        if error != NONE:
            return [_SyncResp(member_id, instance_id, error, generation)]
        self.members[member_id].last_hb = now
        self.unsynced.discard(member_id)
        if self.state is STABLE:
            return [_SyncResp(member_id, instance_id, NONE, self.generation)]
        self.pending_sync[member_id] = instance_id
        if member_id != self.leader:
            return []
        self.state = STABLE
        out: list[_JoinResp | _SyncResp] = [
            _SyncResp(mid, iid, NONE, self.generation) for mid, iid in self.pending_sync.items()
        ]
        for mid in self.pending_sync:
            self.members[mid].last_hb = now
        self.pending_sync.clear()
        return out

    def leave(self, member_id: str, instance_id: str | None, now: float) -> tuple[int, list[_JoinResp | _SyncResp]]:
        self.now = now
        if member_id in self.pending:
            del self.pending[member_id]
            return NONE, []
        error = self._validate(member_id, instance_id)
        if error != NONE:
            return error, []
        out = self._remove(self.members[member_id])
        return NONE, out + self._after_removal()

    def commit(self, member_id: str, instance_id: str | None, generation: int, now: float) -> int:
        """ClassicGroup.validateOffsetCommit: REBALANCE_IN_PROGRESS only in CompletingRebalance;
        a commit in Stable or PreparingRebalance is accepted and keeps the session alive."""
        error = self._validate(member_id, instance_id)
        if error != NONE:
            return error
        if generation != self.generation:
            return ILLEGAL_GENERATION
        if self.state is COMPLETING:
            return REBALANCE_IN_PROGRESS
        self.members[member_id].last_hb = now
        return NONE

    def expire(self, now: float) -> list[_JoinResp | _SyncResp]:
        self.now = now
        for member_id, until in list(self.pending.items()):
            if now > until:
                del self.pending[member_id]
        out: list[_JoinResp | _SyncResp] = []
        if self.unsynced and self.state in (COMPLETING, STABLE) and now > self.completed_at + self.rebalance_s:
            for member_id in list(self.unsynced):
                out += self._remove(self.members[member_id])
            out += self._prepare() if self.members else []
            out += self._after_removal()
        removed = False
        for m in list(self.members.values()):
            kept_alive = m.awaiting or m.member_id in self.pending_sync
            if not kept_alive and now > m.last_hb + self.session_s:
                out += self._remove(m)
                removed = True
        if removed:
            out += self._after_removal()
        return out

    def prepare_rebalance(self) -> list[_JoinResp | _SyncResp]:
        """GroupCoordinator.prepareRebalance, as Kafka's tests call it directly."""
        return self._prepare()


class Proxy:
    """The policy in front of a FakeCoordinator, fed the way the shell feeds it."""

    def __init__(
        self,
        cap: int = INT_MAX,
        mode: Mode = Mode.ENFORCE,
        *,
        group_id: str = G,
        policy: GroupSizePolicy | None = None,
        **config: object,
    ) -> None:
        if policy is None:
            policy = GroupSizePolicy(GroupSizeConfig(group_max_size=cap, **config), mode)  # type: ignore[arg-type]
        self.policy = policy
        self.group_id = group_id
        self.coordinator = FakeCoordinator()
        self.now = 0.0
        self.refused: set[str] = set()  # member ids the policy refused (and dropped)
        self.answers: list[Answer] = []

    def join(
        self,
        member_id: str = "",
        instance_id: str | None = None,
        *,
        require_known: bool = False,
        protocols: int = 0,
        lost: bool = False,
    ) -> JoinResult:
        result = JoinResult()
        answer = self.policy.on_join_request(
            self.group_id,
            member_id,
            instance_id,
            self.now,
            session_timeout_ms=SESSION_MS,
            rebalance_timeout_ms=REBALANCE_MS,
            require_known_member_id=require_known,
            protocols=protocols,
        )
        self.answers.append(answer)
        decision, ticket = answer
        if decision is not None and decision.enforced:
            assert ticket is None and decision.error_code is not None
            result.error, result.reason, result.throttle_ms = decision.error_code, decision.reason, decision.throttle_ms
            if member_id and decision.action is Action.REFUSE:
                self.refused.add(member_id)
            return result
        responses = self.coordinator.join(
            member_id, instance_id, require_known, protocols, self.now, ticket, None if lost else result
        )
        self.deliver(responses)
        return result

    def deliver(self, responses: list[_JoinResp | _SyncResp]) -> None:
        for r in responses:
            if isinstance(r, _SyncResp):
                self.policy.on_member_response(
                    SYNC_GROUP,
                    self.group_id,
                    r.member_id,
                    r.error,
                    self.now,
                    group_instance_id=r.instance_id,
                    generation_id=r.generation,
                )
                continue
            self.policy.on_join_response(
                self.group_id,
                r.request_member_id,
                r.instance_id,
                r.error,
                r.member_id,
                r.generation,
                self.now,
                leader_id=r.leader,
                members=r.members,
                ticket=r.ticket,
                session_timeout_ms=SESSION_MS,
            )
            if r.result is not None:
                r.result.error, r.result.member_id = r.error, r.member_id
                r.result.generation, r.result.leader = r.generation, r.leader
                if r.error != NONE and r.error != MEMBER_ID_REQUIRED:
                    r.result.member_id = ""

    def complete_join(self) -> None:
        self.deliver(self.coordinator.complete_join(self.now))

    def heartbeat(self, member_id: str, instance_id: str | None, generation: int) -> int:
        error = self.coordinator.heartbeat(member_id, instance_id, generation, self.now)
        return self.answered(HEARTBEAT, member_id, instance_id, generation, error)

    def sync(self, member_id: str, instance_id: str | None, generation: int) -> None:
        self.policy.on_sync_request(self.group_id, member_id, self.now, group_instance_id=instance_id)
        self.deliver(self.coordinator.sync(member_id, instance_id, generation, self.now))

    def commit(self, member_id: str, instance_id: str | None, generation: int) -> int:
        error = self.coordinator.commit(member_id, instance_id, generation, self.now)
        return self.answered(OFFSET_COMMIT, member_id, instance_id, generation, error)

    def answered(self, api_key: int, member_id: str, instance_id: str | None, generation: int, error: int) -> int:
        """The shell feeds a Heartbeat or OffsetCommit answer to the policy."""
        self.policy.on_member_response(
            api_key, self.group_id, member_id, error, self.now, group_instance_id=instance_id, generation_id=generation
        )
        return error

    def leave(self, member_id: str, instance_id: str | None = None) -> int:
        error, responses = self.coordinator.leave(member_id, instance_id, self.now)
        if error == NONE:
            self.policy.on_leave_group(self.group_id, [(member_id, instance_id)], self.now)
        self.deliver(responses)
        return error

    def advance(self, seconds: float, step: float = 0.5) -> None:
        end = self.now + seconds
        while self.now < end:
            self.tick(min(end, self.now + step))
            self.policy.expire(self.now)

    def tick(self, now: float) -> None:
        """The coordinator's timers fire up to ``now`` (the caller expires the policy)."""
        self.now = now
        self.deliver(self.coordinator.expire(now))

    def view(self) -> GroupView:
        view = self.policy.view(self.group_id)
        assert view is not None
        return view


def errors_of(results: list[JoinResult]) -> list[int | None]:
    return [r.error for r in results]


# ---------------------------------------------------------------------------------------------
# Kafka's own tests, ported (GroupCoordinatorTest.scala, GroupMetadataManagerTest.java)

GROUP_MAX_SIZE = 4  # GroupCoordinatorTest.GroupMaxSize


def test_join_group_should_receive_error_if_group_over_max_size() -> None:
    """GroupCoordinatorTest.testJoinGroupShouldReceiveErrorIfGroupOverMaxSize (and the
    GroupMetadataManagerTest test of the same name): once the group holds ``group.max.size``
    members, one more new member is refused with GROUP_MAX_SIZE_REACHED."""
    proxy = Proxy(GROUP_MAX_SIZE)
    results = [proxy.join() for _ in range(GROUP_MAX_SIZE)]
    assert all(r.error is None for r in results)  # parked until the join phase completes
    proxy.complete_join()
    assert errors_of(results) == [NONE] * GROUP_MAX_SIZE

    extra = proxy.join()
    assert extra.error == GROUP_MAX_SIZE_REACHED
    assert proxy.coordinator.counted() == GROUP_MAX_SIZE


def test_dynamic_members_join_group_with_max_size() -> None:
    """GroupCoordinatorTest.testDynamicMembersJoinGroupWithMaxSize: max + 1 dynamic members
    join (member id not required); max are accepted, one is refused; while completing the
    rebalance the accepted ones can rejoin and the refused one is refused again."""
    proxy = Proxy(GROUP_MAX_SIZE)
    results = [proxy.join() for _ in range(GROUP_MAX_SIZE + 1)]
    assert proxy.view().state is PREPARING
    assert proxy.view().awaiting_join == GROUP_MAX_SIZE
    proxy.complete_join()
    errors = errors_of(results)
    assert errors.count(NONE) == GROUP_MAX_SIZE
    assert errors.count(GROUP_MAX_SIZE_REACHED) == 1

    rejoins = [proxy.join(r.member_id) for r in results]
    assert errors_of(rejoins) == errors
    assert proxy.view().state is COMPLETING
    assert proxy.view().members == GROUP_MAX_SIZE


def test_dynamic_members_join_group_with_max_size_and_required_known_member() -> None:
    """GroupCoordinatorTest.testDynamicMembersJoinGroupWithMaxSizeAndRequiredKnownMember: with
    KIP-394 every first join only gets a pending member id (not counted); the second round is
    capped; accepted members can rejoin while completing, the refused one cannot."""
    proxy = Proxy(GROUP_MAX_SIZE)
    first = [proxy.join(require_known=True) for _ in range(GROUP_MAX_SIZE + 1)]
    assert errors_of(first) == [MEMBER_ID_REQUIRED] * (GROUP_MAX_SIZE + 1)
    assert proxy.view().members == 0 and proxy.view().state is EMPTY
    assert proxy.view().pending == GROUP_MAX_SIZE + 1

    second = [proxy.join(r.member_id, require_known=True) for r in first]
    proxy.complete_join()
    errors = errors_of(second)
    assert errors.count(NONE) == GROUP_MAX_SIZE
    assert errors.count(GROUP_MAX_SIZE_REACHED) == 1
    assert proxy.view().pending == 0

    third = [proxy.join(r.member_id, require_known=True) for r in first]
    assert errors_of(third) == errors


def test_static_members_join_group_with_max_size() -> None:
    """GroupCoordinatorTest.testStaticMembersJoinGroupWithMaxSize: the same with static members
    (group.instance.id), which are never asked for a member id first."""
    proxy = Proxy(GROUP_MAX_SIZE)
    instance_ids = [f"instance-id-{i}" for i in range(1, GROUP_MAX_SIZE + 2)]
    results = [proxy.join("", iid) for iid in instance_ids]
    assert proxy.view().members == GROUP_MAX_SIZE
    assert proxy.view().awaiting_join == GROUP_MAX_SIZE
    proxy.complete_join()
    errors = errors_of(results)
    assert errors.count(NONE) == GROUP_MAX_SIZE
    assert errors.count(GROUP_MAX_SIZE_REACHED) == 1

    rejoins = [proxy.join(r.member_id, iid) for r, iid in zip(results, instance_ids, strict=True)]
    assert errors_of(rejoins) == errors
    assert proxy.view().members == GROUP_MAX_SIZE
    assert proxy.view().awaiting_join == 0
    assert proxy.view().state is COMPLETING


def test_dynamic_members_can_re_join_group_with_max_size_while_rebalancing() -> None:
    """GroupCoordinatorTest.testDynamicMembersCanReJoinGroupWithMaxSizeWhileRebalancing:
    members already awaiting join can join again during the rebalance; the member over the
    cap stays refused."""
    proxy = Proxy(GROUP_MAX_SIZE)
    first = [proxy.join(require_known=True) for _ in range(GROUP_MAX_SIZE + 1)]
    member_ids = [r.member_id for r in first]
    for member_id in member_ids:
        proxy.join(member_id, require_known=True)
    assert proxy.view().state is PREPARING
    assert proxy.view().awaiting_join == GROUP_MAX_SIZE

    third = [proxy.join(member_id, require_known=True) for member_id in member_ids]
    proxy.complete_join()
    errors = errors_of(third)
    assert errors.count(NONE) == GROUP_MAX_SIZE
    assert errors.count(GROUP_MAX_SIZE_REACHED) == 1
    assert proxy.view().members == GROUP_MAX_SIZE
    assert proxy.view().state is COMPLETING


def test_last_joining_members_are_kicked_out_when_re_joining_group_with_max_size() -> None:
    """GroupCoordinatorTest.testLastJoiningMembersAreKickedOutWhenReJoiningGroupWithMaxSize: a
    Stable group over the cap (max + 2 members, e.g. the cap was lowered) rebalances; the last
    two members to rejoin are refused and are gone once the join phase completes."""
    proxy = Proxy(GROUP_MAX_SIZE)
    member_ids = [f"member-{i}" for i in range(GROUP_MAX_SIZE + 2)]
    for member_id in member_ids:
        proxy.coordinator._add(member_id, None, 0, proxy.now)
    proxy.coordinator.state = STABLE
    proxy.coordinator.generation = 1
    proxy.policy.observe_group_size(G, [(m, None) for m in member_ids], proxy.now, state="Stable")

    proxy.deliver(proxy.coordinator.prepare_rebalance())
    # a member learns of the rebalance from its heartbeat
    assert proxy.heartbeat(member_ids[0], None, 1) == REBALANCE_IN_PROGRESS
    assert proxy.view().state is PREPARING

    results = [proxy.join(member_id) for member_id in member_ids]
    assert proxy.view().awaiting_join == GROUP_MAX_SIZE
    proxy.complete_join()
    errors = errors_of(results)
    assert set(errors[:GROUP_MAX_SIZE]) == {NONE}
    assert set(errors[GROUP_MAX_SIZE:]) == {GROUP_MAX_SIZE_REACHED}
    for member_id in member_ids[GROUP_MAX_SIZE:]:
        assert not proxy.policy.has_member(G, member_id)
        assert member_id not in proxy.coordinator.members
    for member_id in member_ids[:GROUP_MAX_SIZE]:
        assert proxy.policy.has_member(G, member_id)
    assert proxy.view().members == GROUP_MAX_SIZE
    assert proxy.view().state is COMPLETING


def test_new_member_is_rejected_with_maximum_members_is_reached() -> None:
    """GroupMetadataManagerTest.testNewMemberIsRejectedWithMaximumMembersIsReached: a KIP-848
    consumer group holding group.consumer.max.size = 2 members refuses a third member joining
    with epoch 0."""
    policy = GroupSizePolicy(GroupSizeConfig(group_consumer_max_size=2))
    policy.observe_group_size(G, [("member-1", None), ("member-2", None)], 0.0, kind=GroupKind.CONSUMER)
    decision = refused(policy.on_consumer_heartbeat_request(G, "member-3", 0, None, 1.0))
    assert decision.error_code == GROUP_MAX_SIZE_REACHED == 81
    # existing members keep heartbeating and may rejoin
    assert policy.on_consumer_heartbeat_request(G, "member-1", 10, None, 1.0) == (None, None)
    forwarded(policy.on_consumer_heartbeat_request(G, "member-2", 0, None, 1.0))


def test_joining_consumer_group_throws_exception_if_group_over_max_size() -> None:
    """GroupMetadataManagerTest.testJoiningConsumerGroupThrowsExceptionIfGroupOverMaxSize: a
    classic JoinGroup into a KIP-848 group is held to group.consumer.max.size."""
    policy = GroupSizePolicy(GroupSizeConfig(group_consumer_max_size=1))
    policy.observe_group_size(G, [("member-1", None)], 0.0, kind=GroupKind.CONSUMER)
    decision = refused(policy.on_join_request(G, "", None, 1.0))
    assert decision.reason == "The consumer group has reached its maximum capacity of 1 members."
    assert (decision.limit_key, decision.limit) == ("group.consumer.max.size", 1)


# ---------------------------------------------------------------------------------------------
# Behaviour


def test_a_third_member_is_refused_with_81_when_the_max_is_2() -> None:
    proxy = Proxy(2)
    first, second = proxy.join(), proxy.join()
    third = proxy.join()
    assert third.error == GROUP_MAX_SIZE_REACHED == 81
    assert "group.max.size=2" in third.reason
    proxy.complete_join()
    assert (first.error, second.error) == (NONE, NONE)
    assert proxy.join().error == GROUP_MAX_SIZE_REACHED  # still full once completing


def test_a_leave_frees_a_slot() -> None:
    proxy = Proxy(2)
    a, b = proxy.join(), proxy.join()
    proxy.complete_join()
    proxy.sync(a.member_id if a.member_id == a.leader else b.member_id, None, 1)
    assert proxy.view().state is STABLE
    assert proxy.join().error == GROUP_MAX_SIZE_REACHED

    assert proxy.leave(a.member_id) == NONE
    assert proxy.view().members == 1
    assert proxy.view().state is PREPARING
    newcomer = proxy.join()
    assert newcomer.error is None  # admitted, parked in the rebalance


def test_a_static_member_restarting_in_a_full_stable_group_is_refused_until_its_old_session_ends() -> None:
    """As Apache Kafka 4.4.0 does (tests/apache_kafka conformance): Kafka asks
    ``group.hasMember`` of the request's empty member id, so a restart is a new member."""
    proxy = Proxy(2)
    a = proxy.join("", "instance-a")
    b = proxy.join("", "instance-b")
    proxy.complete_join()
    proxy.sync(a.leader or "", "instance-a" if a.leader == a.member_id else "instance-b", 1)
    assert proxy.view().state is STABLE and proxy.view().members == 2

    # instance-a restarts without its member id: refused while its old incarnation holds the slot
    assert proxy.join("", "instance-a").error == GROUP_MAX_SIZE_REACHED
    assert proxy.view().members == 2 and proxy.policy.has_member(G, a.member_id, "instance-a")
    # b stays alive; a's old incarnation sends nothing and its session ends
    for _ in range(SESSION_MS // 1000 + 1):
        proxy.advance(1)
        proxy.heartbeat(b.member_id, "instance-b", 1)
    assert not proxy.policy.has_member(G, a.member_id)
    restarted = proxy.join("", "instance-a")
    assert restarted.error is None or restarted.error == NONE
    assert proxy.join("", "instance-c").error == GROUP_MAX_SIZE_REACHED


def test_a_restarting_static_member_below_the_cap_takes_its_own_slot() -> None:
    proxy = Proxy(3)
    a = proxy.join("", "instance-a")
    proxy.join("", "instance-b")
    proxy.complete_join()
    proxy.sync(a.leader or "", "instance-a" if a.leader == a.member_id else "instance-b", 1)
    assert proxy.view().state is STABLE and proxy.view().members == 2

    restarted = proxy.join("", "instance-a")  # not counted twice: a takes over its own slot
    assert restarted.error == NONE
    assert restarted.member_id != a.member_id
    assert proxy.view().members == 2
    assert proxy.policy.has_member(G, restarted.member_id, "instance-a")
    proxy.join("", "instance-c")
    assert proxy.join("", "instance-d").error == GROUP_MAX_SIZE_REACHED


def test_a_static_member_that_has_not_rejoined_keeps_its_slot_during_a_rebalance() -> None:
    """Kafka keeps static members that miss a rebalance, so they hold their slot meanwhile."""
    proxy = Proxy(2)
    proxy.join("", "instance-a")
    dynamic = proxy.join()
    proxy.complete_join()
    proxy.leave(dynamic.member_id)  # starts a rebalance; instance-a has not rejoined
    assert proxy.view().state is PREPARING
    assert proxy.view().counted == 1
    proxy.join()
    assert proxy.join().error == GROUP_MAX_SIZE_REACHED
    proxy.complete_join()
    assert proxy.coordinator.counted() == 2


def test_observe_mode_admits_but_says_it_would_refuse() -> None:
    proxy = Proxy(2, Mode.OBSERVE)
    proxy.join(), proxy.join()
    third = proxy.join()
    decision, ticket = proxy.answers[-1]
    assert ticket is not None  # forwarded
    assert decision is not None and not decision.enforced and decision.mode is Mode.OBSERVE
    assert (decision.action, decision.error_code) == (Action.REFUSE, GROUP_MAX_SIZE_REACHED)
    assert (decision.limit_key, decision.limit) == ("group.max.size", 2)
    proxy.complete_join()
    assert third.error == NONE
    assert proxy.view().members == 3  # tracking follows what the coordinator does


def test_member_id_required_pending_members_are_not_counted() -> None:
    proxy = Proxy(1)
    first = [proxy.join(require_known=True) for _ in range(5)]
    assert errors_of(first) == [MEMBER_ID_REQUIRED] * 5
    view = proxy.view()
    assert (view.members, view.counted, view.pending) == (0, 0, 5)
    assert proxy.join(first[0].member_id, require_known=True).error is None
    assert proxy.join(first[1].member_id, require_known=True).error == GROUP_MAX_SIZE_REACHED


def test_pending_member_ids_expire_with_the_session_timeout() -> None:
    proxy = Proxy(3)
    proxy.join(require_known=True)
    proxy.advance(SESSION_MS / 1000 + 1)
    assert proxy.view().pending == 0


def test_kip_848_heartbeat_refusal_message_is_exact() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(group_consumer_max_size=3))
    for i in range(3):
        ticket = forwarded(policy.on_consumer_heartbeat_request(G, f"m{i}", 0, None, 0.0))
        policy.on_consumer_heartbeat_response(G, f"m{i}", NONE, f"m{i}", 1, 0.0, ticket=ticket)
    answer = policy.on_consumer_heartbeat_request(G, "", 0, None, 1.0)
    assert answer == (
        Decision(
            policy=Policy.GROUP_SIZE,
            action=Action.REFUSE,
            mode=Mode.ENFORCE,
            limit_key="group.consumer.max.size",
            reason="The consumer group has reached its maximum capacity of 3 members.",
            limit=3,
            error_code=81,
            subject={"group_id": G, "member_id": ""},
        ),
        None,
    )


def test_kip_848_joins_in_flight_hold_their_slot() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(group_consumer_max_size=1))
    first = forwarded(policy.on_consumer_heartbeat_request(G, "", 0, None, 0.0))
    refused(policy.on_consumer_heartbeat_request(G, "", 0, None, 0.0))
    policy.on_consumer_heartbeat_response(G, "", NONE, "server-id", 1, 0.0, ticket=first)
    assert policy.has_member(G, "server-id")
    assert policy.on_consumer_heartbeat_request(G, "server-id", 1, None, 1.0) == (None, None)


def test_kip_848_a_refused_or_failed_join_gives_its_slot_back() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(group_consumer_max_size=1))
    first = forwarded(policy.on_consumer_heartbeat_request(G, "a", 0, None, 0.0))
    policy.on_consumer_heartbeat_response(G, "a", COORDINATOR_NOT_AVAILABLE, None, 0, 0.0, ticket=first)
    forwarded(policy.on_consumer_heartbeat_request(G, "b", 0, None, 0.0))


def test_kip_848_leave_frees_a_slot_and_a_static_leave_keeps_it() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(group_consumer_max_size=2))
    for member_id, instance_id in (("a", None), ("s", "instance-s")):
        ticket = forwarded(policy.on_consumer_heartbeat_request(G, member_id, 0, instance_id, 0.0))
        policy.on_consumer_heartbeat_response(
            G, member_id, NONE, member_id, 1, 0.0, instance_id=instance_id, ticket=ticket
        )
    # static leave (epoch -2): Kafka keeps the member until its session times out
    policy.on_consumer_heartbeat_request(G, "s", -2, "instance-s", 1.0)
    policy.on_consumer_heartbeat_response(G, "s", NONE, "s", -2, 1.0, instance_id="instance-s")
    refused(policy.on_consumer_heartbeat_request(G, "x", 0, None, 2.0))
    # ... and its next incarnation takes its slot back even though the group is full
    forwarded(policy.on_consumer_heartbeat_request(G, "s2", 0, "instance-s", 2.0))
    # a dynamic leave (epoch -1) frees a slot
    policy.on_consumer_heartbeat_request(G, "a", -1, None, 3.0)
    policy.on_consumer_heartbeat_response(G, "a", NONE, "a", -1, 3.0)
    forwarded(policy.on_consumer_heartbeat_request(G, "x", 0, None, 3.0))


def test_kip_848_members_expire_after_the_consumer_session_timeout() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(group_consumer_max_size=1, consumer_session_timeout_seconds=45))
    ticket = forwarded(policy.on_consumer_heartbeat_request(G, "a", 0, None, 0.0))
    policy.on_consumer_heartbeat_response(G, "a", NONE, "a", 1, 0.0, ticket=ticket)
    assert policy.expire(45.0).members_expired == 0
    refused(policy.on_consumer_heartbeat_request(G, "b", 0, None, 45.0))
    assert policy.expire(45.5).members_expired == 1
    forwarded(policy.on_consumer_heartbeat_request(G, "b", 0, None, 45.5))


def test_kip_848_heartbeat_errors_other_than_unknown_member_keep_the_member() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(group_consumer_max_size=1))
    ticket = forwarded(policy.on_consumer_heartbeat_request(G, "a", 0, None, 0.0))
    policy.on_consumer_heartbeat_response(G, "a", NONE, "a", 1, 0.0, ticket=ticket)
    policy.on_consumer_heartbeat_request(G, "a", 3, None, 1.0)
    policy.on_consumer_heartbeat_response(G, "a", FENCED_MEMBER_EPOCH, None, 0, 1.0)
    assert policy.has_member(G, "a")
    refused(policy.on_consumer_heartbeat_request(G, "b", 0, None, 1.0))
    policy.on_consumer_heartbeat_response(G, "a", UNKNOWN_MEMBER_ID, None, 0, 2.0)
    assert not policy.has_member(G, "a")


def test_session_expiry_removes_silent_members_and_starts_a_rebalance() -> None:
    proxy = Proxy(2)
    a, b = proxy.join(), proxy.join()
    proxy.complete_join()
    proxy.sync(a.member_id, None, 1)
    proxy.sync(b.member_id, None, 1)
    assert proxy.view().state is STABLE
    proxy.advance(6)
    proxy.heartbeat(a.member_id, None, 1)
    proxy.advance(5)  # b has been silent for 11 s > 10 s
    assert not proxy.policy.has_member(G, b.member_id)
    assert b.member_id not in proxy.coordinator.members
    assert proxy.view().members == 1
    assert proxy.view().state is PREPARING


def test_members_awaiting_join_do_not_expire_before_the_rebalance_timeout() -> None:
    proxy = Proxy(2)
    proxy.join()
    proxy.policy.expire(proxy.now + SESSION_MS / 1000 + 1)
    assert proxy.view().awaiting_join == 1
    proxy.policy.expire(proxy.now + (SESSION_MS + REBALANCE_MS) / 1000 + 1)
    assert proxy.policy.view(G) is None or proxy.view().members == 0


def test_a_member_awaiting_its_sync_answer_is_kept_alive() -> None:
    """Kafka does not expire a member whose SyncGroup waits for the leader's assignment."""
    proxy = Proxy(3)
    a, b = proxy.join(), proxy.join()
    proxy.complete_join()
    follower = b if a.member_id == a.leader else a
    proxy.sync(follower.member_id, None, 1)  # parked until the leader syncs
    proxy.advance(SESSION_MS / 1000 + 5)
    assert proxy.policy.has_member(G, follower.member_id)
    assert follower.member_id in proxy.coordinator.members


def test_a_late_answer_to_an_older_join_does_not_settle_the_newest_one() -> None:
    """A static member restarting while its previous join is parked: Kafka fences the old join."""
    proxy = Proxy(3)
    proxy.join("", "instance-a", lost=True)  # parked; the client restarts
    proxy.join("", "instance-a")  # the old join is answered FENCED_INSTANCE_ID
    assert proxy.view().awaiting_join == 1
    proxy.complete_join()
    assert proxy.view().awaiting_join == 0 and proxy.view().members == 1


def test_a_join_that_fails_before_the_coordinator_undoes_the_rebalance_it_started() -> None:
    proxy = Proxy(3)
    a, b = proxy.join(), proxy.join()
    proxy.complete_join()
    leader = a if a.member_id == a.leader else b
    proxy.sync(leader.member_id, None, 1)
    assert proxy.view().state is STABLE
    ticket = forwarded(proxy.policy.on_join_request(G, leader.member_id, None, proxy.now))  # a leader rejoin
    assert proxy.view().state is PREPARING
    proxy.policy.on_join_response(
        G, leader.member_id, None, COORDINATOR_NOT_AVAILABLE, "", -1, proxy.now, ticket=ticket
    )
    assert proxy.view().state is STABLE and proxy.view().members == 2


def stable_pair(proxy: Proxy) -> tuple[JoinResult, JoinResult]:
    """Two members of a Stable group of generation 1: (leader, follower)."""
    a, b = proxy.join(), proxy.join()
    proxy.complete_join()
    leader, follower = (a, b) if a.member_id == a.leader else (b, a)
    proxy.sync(leader.member_id, None, 1)
    assert proxy.view().state is STABLE
    return leader, follower


def answer_at_once(proxy: Proxy, member: JoinResult, ticket: int) -> None:
    """A JoinGroup answered NONE with the generation the group had (1)."""
    members = [(m, None) for m in proxy.coordinator.members] if member.member_id == member.leader else None
    proxy.policy.on_join_response(
        G,
        member.member_id,
        None,
        NONE,
        member.member_id,
        1,
        proxy.now,
        leader_id=member.leader,
        members=members,
        ticket=ticket,
    )


def test_rejoins_answered_at_once_with_the_same_generation_ran_no_rebalance() -> None:
    """Kafka answers a join phase with a new generation. Tansu answers a Stable group's leader and
    follower, rejoining, with the generation it had: no join phase ran, and the group is still
    Stable and full. A new member is refused, not admitted by the join phase's rule (only members
    awaiting join count), which let a third kafka-python consumer into a group of two."""
    proxy = Proxy(2)
    leader, follower = stable_pair(proxy)
    first = forwarded(proxy.policy.on_join_request(G, leader.member_id, None, proxy.now))
    assert proxy.view().state is PREPARING
    second = forwarded(proxy.policy.on_join_request(G, follower.member_id, None, proxy.now))
    answer_at_once(proxy, leader, first)
    assert proxy.view().state is PREPARING  # the follower's join is still in the phase
    answer_at_once(proxy, follower, second)
    assert proxy.view().state is STABLE and proxy.view().members == 2 and proxy.view().awaiting_join == 0
    refused(proxy.policy.on_join_request(G, "", None, proxy.now, require_known_member_id=False))


def test_a_rebalance_the_coordinator_told_of_stays_when_its_joins_are_answered_at_once() -> None:
    """An answer with the old generation can have left the coordinator before it began the rebalance
    a heartbeat then answered REBALANCE_IN_PROGRESS: the group keeps rebalancing."""
    proxy = Proxy(2)
    leader, _ = stable_pair(proxy)
    ticket = forwarded(proxy.policy.on_join_request(G, leader.member_id, None, proxy.now))
    proxy.policy.on_member_response(HEARTBEAT, G, leader.member_id, REBALANCE_IN_PROGRESS, proxy.now)
    answer_at_once(proxy, leader, ticket)
    assert proxy.view().state is PREPARING


def test_a_full_group_rebalancing_with_no_member_awaiting_join_is_asked_about_once_before_a_join() -> None:
    """Tansu answered a sync REBALANCE_IN_PROGRESS, then each member's rejoin with the old generation:
    the proxy still holds the rebalance, in which only members awaiting join count (none), so any
    join would be admitted. The next join asks the coordinator first (once per rebalance), whose
    Stable group of two refuses it."""
    proxy = Proxy(2)
    leader, follower = stable_pair(proxy)
    policy, now = proxy.policy, proxy.now
    members = [(leader.member_id, None), (follower.member_id, None)]
    policy.reconcile_started(G, now)
    policy.observe_group_size(G, members, now, state="Stable", sent_at=now)
    assert not policy.needs_reconcile(G, now)  # reconciled, and within the interval
    policy.on_member_response(SYNC_GROUP, G, follower.member_id, REBALANCE_IN_PROGRESS, now)
    for member in (leader, follower):
        answer_at_once(proxy, member, forwarded(policy.on_join_request(G, member.member_id, None, now)))
    assert proxy.view().state is PREPARING and proxy.view().awaiting_join == 0
    assert policy.needs_reconcile(G, now)
    policy.reconcile_started(G, now)
    assert not policy.needs_reconcile(G, now)  # once per rebalance
    policy.observe_group_size(G, members, now, state="Stable", sent_at=now)
    refused(policy.on_join_request(G, "", None, now, require_known_member_id=False))


def test_unknown_member_id_answers_remove_the_member() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(group_max_size=5))
    policy.observe_group_size(G, [("a", None), ("b", None)], 0.0, state="Stable")
    policy.on_member_response(HEARTBEAT, G, "a", UNKNOWN_MEMBER_ID, 1.0)
    policy.on_member_response(OFFSET_COMMIT, G, "b", UNKNOWN_MEMBER_ID, 1.0, generation_id=3)
    view = policy.view(G)
    assert view is not None and view.members == 0 and view.state is EMPTY


@pytest.mark.parametrize("api_key", [HEARTBEAT, SYNC_GROUP])
@pytest.mark.parametrize(("member_id", "members"), [("a", 2), ("c", 3)])
def test_rebalance_in_progress_answers_start_a_rebalance(api_key: int, member_id: str, members: int) -> None:
    """Kafka validates the member and generation before answering REBALANCE_IN_PROGRESS: the
    answer also proves a member the policy did not track."""
    policy = GroupSizePolicy(GroupSizeConfig(group_max_size=5))
    policy.observe_group_size(G, [("a", None), ("b", None)], 0.0, state="Stable")
    policy.on_member_response(api_key, G, member_id, REBALANCE_IN_PROGRESS, 1.0)
    view = policy.view(G)
    assert view is not None and view.state is PREPARING and view.counted == 0
    assert view.members == members and policy.has_member(G, member_id)


def test_a_stale_rebalance_in_progress_from_an_older_generation_is_ignored() -> None:
    proxy = Proxy(3)
    a, _ = proxy.join(), proxy.join()
    proxy.complete_join()
    assert proxy.view().generation == 1
    proxy.policy.on_member_response(HEARTBEAT, G, a.member_id, REBALANCE_IN_PROGRESS, proxy.now, generation_id=0)
    assert proxy.view().state is COMPLETING


def test_commits_without_a_member_id_are_ignored() -> None:
    policy = GroupSizePolicy()
    policy.on_member_response(OFFSET_COMMIT, G, "", NONE, 0.0, generation_id=-1)
    assert policy.groups_tracked == 0


def test_old_clients_without_member_ids_are_tracked_by_ticket() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(group_max_size=2))
    one = forwarded(policy.on_join_request(G, "", None, 0.0, require_known_member_id=False))
    two = forwarded(policy.on_join_request(G, "", None, 0.0, require_known_member_id=False))
    refused(policy.on_join_request(G, "", None, 0.0, require_known_member_id=False))
    policy.on_join_response(G, "", None, NONE, "m2", 1, 0.1, leader_id="m2", ticket=two)
    policy.on_join_response(G, "", None, NONE, "m1", 1, 0.1, leader_id="m2", ticket=one)
    assert policy.has_member(G, "m1") and policy.has_member(G, "m2")
    view = policy.view(G)
    assert view is not None and (view.members, view.awaiting_join, view.state) == (2, 0, COMPLETING)


def test_a_join_that_never_reached_the_coordinator_gives_its_slot_back() -> None:
    proxy = Proxy(1)
    ticket = forwarded(proxy.policy.on_join_request(G, "", None, 0.0, require_known_member_id=False))
    proxy.policy.on_join_response(G, "", None, COORDINATOR_NOT_AVAILABLE, "", -1, 0.0, ticket=ticket)
    assert proxy.view().members == 0
    assert proxy.join().error is None


def test_the_leaders_member_list_reconciles_the_group() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(group_max_size=10))
    forwarded(policy.on_join_request(G, "leader", None, 0.0))  # a group first seen mid-life
    members = [("leader", None), ("b", None), ("c", "instance-c")]
    policy.on_join_response(G, "leader", None, NONE, "leader", 7, 0.0, leader_id="leader", members=members)
    view = policy.view(G)
    assert view is not None and (view.members, view.generation, view.state) == (3, 7, COMPLETING)
    assert view.reconciled_at == 0.0
    assert policy.has_member(G, "c", "instance-c")


def test_a_rejoin_by_the_leader_of_a_stable_group_starts_a_rebalance() -> None:
    proxy = Proxy(3)
    a, b = proxy.join(), proxy.join()
    proxy.complete_join()
    leader = a if a.member_id == a.leader else b
    follower = b if leader is a else a
    proxy.sync(leader.member_id, None, 1)
    assert proxy.view().state is STABLE
    proxy.join(follower.member_id)  # same metadata: answered at once, no rebalance
    assert proxy.view().state is STABLE and proxy.view().awaiting_join == 0
    proxy.join(leader.member_id)
    assert proxy.view().state is PREPARING and proxy.coordinator.state is PREPARING
    proxy.join(follower.member_id, protocols=1)
    assert proxy.view().awaiting_join == 2


def test_a_classic_refusal_names_the_group_member_and_limit() -> None:
    proxy = Proxy(2)
    proxy.join(), proxy.join()
    proxy.join("stranger")
    decision = refused(proxy.answers[-1])
    assert (decision.limit_key, decision.limit) == ("group.max.size", 2)
    assert decision.subject == {"group_id": G, "member_id": "stranger"}
    assert decision.reason == "group.max.size=2 reached: 2 members rejoining while the group rebalances"
    assert not decision.close_after and decision.throttle_ms == 0


def test_a_new_member_whose_join_fails_undoes_the_rebalance_of_a_completing_group() -> None:
    proxy = Proxy(3)
    proxy.join(), proxy.join()
    proxy.complete_join()
    assert proxy.view().state is COMPLETING
    ticket = forwarded(proxy.policy.on_join_request(G, "", None, proxy.now, require_known_member_id=False))
    assert proxy.view().state is PREPARING
    proxy.policy.on_join_response(G, "", None, COORDINATOR_NOT_AVAILABLE, "", -1, proxy.now, ticket=ticket)
    assert proxy.view().state is COMPLETING and proxy.view().members == 2


# -- SyncGroup, Heartbeat and OffsetCommit answers --------------------------------------------------


def test_a_commit_answered_rebalance_in_progress_means_completing_rebalance() -> None:
    """ClassicGroup.validateOffsetCommit: a commit is answered REBALANCE_IN_PROGRESS only in
    CompletingRebalance, and accepted while the group prepares a rebalance."""
    proxy = Proxy(3)
    a, b = proxy.join(), proxy.join()
    proxy.complete_join()
    assert proxy.commit(a.member_id, None, 1) == REBALANCE_IN_PROGRESS
    assert proxy.view().state is COMPLETING
    leader, follower = (a, b) if a.member_id == a.leader else (b, a)
    proxy.sync(leader.member_id, None, 1)
    assert proxy.view().state is STABLE
    # an answer for generation 1 arriving after the group is Stable left the coordinator earlier
    proxy.policy.on_member_response(OFFSET_COMMIT, G, a.member_id, REBALANCE_IN_PROGRESS, proxy.now, generation_id=1)
    assert proxy.view().state is STABLE
    # while the group prepares a rebalance commits are accepted and keep the member alive
    proxy.join(leader.member_id)
    assert proxy.view().state is PREPARING
    assert proxy.commit(follower.member_id, None, 1) == NONE
    assert proxy.view().state is PREPARING


def test_a_commit_answered_rebalance_in_progress_for_a_new_generation_completes_its_join_phase() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(group_max_size=3))
    policy.on_member_response(OFFSET_COMMIT, G, "m", REBALANCE_IN_PROGRESS, 0.0, generation_id=5)
    view = policy.view(G)
    assert view is not None and (view.state, view.generation, view.members) == (COMPLETING, 5, 1)
    policy.on_member_response(SYNC_GROUP, G, "m", NONE, 1.0, generation_id=5)
    view = policy.view(G)
    assert view is not None and view.state is STABLE


def test_member_responses_of_other_apis_are_a_clear_error() -> None:
    with pytest.raises(ValueError, match="SyncGroup, Heartbeat or OffsetCommit, not API key 11"):
        GroupSizePolicy().on_member_response(JOIN_GROUP, G, "m", NONE, 0.0)


# -- join rate ------------------------------------------------------------------------------------


def test_joins_beyond_the_rate_are_throttled_until_a_token_refills() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(join_rate_per_minute=2))
    forwarded(policy.on_join_request(G, "", "i1", 0.0))
    forwarded(policy.on_join_request(G, "", "i2", 0.0))
    third = throttled(policy.on_join_request(G, "", "i3", 0.0))
    assert third.throttle_ms == 30_000 and third.error_code == 14
    assert third.limit == 2 and third.reason == "group.join.rate.per.minute=2 exceeded"
    assert third.subject == {"group_id": G, "member_id": ""}
    assert not policy.has_member(G, instance_id="i3")
    throttled(policy.on_join_request(G, "", "i3", 29.0))
    forwarded(policy.on_join_request(G, "", "i3", 30.0))


def test_the_second_half_of_a_kip_394_join_does_not_count_toward_the_rate() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(join_rate_per_minute=1))
    forwarded(policy.on_join_request(G, "", None, 0.0))
    policy.on_join_response(G, "", None, MEMBER_ID_REQUIRED, "pending-1", -1, 0.0)
    forwarded(policy.on_join_request(G, "pending-1", None, 0.0))
    throttled(policy.on_join_request(G, "", None, 0.0))


def test_observe_mode_reports_would_throttle() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(join_rate_per_minute=1), Mode.OBSERVE)
    assert policy.on_join_request(G, "", "i1", 0.0) == (None, 1)
    decision, ticket = policy.on_join_request(G, "", "i2", 0.0)
    assert ticket == 2  # forwarded
    assert decision is not None and decision.action is Action.THROTTLE and decision.mode is Mode.OBSERVE
    assert not decision.enforced
    assert decision.throttle_ms == 60_000


def test_consumer_protocol_joins_are_rate_limited_too() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(join_rate_per_minute=60))
    for i in range(60):
        forwarded(policy.on_consumer_heartbeat_request(G, f"m{i}", 0, None, 0.0))
    assert throttled(policy.on_consumer_heartbeat_request(G, "late", 0, None, 0.0)).throttle_ms == 1000
    assert policy.on_consumer_heartbeat_request(G, "m0", 5, None, 0.0) == (None, None)  # heartbeats are not joins


# -- reconciliation -------------------------------------------------------------------------------


def test_groups_are_reconciled_on_first_contact_when_a_cap_is_set() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(group_max_size=10, reconcile_interval_seconds=30))
    policy.on_join_request(G, "", None, 0.0)
    assert policy.needs_reconcile(G, 0.0)
    policy.reconcile_started(G, 0.0)
    assert not policy.needs_reconcile(G, 1.0)
    policy.observe_group_size(G, [], 2.0, state="Empty")
    assert not policy.needs_reconcile(G, 100.0)  # far from the cap
    assert not GroupSizePolicy().needs_reconcile(G, 0.0)


def test_groups_near_the_cap_are_reconciled_once_per_interval() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(group_max_size=3, reconcile_interval_seconds=30))
    policy.observe_group_size(G, [("a", None), ("b", None)], 0.0, state="Stable")
    assert not policy.needs_reconcile(G, 10.0)
    assert policy.needs_reconcile(G, 30.0)
    policy.reconcile_started(G, 30.0)
    assert not policy.needs_reconcile(G, 40.0)
    assert policy.needs_reconcile(G, 60.0)


def test_a_describe_answer_replaces_the_tracked_members() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(group_max_size=3))
    policy.observe_group_size(G, [("a", None), ("b", None), ("c", None)], 0.0, state="Stable")
    refused(policy.on_join_request(G, "", None, 1.0))
    policy.observe_group_size(G, [("a", None)], 2.0, state="Stable")
    assert not policy.has_member(G, "b")
    forwarded(policy.on_join_request(G, "", None, 3.0))


@pytest.mark.parametrize("mode", [Mode.ENFORCE, Mode.OBSERVE])
@pytest.mark.parametrize("state", ["Empty", None])
def test_members_the_coordinator_lists_while_their_join_is_pending_count_when_they_join(
    mode: Mode, state: str | None
) -> None:
    """Three consumers start at once in front of Tansu, whose DescribeGroups lists members that were
    only answered MEMBER_ID_REQUIRED (Kafka lists none of those). Taken as members, they would all be
    known when they rejoin with their ids, and the third, beyond group.max.size=2, got in without a
    decision (seen once in the end-to-end report test, in observe mode). They stay pending instead,
    so their joins are counted: the third is refused (observed: recorded and forwarded)."""
    policy = GroupSizePolicy(GroupSizeConfig(group_max_size=2), mode)
    now = itertools.count(1.0, 0.01)
    for member in "abc":
        decision, ticket = policy.on_join_request(G, "", None, next(now), rebalance_timeout_ms=REBALANCE_MS)
        assert decision is None
        policy.on_join_response(G, "", None, MEMBER_ID_REQUIRED, member, -1, next(now), ticket=ticket)
    policy.observe_group_size(G, [(m, None) for m in "abc"], next(now), state=state, sent_at=0.5)
    assert policy.view(G).members == 0  # type: ignore[union-attr]
    forwarded(policy.on_join_request(G, "a", None, next(now), rebalance_timeout_ms=REBALANCE_MS))
    forwarded(policy.on_join_request(G, "b", None, next(now), rebalance_timeout_ms=REBALANCE_MS))
    decision, ticket = policy.on_join_request(G, "c", None, next(now), rebalance_timeout_ms=REBALANCE_MS)
    assert decision is not None and decision.reason.startswith("group.max.size=2 reached")
    assert decision.mode is mode and decision.enforced == (mode is Mode.ENFORCE)
    assert (ticket is None) == (mode is Mode.ENFORCE)  # observed: forwarded all the same


def test_members_that_joined_after_the_describe_was_sent_are_kept() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(group_max_size=3))
    policy.observe_group_size(G, [("a", None)], 0.0, state="Stable")
    policy.on_member_response(HEARTBEAT, G, "late", NONE, 5.0)
    policy.observe_group_size(G, [("a", None)], 6.0, state="Stable", sent_at=4.0)
    assert policy.has_member(G, "late")


def test_a_count_only_raises_the_estimate_and_a_dead_group_is_forgotten() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(group_max_size=3))
    policy.observe_group_size(G, 3, 0.0, state="Stable")
    view = policy.view(G)
    assert view is not None and view.members == 3
    refused(policy.on_join_request(G, "", None, 1.0))
    policy.on_member_response(HEARTBEAT, G, "a", NONE, 1.0)  # one of the three, now by name
    view = policy.view(G)
    assert view is not None and view.members == 3
    policy.observe_group_size(G, 0, 2.0, state="Dead")
    assert policy.view(G) is None


def test_consumer_group_describe_states_are_understood() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(group_consumer_max_size=1))
    policy.observe_group_size(G, [("a", None)], 0.0, state="Reconciling")
    view = policy.view(G)
    assert view is not None and view.kind is GroupKind.CONSUMER and view.max_size == 1
    refused(policy.on_consumer_heartbeat_request(G, "b", 0, None, 1.0))


# -- memory and metrics ---------------------------------------------------------------------------


def test_idle_empty_groups_are_dropped() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(idle_group_seconds=60))
    policy.on_join_request(G, "", None, 0.0)  # KIP-394 first round: an empty group
    assert policy.groups_tracked == 1
    assert policy.expire(60.0).groups_dropped == 0
    assert policy.expire(61.0).groups_dropped == 1
    assert policy.groups_tracked == 0


def test_the_least_recently_used_groups_are_dropped_beyond_max_groups() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(max_groups=3))
    for i in range(3):
        policy.on_join_request(f"g{i}", "", None, float(i))
    policy.on_member_response(HEARTBEAT, "g0", "m", NONE, 5.0)  # g0 is used again
    policy.on_join_request("g3", "", None, 6.0)
    assert policy.groups_tracked == 3
    assert policy.view("g1") is None
    assert policy.view("g0") is not None


def test_member_counts_feed_a_histogram_without_group_ids() -> None:
    policy = GroupSizePolicy()
    policy.observe_group_size("a", [("1", None), ("2", None)], 0.0, state="Stable")
    policy.observe_group_size("b", [("1", None)], 0.0, state="Stable")
    assert sorted(policy.member_counts()) == [1, 2]
    assert policy.groups_tracked == 2


def test_many_timers_stay_bounded() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(idle_group_seconds=1))
    for i in range(2000):
        policy.on_join_request(f"g{i % 50}", "", None, float(i))
        policy.expire(float(i))
    assert len(policy._timers) <= 4 * policy.groups_tracked + 1024


# -- reload ----------------------------------------------------------------------------------------


def test_a_lowered_cap_shrinks_a_group_at_its_next_rebalance_by_refusing_the_last_to_rejoin() -> None:
    """Kafka applies a new group.max.size to joins only: a Stable group over it keeps its members
    (they heartbeat, commit and rejoin without a rebalance) and refuses new ones; its next join
    phase counts the members awaiting join (acceptJoiningMember), so the last to rejoin are refused
    and the coordinator drops them when the phase completes."""
    proxy = Proxy(10)
    results = [proxy.join() for _ in range(4)]
    proxy.complete_join()
    leader = next(r for r in results if r.member_id == r.leader)
    followers = [r for r in results if r is not leader]
    proxy.sync(leader.member_id, None, 1)
    assert proxy.view().state is STABLE and proxy.view().members == 4

    proxy.policy.reconfigure(GroupSizeConfig(group_max_size=2), Mode.ENFORCE)
    view = proxy.view()
    assert (view.max_size, view.members, view.state) == (2, 4, STABLE)  # tracked groups are kept
    for r in results:
        assert proxy.heartbeat(r.member_id, None, 1) == NONE
        assert proxy.commit(r.member_id, None, 1) == NONE
    assert proxy.join(followers[0].member_id).error == NONE  # answered at once, no rebalance
    assert proxy.join().error == GROUP_MAX_SIZE_REACHED
    assert proxy.view().state is STABLE and proxy.coordinator.counted() == 4

    proxy.join(leader.member_id, protocols=1)  # changed metadata: the next rebalance
    assert proxy.view().state is PREPARING
    rejoins = [proxy.join(r.member_id) for r in followers]
    assert errors_of(rejoins) == [None, GROUP_MAX_SIZE_REACHED, GROUP_MAX_SIZE_REACHED]
    proxy.complete_join()
    assert rejoins[0].error == NONE
    assert sorted(proxy.coordinator.members) == sorted([leader.member_id, followers[0].member_id])
    view = proxy.view()
    assert (view.members, view.state, view.generation) == (2, COMPLETING, 2)
    for r in followers[1:]:
        assert not proxy.policy.has_member(G, r.member_id)


def test_a_lowered_consumer_cap_keeps_the_members_and_refuses_new_ones() -> None:
    """throwIfConsumerGroupIsFull looks at joining members only: members over a lowered
    group.consumer.max.size stay, and so does their right to rejoin with their member id."""
    policy = GroupSizePolicy(GroupSizeConfig(group_consumer_max_size=5))
    for member_id in ("a", "b", "c"):
        ticket = forwarded(policy.on_consumer_heartbeat_request(G, member_id, 0, None, 0.0))
        policy.on_consumer_heartbeat_response(G, member_id, NONE, member_id, 1, 0.0, ticket=ticket)
    policy.reconfigure(GroupSizeConfig(group_consumer_max_size=2), Mode.ENFORCE)
    for member_id in ("a", "b", "c"):
        assert policy.on_consumer_heartbeat_request(G, member_id, 1, None, 1.0) == (None, None)
    ticket = forwarded(policy.on_consumer_heartbeat_request(G, "c", 0, None, 1.0))
    policy.on_consumer_heartbeat_response(G, "c", NONE, "c", 2, 1.0, ticket=ticket)
    decision = refused(policy.on_consumer_heartbeat_request(G, "d", 0, None, 1.0))
    assert decision.reason == "The consumer group has reached its maximum capacity of 2 members."
    policy.on_consumer_heartbeat_response(G, "a", NONE, "a", -1, 2.0)  # a leaves: 2 left, the cap
    refused(policy.on_consumer_heartbeat_request(G, "d", 0, None, 2.0))
    policy.on_consumer_heartbeat_response(G, "b", NONE, "b", -1, 3.0)
    forwarded(policy.on_consumer_heartbeat_request(G, "d", 0, None, 3.0))


def test_a_raised_cap_admits_at_once() -> None:
    proxy = Proxy(2)
    proxy.join(), proxy.join()
    assert proxy.join().error == GROUP_MAX_SIZE_REACHED
    proxy.policy.reconfigure(GroupSizeConfig(group_max_size=3), Mode.ENFORCE)
    assert proxy.join().error is None  # admitted, parked in the rebalance
    proxy.complete_join()
    assert proxy.coordinator.counted() == proxy.view().members == 3


def test_reload_switches_the_mode_of_the_live_policy() -> None:
    proxy = Proxy(1, Mode.OBSERVE)
    proxy.join(), proxy.join()
    decision, ticket = proxy.answers[-1]
    assert decision is not None and decision.mode is Mode.OBSERVE and ticket is not None
    proxy.policy.reconfigure(GroupSizeConfig(group_max_size=1), Mode.ENFORCE)
    assert proxy.join().error == GROUP_MAX_SIZE_REACHED
    refused(proxy.answers[-1])
    proxy.policy.reconfigure(GroupSizeConfig(group_max_size=1), Mode.OBSERVE)
    proxy.join()
    decision, ticket = proxy.answers[-1]
    assert decision is not None and decision.mode is Mode.OBSERVE and not decision.enforced and ticket is not None
    proxy.complete_join()
    assert proxy.view().members == 3  # the refused join never reached the coordinator


def test_reload_switches_the_join_rate_on_with_a_full_bucket() -> None:
    policy = GroupSizePolicy()
    forwarded(policy.on_join_request(G, "", "i0", 0.0))  # the group is tracked while the rate is off
    policy.reconfigure(GroupSizeConfig(join_rate_per_minute=2), Mode.ENFORCE)
    forwarded(policy.on_join_request(G, "", "i1", 0.0))
    forwarded(policy.on_join_request(G, "", "i2", 0.0))
    assert throttled(policy.on_join_request(G, "", "i3", 0.0)).throttle_ms == 30_000


def test_reload_lowers_the_join_rate_of_a_fuller_bucket() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(join_rate_per_minute=10))
    forwarded(policy.on_join_request(G, "", "i0", 0.0))  # 9 tokens left
    policy.reconfigure(GroupSizeConfig(join_rate_per_minute=2), Mode.ENFORCE)
    forwarded(policy.on_join_request(G, "", "i1", 0.0))
    forwarded(policy.on_join_request(G, "", "i2", 0.0))
    throttled(policy.on_join_request(G, "", "i3", 0.0))
    policy.reconfigure(GroupSizeConfig(), Mode.ENFORCE)  # off
    forwarded(policy.on_join_request(G, "", "i3", 0.0))


def test_reload_applies_a_lower_max_groups_and_idle_time_to_tracked_groups() -> None:
    policy = GroupSizePolicy()
    for i in range(3):
        policy.on_join_request(f"g{i}", "", None, float(i))  # KIP-394 first rounds: empty groups
    policy.on_member_response(HEARTBEAT, "g0", "m", NONE, 5.0)  # g0 is used again
    policy.reconfigure(GroupSizeConfig(max_groups=2, idle_group_seconds=60), Mode.ENFORCE)
    assert policy.groups_tracked == 2 and policy.view("g1") is None
    assert policy.expire(63.0).groups_dropped == 1  # g2, idle since 2.0, not an hour later
    assert policy.view("g0") is not None


# -- configuration ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"group_max_size": 0}, "group.max.size must be at least 1, got 0"),
        ({"group_consumer_max_size": -5}, "group.consumer.max.size must be at least 1, got -5"),
        ({"group_max_size": INT_MAX + 1}, "group.max.size must be at least 1"),
        ({"group_max_size": True}, "group.max.size must be an integer"),
        ({"join_rate_per_minute": 0}, "group.join.rate.per.minute must be -1 \\(off\\) or at least 1"),
        ({"join_rate_per_minute": -2}, "group.join.rate.per.minute must be -1 \\(off\\) or >= 1"),
        ({"max_groups": 0}, "max_groups must be at least 1"),
        ({"idle_group_seconds": 0}, "idle_group_seconds must be a positive number"),
    ],
)
def test_invalid_settings_name_the_key_and_the_rule(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GroupSizeConfig(**kwargs)  # type: ignore[arg-type]


def test_defaults_are_kafkas() -> None:
    config = GroupSizeConfig()
    assert config.group_max_size == config.group_consumer_max_size == INT_MAX
    assert config.join_rate_per_minute == -1


def test_settings_errors_name_kafkas_keys() -> None:
    with pytest.raises(ValueError, match=re.escape("group.max.size must be an integer, got '10'")):
        GroupSizeConfig(group_max_size="10")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=re.escape("group.consumer.session.timeout.ms must be a positive")):
        GroupSizeConfig(consumer_session_timeout_seconds=0)


@given(st.integers(min_value=1, max_value=INT_MAX))
def test_any_cap_from_1_to_int_max_is_accepted(cap: int) -> None:
    assert GroupSizeConfig(group_max_size=cap, group_consumer_max_size=cap).group_max_size == cap


# ---------------------------------------------------------------------------------------------
# The state machine, table-driven (as h11's test_state.py drives ConnectionState)

# What each event does in each state, written out by hand from Kafka's coordinator (not read
# from the module): a state, "prior" (back to the state the rebalance started from), or "error".
EXPECTED_TRANSITIONS = """
event                           Empty       Preparing   Completing  Stable      Dead
JOIN_STARTS_REBALANCE           Preparing   Preparing   Preparing   Preparing   error
STARTING_JOIN_FAILED            error       prior       error       error       error
JOIN_PHASE_COMPLETED            Completing  Completing  Completing  Completing  error
JOINS_ANSWERED_AT_ONCE          error       prior       error       error       error
SYNC_COMPLETED                  Stable      Preparing   Stable      Stable      error
REBALANCE_ANSWERED              Empty       Preparing   Preparing   Preparing   error
MEMBER_ADDED                    Stable      Preparing   Completing  Stable      error
MEMBER_REMOVED                  Empty       Preparing   Preparing   Preparing   error
GROUP_EMPTIED                   Empty       Empty       Empty       Empty       error
UPGRADED_TO_CONSUMER            Empty       Stable      Stable      Stable      error
DESCRIBED_EMPTY                 Empty       Empty       Empty       Empty       error
DESCRIBED_PREPARING_REBALANCE   Preparing   Preparing   Preparing   Preparing   error
DESCRIBED_COMPLETING_REBALANCE  Completing  Completing  Completing  Completing  error
DESCRIBED_STABLE                Stable      Stable      Stable      Stable      error
"""
_CELL = {"Empty": EMPTY, "Preparing": PREPARING, "Completing": COMPLETING, "Stable": STABLE}


def _expected() -> dict[tuple[GroupState, GroupEvent], str]:
    header, *rows = EXPECTED_TRANSITIONS.split("\n")[1:-1]
    states = [GroupState.DEAD if name == "Dead" else _CELL[name] for name in header.split()[1:]]
    table = {}
    for row in rows:
        event, *cells = row.split()
        table.update({(state, GroupEvent[event]): cell for state, cell in zip(states, cells, strict=True)})
    return table


def test_the_expected_table_names_every_state_and_event() -> None:
    assert set(_expected()) == {(state, event) for state in GroupState for event in GroupEvent}


@pytest.mark.parametrize(("state", "event"), [(s, e) for s in GroupState for e in GroupEvent])
def test_transition(state: GroupState, event: GroupEvent) -> None:
    cell = _expected()[state, event]
    if cell == "error":
        with pytest.raises(InvalidTransition, match=f"state {state.value} cannot take {event.name}"):
            next_state(state, event)
    elif cell == "prior":
        for before in (EMPTY, COMPLETING, STABLE):
            assert next_state(state, event, before) is before
    else:
        assert next_state(state, event) is _CELL[cell]
        assert next_state(state, event, STABLE) is _CELL[cell]  # the prior state matters to "prior" only


def test_the_table_is_the_module_s_only_source_of_transitions() -> None:
    """next_state reads TRANSITIONS: a pair missing from it is an error, whatever the pair."""
    assert set(TRANSITIONS) == set(GroupState)
    pairs = {(state, event) for state, row in TRANSITIONS.items() for event in row}
    assert pairs == {key for key, cell in _expected().items() if cell != "error"}


# ---------------------------------------------------------------------------------------------
# Property: the policy in front of a coordinator that does not enforce a size


CAP = 3
DYNAMIC = ("c0", "c1", "c2", "c3", "c4")
STATIC = ("s0", "s1", "s2")
STEPS = (0.5, 1.0, 2.0, 4.5, 9.5, 10.0, 10.5, 15.0)  # exact in binary: no rounding races
GROUPS = ("group-a", "group-b")
GROUP = st.sampled_from(range(len(GROUPS)))
NAME = st.sampled_from(DYNAMIC + STATIC)


@dataclass
class _Client:
    name: str
    instance_id: str | None
    member_id: str = ""
    generation: int = -1
    protocols: int = 0
    results: list[JoinResult] = field(default_factory=list)


class ClassicGroupMachine(RuleBasedStateMachine):
    """Consumers of two groups (one policy) join, rejoin, heartbeat, sync, commit, leave, crash
    and time out, in front of coordinators that do not enforce a size."""

    mode = Mode.ENFORCE

    def __init__(self) -> None:
        super().__init__()
        first = Proxy(CAP, self.mode, group_id=GROUPS[0])
        self.proxies = [first] + [Proxy(group_id=g, policy=first.policy) for g in GROUPS[1:]]
        self.policy = first.policy
        self.now = 0.0
        self.clients = [
            {n: _Client(n, None) for n in DYNAMIC} | {n: _Client(n, f"instance-{n}") for n in STATIC} for _ in GROUPS
        ]

    def _sync_clients(self) -> None:
        """Clients learn their answers (parked joins answered later update them then)."""
        for clients in self.clients:
            for c in clients.values():
                while c.results and c.results[0].error is not None:
                    r = c.results.pop(0)
                    if r.error == NONE:
                        c.member_id, c.generation = r.member_id, r.generation
                    elif r.error == MEMBER_ID_REQUIRED:
                        c.member_id = r.member_id
                    elif r.error in (UNKNOWN_MEMBER_ID, GROUP_MAX_SIZE_REACHED, FENCED_INSTANCE_ID):
                        c.member_id, c.generation = "", -1

    @rule(
        group=GROUP,
        name=NAME,
        kip_394=st.booleans(),
        new_metadata=st.booleans(),
        lost=st.booleans(),
    )
    def join(self, group: int, name: str, kip_394: bool, new_metadata: bool, lost: bool) -> None:
        c, proxy = self.clients[group][name], self.proxies[group]
        if new_metadata:
            c.protocols ^= 1
        result = proxy.join(c.member_id, c.instance_id, require_known=kip_394, protocols=c.protocols, lost=lost)
        if lost:
            # the client crashed with the join in flight; the proxy still sees the answer
            c.member_id, c.generation, c.results = "", -1, []
            return
        c.results.append(result)
        self._sync_clients()

    @rule(group=GROUP)
    def complete_join(self, group: int) -> None:
        self.proxies[group].complete_join()
        self._sync_clients()

    @rule(group=GROUP, name=NAME)
    def heartbeat(self, group: int, name: str) -> None:
        c = self.clients[group][name]
        if c.member_id:
            if self.proxies[group].heartbeat(c.member_id, c.instance_id, c.generation) == UNKNOWN_MEMBER_ID:
                c.member_id, c.generation = "", -1

    @rule(group=GROUP, name=NAME)
    def sync(self, group: int, name: str) -> None:
        c = self.clients[group][name]
        if c.member_id:
            self.proxies[group].sync(c.member_id, c.instance_id, c.generation)
            self._sync_clients()

    @rule(group=GROUP)
    def everyone_syncs_and_heartbeats(self, group: int) -> None:
        proxy = self.proxies[group]
        leader = proxy.coordinator.leader
        for c in sorted(self.clients[group].values(), key=lambda c: c.member_id != leader):
            if c.member_id:
                proxy.sync(c.member_id, c.instance_id, c.generation)
        for c in self.clients[group].values():
            self.heartbeat(group, c.name)

    @rule(group=GROUP, name=NAME)
    def commit(self, group: int, name: str) -> None:
        c = self.clients[group][name]
        if c.member_id:
            self.proxies[group].commit(c.member_id, c.instance_id, c.generation)

    @rule(group=GROUP, name=NAME)
    def leave(self, group: int, name: str) -> None:
        c = self.clients[group][name]
        if c.member_id:
            self.proxies[group].leave(c.member_id, c.instance_id)
            c.member_id, c.generation, c.results = "", -1, []
            self._sync_clients()

    @rule(group=GROUP, name=NAME)
    def crash(self, group: int, name: str) -> None:
        c = self.clients[group][name]
        c.member_id, c.generation, c.results = "", -1, []

    @rule(group=GROUP, name=st.sampled_from(DYNAMIC))
    def join_fails_before_the_coordinator(self, group: int, name: str) -> None:
        c, p = self.clients[group][name], self.proxies[group]
        answer = p.policy.on_join_request(
            p.group_id, c.member_id, None, p.now, session_timeout_ms=SESSION_MS, rebalance_timeout_ms=REBALANCE_MS
        )
        p.answers.append(answer)
        decision, ticket = answer
        if decision is not None and decision.enforced and decision.action is Action.REFUSE and c.member_id:
            p.refused.add(c.member_id)
        if ticket is not None:
            error = COORDINATOR_NOT_AVAILABLE
            p.policy.on_join_response(p.group_id, c.member_id, None, error, "", -1, p.now, ticket=ticket)

    @rule(group=GROUP, name=NAME, kip_394=st.booleans(), new_metadata=st.booleans())
    def join_dies_with_its_connection_before_it_is_forwarded(
        self, group: int, name: str, kip_394: bool, new_metadata: bool
    ) -> None:
        """Issue 33's fake member: admitted (INT32_MAX timeouts), then the connection ends before
        the join is forwarded; the shell hands the ticket back (on_join_unanswered)."""
        c, p = self.clients[group][name], self.proxies[group]
        before = p.policy.view(p.group_id)
        answer = p.policy.on_join_request(
            p.group_id,
            c.member_id,
            c.instance_id,
            p.now,
            session_timeout_ms=INT_MAX,
            rebalance_timeout_ms=INT_MAX,
            require_known_member_id=kip_394,
            protocols=c.protocols ^ int(new_metadata),
        )
        p.answers.append(answer)
        decision, ticket = answer
        if decision is not None and decision.enforced and decision.action is Action.REFUSE and c.member_id:
            p.refused.add(c.member_id)
        if ticket is not None:
            p.policy.on_join_unanswered(p.group_id, c.member_id, c.instance_id, ticket)
            after = p.view()
            # it left nothing behind: the group is as it was (an untracked group is an empty one)
            was = (before.members, before.awaiting_join, before.counted, before.state) if before else (0, 0, 0, EMPTY)
            assert (after.members, after.awaiting_join, after.counted, after.state) == was

    @rule(seconds=st.sampled_from(STEPS))
    def time_passes(self, seconds: float) -> None:
        for proxy in self.proxies:
            proxy.complete_join()  # a join phase ends within its rebalance timeout
        self._sync_clients()
        end = self.now + seconds
        while self.now < end:
            self.now += 0.5
            for proxy in self.proxies:
                proxy.tick(self.now)
            self.policy.expire(self.now)
        self._sync_clients()

    def _views(self) -> list[tuple[Proxy, GroupView | None]]:
        return [(p, self.policy.view(p.group_id)) for p in self.proxies]

    @invariant()
    def counts_are_never_negative(self) -> None:
        for _, view in self._views():
            if view is not None:
                assert min(view.members, view.awaiting_join, view.counted, view.pending) >= 0
                assert view.awaiting_join <= view.members

    @invariant()
    def the_cap_holds_in_enforce_mode(self) -> None:
        if self.mode is Mode.ENFORCE:
            for proxy, view in self._views():
                assert proxy.coordinator.counted() <= CAP
                assert view is None or view.counted <= CAP

    @invariant()
    def every_member_of_the_coordinator_is_tracked(self) -> None:
        """Seeing all traffic, the policy never undercounts (refused members are on their way out)."""
        for proxy in self.proxies:
            coordinator = proxy.coordinator
            for m in coordinator.members.values():
                if m.member_id in proxy.refused and coordinator.state is PREPARING and not m.awaiting:
                    continue
                if m.awaiting and not m.request_member_id and m.instance_id is None:
                    continue  # an old client's join: tracked by ticket until the answer names it
                assert self.policy.has_member(proxy.group_id, m.member_id, m.instance_id), m

    @invariant()
    def the_policy_knows_the_group_state(self) -> None:
        """Seeing all traffic, the state is the coordinator's, except that a join phase ending
        with nobody left (so with no answer to show it) still looks like a rebalance."""
        for proxy, view in self._views():
            state = view.state if view is not None else EMPTY
            coordinator = proxy.coordinator.state
            assert state is coordinator or (state is PREPARING and coordinator is EMPTY)

    @invariant()
    def departed_members_are_forgotten_in_time(self) -> None:
        """What the coordinator dropped is dropped here within a session plus a rebalance timeout."""
        grace = (SESSION_MS + REBALANCE_MS) / 1000
        for proxy in self.proxies:
            group = self.policy._groups.get(proxy.group_id)
            removed_at = proxy.coordinator.removed_at
            for slot in group.slots.values() if group else ():
                if slot.member_id is not None and slot.member_id not in proxy.coordinator.members:
                    assert slot.member_id in removed_at or slot.awaiting, slot
                    assert removed_at.get(slot.member_id, self.now) >= self.now - grace, slot


class ObservedClassicGroupMachine(ClassicGroupMachine):
    mode = Mode.OBSERVE

    @invariant()
    def observe_mode_never_refuses(self) -> None:
        for proxy in self.proxies:
            for decision, ticket in proxy.answers:
                assert ticket is not None  # forwarded
                assert decision is None or (decision.mode is Mode.OBSERVE and not decision.enforced)


_machine_settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestClassicGroupsEnforced = ClassicGroupMachine.TestCase
TestClassicGroupsEnforced.settings = _machine_settings
TestClassicGroupsObserved = ObservedClassicGroupMachine.TestCase
TestClassicGroupsObserved.settings = _machine_settings


class FakeConsumerCoordinator:
    """KIP-848 membership as the coordinator keeps it: members by id, static ones by instance."""

    def __init__(self, session_s: float = 45.0) -> None:
        self.session_s = session_s
        self.members: dict[str, tuple[str | None, float, int]] = {}  # id -> (instance, last hb, epoch)
        self.static: dict[str, str] = {}
        self._ids = itertools.count(1)

    def heartbeat(self, member_id: str, epoch: int, instance_id: str | None, now: float) -> tuple[int, str, int]:
        if epoch == 0:
            new_id = member_id or f"server-{next(self._ids)}"
            if instance_id is not None and instance_id in self.static:
                old = self.static[instance_id]
                if old != new_id and self.members[old][2] != -2:
                    return UNRELEASED_INSTANCE_ID, member_id, 0
                del self.members[old]
            self.members[new_id] = (instance_id, now, 1)
            if instance_id is not None:
                self.static[instance_id] = new_id
            return NONE, new_id, 1
        if member_id not in self.members:
            return UNKNOWN_MEMBER_ID, member_id, 0
        if epoch == -1:
            iid = self.members.pop(member_id)[0]
            if iid is not None:
                del self.static[iid]
            return NONE, member_id, -1
        if epoch == -2:
            self.members[member_id] = (instance_id, now, -2)
            return NONE, member_id, -2
        if epoch != self.members[member_id][2]:
            return FENCED_MEMBER_EPOCH, member_id, 0  # the member stays; it must rejoin with epoch 0
        self.members[member_id] = (instance_id, now, 1)
        return NONE, member_id, 1

    def expire(self, now: float) -> None:
        for member_id, (iid, last, _) in list(self.members.items()):
            if now > last + self.session_s:
                del self.members[member_id]
                if iid is not None:
                    del self.static[iid]


class ConsumerGroupMachine(RuleBasedStateMachine):
    """KIP-848 members join (epoch 0), heartbeat, leave (-1 / -2), crash and time out."""

    def __init__(self) -> None:
        super().__init__()
        self.policy = GroupSizePolicy(GroupSizeConfig(group_consumer_max_size=CAP))
        self.coordinator = FakeConsumerCoordinator()
        self.now = 0.0
        self.ids = itertools.count(1)
        self.clients: dict[str, tuple[str | None, str]] = {}  # name -> (instance, member id)

    def _send(self, name: str, instance_id: str | None, member_id: str, epoch: int, lost: bool = False) -> None:
        answer = self.policy.on_consumer_heartbeat_request(G, member_id, epoch, instance_id, self.now)
        if answer[0] is not None:
            refused(answer)
            self.clients.pop(name, None)
            return
        ticket = answer[1]
        assert (ticket is not None) == (epoch == 0)  # only joins get a ticket
        error, assigned, new_epoch = self.coordinator.heartbeat(member_id, epoch, instance_id, self.now)
        self.policy.on_consumer_heartbeat_response(
            G, member_id, error, assigned, new_epoch, self.now, instance_id=instance_id, ticket=ticket
        )
        if error == FENCED_MEMBER_EPOCH:
            return  # keeps its member id and rejoins with epoch 0
        if lost or error != NONE or new_epoch < 0:
            self.clients.pop(name, None)
        else:
            self.clients[name] = (instance_id, assigned)

    @rule(name=st.sampled_from(DYNAMIC + STATIC), own_id=st.booleans(), lost=st.booleans())
    def join(self, name: str, own_id: bool, lost: bool) -> None:
        instance_id = f"instance-{name}" if name in STATIC else None
        member_id = self.clients.get(name, (None, ""))[1] or (f"client-{next(self.ids)}" if own_id else "")
        self._send(name, instance_id, member_id, 0, lost)

    @rule(name=st.sampled_from(DYNAMIC + STATIC), own_id=st.booleans())
    def join_dies_with_its_connection_before_it_is_forwarded(self, name: str, own_id: bool) -> None:
        """Issue 33's fake member (KIP-848): an admitted join whose connection ends unforwarded."""
        instance_id = f"instance-{name}" if name in STATIC else None
        member_id = self.clients.get(name, (None, ""))[1] or (f"client-{next(self.ids)}" if own_id else "")
        before = self.policy.view(G)
        _, ticket = self.policy.on_consumer_heartbeat_request(G, member_id, 0, instance_id, self.now)
        if ticket is not None:
            self.policy.on_join_unanswered(G, member_id, instance_id, ticket)
            after = self.policy.view(G)
            assert after is not None
            assert (after.members, after.awaiting_join) == (
                (before.members, before.awaiting_join) if before else (0, 0)
            )

    @rule(name=st.sampled_from(DYNAMIC + STATIC), epoch=st.sampled_from([1, 7, -1, -2]))
    def heartbeat_or_leave(self, name: str, epoch: int) -> None:
        if name in self.clients:
            instance_id, member_id = self.clients[name]
            if epoch == -2 and instance_id is None:
                epoch = -1
            self._send(name, instance_id, member_id, epoch)

    @rule(seconds=st.sampled_from((1.0, 10.0, 30.0, 45.0, 46.0)))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        self.coordinator.expire(self.now)
        self.policy.expire(self.now)

    @invariant()
    def the_cap_holds(self) -> None:
        assert len(self.coordinator.members) <= CAP
        view = self.policy.view(G)
        if view is not None:
            assert 0 <= view.members <= CAP

    @invariant()
    def a_consumer_group_is_empty_or_stable(self) -> None:
        view = self.policy.view(G)
        if view is not None:
            assert view.state is (STABLE if view.members else EMPTY)

    @invariant()
    def every_member_is_tracked(self) -> None:
        for member_id, (instance_id, _, _) in self.coordinator.members.items():
            assert self.policy.has_member(G, member_id, instance_id)


TestConsumerGroups = ConsumerGroupMachine.TestCase
TestConsumerGroups.settings = _machine_settings


# -- joins that never become members (issue 33, attack 1) ------------------------------------------

FOREVER_MS = INT_MAX  # a client's own timeouts, as large as the wire allows


def _fake_join(policy: GroupSizePolicy, variant: str, i: int, now: float = 0.0) -> tuple[Answer, str, str | None]:
    """One join of each shape that filled a group on main; (answer, member id, instance id)."""
    member_id, instance_id, known = {
        "v5-unknown-member-id": (f"fake-{i}", None, True),
        "v5-static": ("", f"fake-instance-{i}", True),
        "v3-no-member-id": ("", None, False),
    }[variant]
    answer = policy.on_join_request(
        G,
        member_id,
        instance_id,
        now,
        session_timeout_ms=FOREVER_MS,
        rebalance_timeout_ms=FOREVER_MS,
        require_known_member_id=known,
    )
    return answer, member_id, instance_id


@pytest.mark.parametrize("variant", ["v5-unknown-member-id", "v5-static", "v3-no-member-id"])
def test_joins_whose_connection_ends_unanswered_hold_no_slot(variant: str) -> None:
    policy = GroupSizePolicy(GroupSizeConfig(group_max_size=3))
    fakes = [_fake_join(policy, variant, i) for i in range(3)]
    refused(policy.on_join_request(G, "", None, 0.0, require_known_member_id=False))  # they did count
    for answer, member_id, instance_id in fakes:
        policy.on_join_unanswered(G, member_id, instance_id, forwarded(answer))
    view = policy.view(G)
    assert view is not None and (view.members, view.awaiting_join, view.state) == (0, 0, EMPTY)
    forwarded(policy.on_join_request(G, "", None, 1.0, require_known_member_id=False))


def test_kip_848_joins_whose_connection_ends_unanswered_hold_no_slot() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(group_consumer_max_size=3))
    tickets = [(f"m{i}", forwarded(policy.on_consumer_heartbeat_request(G, f"m{i}", 0, None, 0.0))) for i in range(3)]
    refused(policy.on_consumer_heartbeat_request(G, "real", 0, None, 0.0))
    for member_id, ticket in tickets:
        policy.on_join_unanswered(G, member_id, None, ticket)
    assert policy.view(G).members == 0  # type: ignore[union-attr]
    forwarded(policy.on_consumer_heartbeat_request(G, "real", 0, None, 1.0))


def test_an_unanswered_rejoin_leaves_a_known_member_as_it_was() -> None:
    """A member whose rejoin's connection died is still the coordinator's member (until its session
    ends): only the rejoin is undone, and the rebalance it alone started."""
    proxy = Proxy(3)
    a = proxy.join()
    proxy.complete_join()
    proxy.sync(a.member_id, None, a.generation)
    assert proxy.view().state is STABLE
    ticket = forwarded(
        proxy.policy.on_join_request(G, a.member_id, None, 1.0, session_timeout_ms=SESSION_MS, protocols=1)
    )
    assert proxy.view().state is PREPARING
    proxy.policy.on_join_unanswered(G, a.member_id, None, ticket)
    view = proxy.view()
    assert proxy.policy.has_member(G, a.member_id)
    assert (view.members, view.awaiting_join, view.state) == (1, 0, STABLE)


def test_an_answered_or_superseded_join_is_not_undone_when_its_connection_ends() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(group_max_size=3))
    answered = forwarded(policy.on_join_request(G, "", None, 0.0, require_known_member_id=False))
    policy.on_join_response(G, "", None, NONE, "m1", 1, 0.1, leader_id="m1", ticket=answered)
    policy.on_join_unanswered(G, "", None, answered)
    assert policy.has_member(G, "m1")
    # the same static instance joins on two connections; both end unanswered, in either order
    for first, second in ((0, 1), (1, 0)):
        tickets = [forwarded(policy.on_join_request(G, "", "static", 0.2)) for _ in range(2)]
        policy.on_join_unanswered(G, "", "static", tickets[first])
        assert policy.has_member(G, None, "static")
        assert policy.view(G).awaiting_join == 1  # type: ignore[union-attr]
        policy.on_join_unanswered(G, "", "static", tickets[second])
        assert not policy.has_member(G, None, "static")
        assert policy.view(G).members == 1  # type: ignore[union-attr]


def test_an_unanswered_join_has_the_group_recounted_before_its_next_join() -> None:
    """It may have reached the coordinator and made a member there: the count is asked again."""
    policy = GroupSizePolicy(GroupSizeConfig(group_max_size=3))
    policy.observe_group_size(G, [], 0.0, state="Empty")
    ticket = forwarded(policy.on_join_request(G, "", None, 100.0, require_known_member_id=False))
    assert not policy.needs_reconcile(G, 100.0)
    policy.on_join_unanswered(G, "", None, ticket)
    assert policy.needs_reconcile(G, 100.0)


def test_an_unknown_group_or_ticket_is_ignored() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(group_max_size=3))
    policy.on_join_unanswered("nobody", "", None, 1)
    ticket = forwarded(policy.on_join_request(G, "m", None, 0.0))
    policy.on_join_unanswered(G, "m", None, ticket + 1)
    assert policy.has_member(G, "m")


@pytest.mark.parametrize(("max_ms", "held_s"), [(1_800_000, 3600.0), (60_000, 120.0)])
def test_a_join_in_flight_holds_its_slot_at_most_twice_group_max_session_timeout(max_ms: int, held_s: float) -> None:
    """On main a join's own INT32_MAX timeouts held its slot ~2 x 24.8 days. The session timeout is
    clamped to group.max.session.timeout.ms, the rebalance timeout too (Kafka bounds no rebalance
    timeout: the proxy uses the bound the operator sets on how long a member may be silent)."""
    policy = GroupSizePolicy(GroupSizeConfig(group_max_size=1, max_session_timeout_seconds=max_ms / 1000))
    forwarded(_fake_join(policy, "v3-no-member-id", 0)[0])
    policy.expire(held_s - 0.5)
    assert sum(policy.member_counts()) == 1
    policy.expire(held_s + 0.5)
    assert sum(policy.member_counts()) == 0
    forwarded(policy.on_join_request(G, "", None, held_s + 1, require_known_member_id=False))


def test_a_session_timeout_below_group_min_session_timeout_is_raised_to_it() -> None:
    policy = GroupSizePolicy(GroupSizeConfig(group_max_size=3))
    ticket = forwarded(policy.on_join_request(G, "", None, 0.0, session_timeout_ms=1, require_known_member_id=False))
    policy.on_join_response(G, "", None, NONE, "m1", 1, 0.0, leader_id="m1", ticket=ticket, session_timeout_ms=1)
    policy.expire(5.9)
    assert policy.has_member(G, "m1")
    policy.expire(6.1)
    assert not policy.has_member(G, "m1")


def test_a_join_the_coordinator_answers_invalid_session_timeout_holds_no_slot() -> None:
    """Kafka refuses a session timeout outside its bounds (INVALID_SESSION_TIMEOUT, 26) and adds no
    member; the proxy forwarded the join (the bounds are the broker's) and gives its slot back."""
    policy = GroupSizePolicy(GroupSizeConfig(group_max_size=1))
    (answer, _, _) = _fake_join(policy, "v5-unknown-member-id", 0)
    policy.on_join_response(G, "fake-0", None, ErrorCode.invalid_session_timeout, "", -1, 0.1, ticket=forwarded(answer))
    assert policy.view(G).members == 0  # type: ignore[union-attr]
    forwarded(policy.on_join_request(G, "", None, 0.2, require_known_member_id=False))


@pytest.mark.parametrize(("sent_at", "kept"), [(5.0, False), (15.0, True)])
def test_a_recount_drops_a_join_in_flight_the_coordinator_should_list_by_now(sent_at: float, kept: bool) -> None:
    """Kafka lists a member awaiting join as soon as it reads the join: one forwarded more than
    join_transit_seconds (10 s) before the describe and not listed never reached it."""
    policy = GroupSizePolicy(GroupSizeConfig(group_max_size=3))
    policy.observe_group_size(G, [("a", None)], 0.0, state="Stable")
    forwarded(policy.on_join_request(G, "", None, sent_at, require_known_member_id=False))
    policy.observe_group_size(G, [("a", None)], 21.0, state="Stable", sent_at=20.0)
    assert policy.view(G).members == (2 if kept else 1)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"min_session_timeout_seconds": 9.0, "max_session_timeout_seconds": 8.0},
            "group.min.session.timeout.ms must be at most group.max.session.timeout.ms, got 9000 > 8000",
        ),
        ({"max_session_timeout_seconds": 0}, "group.max.session.timeout.ms must be at least 1, got 0"),
        ({"min_session_timeout_seconds": -1}, "group.min.session.timeout.ms must be between 0 and 2147483647"),
        ({"min_session_timeout_seconds": True}, "group.min.session.timeout.ms must be a number of milliseconds"),
        ({"join_transit_seconds": 0}, "join_transit_seconds must be a positive number"),
    ],
)
def test_invalid_session_timeout_bounds_name_kafkas_keys(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        GroupSizeConfig(**kwargs)  # type: ignore[arg-type]


def test_session_timeout_bounds_default_to_kafkas() -> None:
    config = GroupSizeConfig()
    assert (config.min_session_timeout_seconds, config.max_session_timeout_seconds) == (6.0, 1800.0)


def test_known_members_rejoining_a_rebalance_take_no_token() -> None:
    """With a rate below the group's size, throttling the rejoins would keep the group rebalancing
    for ever (seen through the proxy: two consumers at 2 joins a minute took turns, never both in)."""
    proxy = Proxy(join_rate_per_minute=2)
    a = proxy.join()
    proxy.complete_join()
    proxy.sync(a.member_id, None, a.generation)
    b = proxy.join()  # the second token; the group rebalances
    assert proxy.view().state is PREPARING
    forwarded(proxy.policy.on_join_request(G, a.member_id, None, proxy.now, session_timeout_ms=SESSION_MS))
    throttled(proxy.policy.on_join_request(G, "", None, proxy.now))  # a new member still pays
    assert b.error is None


def test_an_unanswered_rejoin_does_not_lengthen_the_members_session() -> None:
    """Found by the state machine: the dead rejoin's own (clamped) 30-minute session outlived the
    member's real one, so the policy kept a member the coordinator had expired."""
    policy = GroupSizePolicy(GroupSizeConfig(group_max_size=3))
    ticket = forwarded(policy.on_join_request(G, "m", None, 0.0, session_timeout_ms=SESSION_MS))
    policy.on_join_response(
        G, "m", None, NONE, "m", 1, 0.0, leader_id="m", ticket=ticket, session_timeout_ms=SESSION_MS
    )
    ticket = forwarded(
        policy.on_join_request(G, "m", None, 1.0, session_timeout_ms=INT_MAX, rebalance_timeout_ms=INT_MAX)
    )
    policy.on_join_unanswered(G, "m", None, ticket)
    policy.expire(SESSION_MS / 1000 + 0.5)
    assert not policy.has_member(G, "m")
