"""Consumer group size: KIP-389 ``group.max.size`` and KIP-848 ``group.consumer.max.size``.

Mirrors the admission rule of Kafka's group coordinator (``GroupCoordinator.acceptJoiningMember``,
``GroupMetadataManager.acceptJoiningMember`` and ``throwIfConsumerGroupIsFull``): a member that
would make a group bigger than its cap is answered ``GROUP_MAX_SIZE_REACHED`` (81), which the
clients treat as fatal.

Classic groups (JoinGroup), by the coordinator's group state:

* Empty / Dead: always admitted.
* PreparingRebalance: admitted if the member is already awaiting join, or fewer than
  ``group.max.size`` members are awaiting join. Counting the awaiting members (not the whole
  group) is what lets Kafka shrink an over-sized group: the *last* members to rejoin are
  refused and removed.
* CompletingRebalance / Stable: admitted if the member exists, or the group has fewer than
  ``group.max.size`` members.
* Members that only hold a pending id from ``MEMBER_ID_REQUIRED`` (KIP-394) are not counted.
* "Exists" and "awaiting join" are asked of the request's member id (``group.hasMember(memberId)``):
  a static member (``group.instance.id``) that restarts with an empty member id is a new member
  for this check, so in a full Stable group it is refused until its old incarnation's session
  ends (checked against Apache Kafka 4.4.0). Admitted, it takes over its own slot.

KIP-848 consumer groups (ConsumerGroupHeartbeat): a member joining with epoch 0 is refused when
the group already has ``group.consumer.max.size`` members and it is not one of them, with the
message ``The consumer group has reached its maximum capacity of N members.`` A static member
that rejoins under its instance id takes its own slot back (KAFKA-20601).

Group states. A tracked group's state moves only through ``next_state``, driven by the one table
``TRANSITIONS`` of (state, event) -> next state, in the shape of h11's ``_state.py``. Events are
what the coordinator did or answered (``GroupEvent``: a JoinGroup that starts a join phase, a
JoinGroup answered with a new generation, a SyncGroup answered NONE, ...). A pair missing from
the table raises ``InvalidTransition``: the handlers never fire one, so it is a bug here, never a
client's doing. Where Kafka can send an answer that a state we hold does not explain (an answer
that left the coordinator before a request we have already forwarded), the table keeps the state.
KIP-848 groups are only Empty or Stable here (no join phase; the count is what matters).

Reload. ``reconfigure`` gives the live policy new caps, join rate and mode and keeps every tracked
group. A lowered cap applies to the next joins, as in Kafka: members already over it stay until the
group's next rebalance, whose join phase refuses the last members to rejoin (the PreparingRebalance
rule above); a KIP-848 group over a lowered ``group.consumer.max.size`` keeps its members and only
refuses new ones (``throwIfConsumerGroupIsFull`` looks at joining members only).

Where this policy knowingly differs from Kafka:

* During PreparingRebalance a static member that has not rejoined yet keeps its slot: Kafka keeps
  such members when the join phase completes, so counting only the awaiting members could end a
  rebalance over the cap. New members are admitted only while
  ``awaiting + static members not yet rejoined < group.max.size``.
* The proxy sees requests before the coordinator and responses after it, so a slot is taken when
  a join is admitted, before the coordinator has it. The slot goes when the answer says the join
  failed, when it times out, or when the join's connection ends before its answer
  (``on_join_unanswered``): a join that never reached the coordinator, or that it refused, holds
  no slot, as in Kafka. A join that did reach the coordinator before its connection died may be a
  member there (Kafka keeps it until its session ends): the group is recounted at the coordinator
  before its next join, and that member counts again once the coordinator lists it.
* Timeouts come from the join, bounded as Kafka bounds them: its session timeout within
  ``group.min.session.timeout.ms`` / ``group.max.session.timeout.ms``, its rebalance timeout at most
  ``group.max.session.timeout.ms`` (Kafka bounds no rebalance timeout; ``max.poll.interval.ms`` is
  the client's). Kafka answers a session timeout out of bounds INVALID_SESSION_TIMEOUT itself; the
  proxy forwards such a join with the clamped timeout in its books, and its slot goes with the
  coordinator's answer (the bounds are the broker's: a proxy with other bounds refuses no client).
  So a join in flight holds its slot at most rebalance + session timeout (1 h by default), and a
  member that stops heartbeating at most ``group.max.session.timeout.ms``.
* A recount at the coordinator (``observe_group_size``) keeps joins in flight it does not list yet,
  but only for ``join_transit_seconds`` (10 s) after they were forwarded: Kafka lists a member
  awaiting join as soon as it reads the join, so one forwarded earlier and not listed never reached
  it (a join stuck behind a request the broker holds on the same connection, say). The leader's
  member list keeps every join in flight: one may reach the coordinator just after the join phase
  it completes.
* A member the policy refuses never reaches the coordinator, so a static one keeps its slot
  until its session ends (Kafka would remove it; the coordinator behind us does not).
* Kafka starts a rebalance of a classic group found over its cap when it loads the group
  (``GroupMetadataManager.onLoaded``, "Freshly-loaded group ... is over capacity"); the proxy cannot
  start one, so a group over a lowered cap shrinks at its next rebalance, whatever starts it.
* Optional ``group.join.rate.per.minute`` (not in Kafka): joins beyond that rate in one group are
  throttled (a token bucket holding one minute's worth of joins). Known members rejoining a
  rebalance, and the second half of a KIP-394 join, take no token.

Guarantee. Membership and the group state are rebuilt from the group traffic the shell feeds in
(requests for admission, responses for what the coordinator did). When this proxy sees all of a
group's coordinator traffic, admission is exact and, in enforce mode, the coordinator's group
never exceeds its cap: not in CompletingRebalance / Stable, and not in the next generation while
it rebalances (awaiting + static members), even though the coordinator itself enforces nothing.
Sessions end as Kafka ends them (no heartbeat, join, sync or commit for ``session.timeout.ms``;
members awaiting join or sync are kept alive), never earlier, with the exceptions listed above (a
join whose connection ended unanswered, a join held past its bounded timeouts or unlisted past
``join_transit_seconds``); a member the coordinator does have is counted again from its next answer
or the next recount. A join is never counted for longer than its bounded timeouts, nor after its
connection ends unanswered, so fake joins cannot hold a group's slots. Otherwise (several proxies, a proxy
restart, clients bypassing the proxy, tracking state evicted by ``max_groups``) it is best
effort: groups first seen mid-life are learnt on first contact, ``needs_reconcile`` names groups
whose count should be refreshed from the coordinator (DescribeGroups / ConsumerGroupDescribe)
and ``observe_group_size`` applies the answer.

Sans-I/O: no sockets, no clocks (``now`` is passed in, in seconds), no logging. Memory is bounded
by ``max_groups`` (least recently used groups are dropped) and by expiring idle empty groups.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import math
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from kio.schema.errors import ErrorCode

from policies.api_keys import HEARTBEAT, INT_MAX, OFFSET_COMMIT, SYNC_GROUP
from policies.decision import Action, Admission, Decision, Policy
from policies.mode import Mode
from policies.properties import (
    GROUP_CONSUMER_MAX_SIZE,
    GROUP_CONSUMER_SESSION_TIMEOUT_MS,
    GROUP_JOIN_RATE_PER_MINUTE,
    GROUP_MAX_SESSION_TIMEOUT_MS,
    GROUP_MAX_SIZE,
    GROUP_MIN_SESSION_TIMEOUT_MS,
    GROUP_RECONCILE_INTERVAL_MS,
    int_default,
)

__all__ = [
    "TRANSITIONS",
    "ExpiryReport",
    "GroupEvent",
    "GroupKind",
    "GroupSizeConfig",
    "GroupSizePolicy",
    "GroupState",
    "GroupView",
    "InvalidTransition",
    "Restore",
    "next_state",
]

# ConsumerGroupHeartbeat member epochs with a meaning of their own.
JOIN_EPOCH: Final = 0
LEAVE_EPOCH: Final = -1
STATIC_LEAVE_EPOCH: Final = -2

_MAX_PENDING_PER_GROUP: Final = 10_000


class GroupState(enum.Enum):
    """Kafka's classic group states, as far as the traffic shows them."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"

    # Members are singletons: hash by identity in C, not by name in Python (Enum.__hash__), for
    # the TRANSITIONS lookups.
    __hash__ = object.__hash__


class GroupKind(enum.Enum):
    CLASSIC = "classic"  # JoinGroup/SyncGroup/Heartbeat; capped by group.max.size
    CONSUMER = "consumer"  # KIP-848 ConsumerGroupHeartbeat; capped by group.consumer.max.size


# Enum members compared on every group request or response, bound once: on Python 3.11 reading a
# member off its class costs about 100 ns, a module global a third of that. Error codes are kio's
# (org.apache.kafka.common.protocol.Errors), only named here.
_NONE: Final = ErrorCode.none
_REBALANCE_IN_PROGRESS: Final = ErrorCode.rebalance_in_progress
_UNKNOWN_MEMBER_ID: Final = ErrorCode.unknown_member_id
_MEMBER_ID_REQUIRED: Final = ErrorCode.member_id_required
_GROUP_MAX_SIZE_REACHED: Final = ErrorCode.group_max_size_reached
_CLASSIC: Final = GroupKind.CLASSIC
_CONSUMER: Final = GroupKind.CONSUMER
_ENFORCE: Final = Mode.ENFORCE
_GROUP_SIZE: Final = Policy.GROUP_SIZE
_REFUSE: Final = Action.REFUSE


# ---------------------------------------------------------------------------------------------
# The state machine: one table, one transition function


class GroupEvent(enum.Enum):
    """What the coordinator did or answered, as far as it moves a group's state."""

    # A forwarded JoinGroup the coordinator answers by (re)starting the join phase:
    # addMemberAndRebalance, updateMemberAndRebalance, a leader's or changed member's rejoin.
    JOIN_STARTS_REBALANCE = enum.auto()
    # The JoinGroup that alone started the join phase failed, or never reached the coordinator.
    STARTING_JOIN_FAILED = enum.auto()
    # A JoinGroup (or a later answer) shows a new generation: the join phase completed.
    JOIN_PHASE_COMPLETED = enum.auto()
    # Every join of a rebalance that only joins started was answered with the generation the group
    # had: the coordinator ran no join phase. Kafka never does (it answers a join phase with a new
    # generation, and answers at once only the rejoins that start none); Tansu 0.6.0 answers a Stable
    # group's leader and its followers so, and a proxy left rebalancing would admit new members.
    JOINS_ANSWERED_AT_ONCE = enum.auto()
    # SyncGroup answered NONE: the leader's assignment is in.
    SYNC_COMPLETED = enum.auto()
    # JoinGroup, SyncGroup or Heartbeat answered REBALANCE_IN_PROGRESS for the current generation.
    REBALANCE_ANSWERED = enum.auto()
    # The coordinator has a member the group did not show: a response from an untracked member,
    # or a KIP-848 join (the coordinator adds the member at once).
    MEMBER_ADDED = enum.auto()
    # LeaveGroup or an expired session removed members and others remain (maybePrepareRebalance).
    MEMBER_REMOVED = enum.auto()
    # No member is left; or a classic member joined an empty KIP-848 group, which Kafka deletes
    # (maybeDeleteEmptyConsumerGroup) to start an empty classic group.
    GROUP_EMPTIED = enum.auto()
    # A ConsumerGroupHeartbeat joined a classic group: Kafka converts it (online upgrade).
    UPGRADED_TO_CONSUMER = enum.auto()
    # DescribeGroups / ConsumerGroupDescribe named the state.
    DESCRIBED_EMPTY = enum.auto()
    DESCRIBED_PREPARING_REBALANCE = enum.auto()
    DESCRIBED_COMPLETING_REBALANCE = enum.auto()
    DESCRIBED_STABLE = enum.auto()

    __hash__ = object.__hash__  # as GroupState's


class Restore(enum.Enum):
    """A table target that is not a fixed state."""

    BEFORE_REBALANCE = "the state the group had when the failed join started the rebalance"


_E = GroupState.EMPTY
_P = GroupState.PREPARING_REBALANCE
_C = GroupState.COMPLETING_REBALANCE
_S = GroupState.STABLE
_Ev = GroupEvent
_BEFORE_REBALANCE: Final = Restore.BEFORE_REBALANCE

# What the coordinator can tell in any state a tracked group is in.
_FROM_ANY_STATE: Final[Mapping[GroupEvent, GroupState]] = {
    _Ev.GROUP_EMPTIED: _E,
    _Ev.DESCRIBED_EMPTY: _E,
    _Ev.DESCRIBED_PREPARING_REBALANCE: _P,
    _Ev.DESCRIBED_COMPLETING_REBALANCE: _C,
    _Ev.DESCRIBED_STABLE: _S,
}

TRANSITIONS: Final[Mapping[GroupState, Mapping[GroupEvent, GroupState | Restore]]] = {
    _E: {
        _Ev.JOIN_STARTS_REBALANCE: _P,
        _Ev.JOIN_PHASE_COMPLETED: _C,  # a group first seen mid-life
        _Ev.SYNC_COMPLETED: _S,
        _Ev.REBALANCE_ANSWERED: _E,  # no-op: older than the Empty we saw (Kafka answers Empty groups UNKNOWN_MEMBER_ID)
        _Ev.MEMBER_ADDED: _S,
        _Ev.MEMBER_REMOVED: _E,  # no-op: an Empty group has no generation to rebalance
        _Ev.UPGRADED_TO_CONSUMER: _E,
        **_FROM_ANY_STATE,
    },
    _P: {
        _Ev.JOIN_STARTS_REBALANCE: _P,  # another member joins the join phase
        _Ev.STARTING_JOIN_FAILED: _BEFORE_REBALANCE,
        _Ev.JOIN_PHASE_COMPLETED: _C,
        _Ev.JOINS_ANSWERED_AT_ONCE: _BEFORE_REBALANCE,
        _Ev.SYNC_COMPLETED: _P,  # no-op: the answer left before a join we forwarded started this rebalance
        _Ev.REBALANCE_ANSWERED: _P,
        _Ev.MEMBER_ADDED: _P,
        _Ev.MEMBER_REMOVED: _P,
        _Ev.UPGRADED_TO_CONSUMER: _S,
        **_FROM_ANY_STATE,
    },
    _C: {
        _Ev.JOIN_STARTS_REBALANCE: _P,  # a new member, changed metadata, a static member replaced
        _Ev.JOIN_PHASE_COMPLETED: _C,  # a newer generation than the one we saw complete
        _Ev.SYNC_COMPLETED: _S,
        _Ev.REBALANCE_ANSWERED: _P,
        _Ev.MEMBER_ADDED: _C,
        _Ev.MEMBER_REMOVED: _P,
        _Ev.UPGRADED_TO_CONSUMER: _S,
        **_FROM_ANY_STATE,
    },
    _S: {
        _Ev.JOIN_STARTS_REBALANCE: _P,  # a new member, the leader's rejoin, changed metadata
        _Ev.JOIN_PHASE_COMPLETED: _C,  # we missed the start of the rebalance
        _Ev.SYNC_COMPLETED: _S,
        _Ev.REBALANCE_ANSWERED: _P,
        _Ev.MEMBER_ADDED: _S,
        _Ev.MEMBER_REMOVED: _P,
        _Ev.UPGRADED_TO_CONSUMER: _S,
        **_FROM_ANY_STATE,
    },
    GroupState.DEAD: {},  # a Dead group is forgotten (forget_group), never tracked
}

# What says a group rebalances besides the joins the proxy forwarded: the coordinator itself, or a
# member gone (Kafka then rebalances the rest).
_REBALANCE_TOLD: Final = frozenset({_Ev.REBALANCE_ANSWERED, _Ev.MEMBER_REMOVED, _Ev.DESCRIBED_PREPARING_REBALANCE})

_DESCRIBED: Final[Mapping[GroupState, GroupEvent]] = {
    _E: _Ev.DESCRIBED_EMPTY,
    _P: _Ev.DESCRIBED_PREPARING_REBALANCE,
    _C: _Ev.DESCRIBED_COMPLETING_REBALANCE,
    _S: _Ev.DESCRIBED_STABLE,
}


class InvalidTransition(RuntimeError):
    """An event the group's state has no transition for: a bug in this module, not in the traffic."""

    def __init__(self, state: GroupState, event: GroupEvent) -> None:
        super().__init__(f"a group in state {state.value} cannot take {event.name} (not in group_size.TRANSITIONS)")
        self.state = state
        self.event = event


def next_state(state: GroupState, event: GroupEvent, before_rebalance: GroupState = _E) -> GroupState:
    """The state ``event`` moves a group to; ``before_rebalance`` is what the rebalance started from."""
    target = TRANSITIONS[state].get(event)
    if target is None:
        raise InvalidTransition(state, event)
    if target is _BEFORE_REBALANCE:
        return before_rebalance
    return target


# ---------------------------------------------------------------------------------------------
# Configuration


def _int_setting(key: str, value: object, minimum: int, rule: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be an integer, got {value!r}")
    if not minimum <= value <= INT_MAX:
        raise ValueError(f"{key} {rule}, got {value}")
    return value


def _seconds_setting(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{key} must be a positive number of seconds, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class GroupSizeConfig:
    """Settings, validated here; errors name Kafka's key where Kafka has one.

    Built by the proxy's config (``proxy.config.model.Policies.group_size_config``) from the YAML keys.
    """

    group_max_size: int = int_default(GROUP_MAX_SIZE)
    group_consumer_max_size: int = int_default(GROUP_CONSUMER_MAX_SIZE)
    join_rate_per_minute: int = int_default(GROUP_JOIN_RATE_PER_MINUTE)  # -1 = off
    consumer_session_timeout_seconds: float = 45.0  # group.consumer.session.timeout.ms
    max_groups: int = 100_000  # groups tracked at once; least recently used dropped beyond
    idle_group_seconds: float = 3600.0  # empty groups with no traffic for this long are dropped
    # At most one reconciliation per group per interval.
    reconcile_interval_seconds: float = int_default(GROUP_RECONCILE_INTERVAL_MS) / 1000
    reconcile_margin: int = 1  # groups with >= cap - margin members are reconciled
    default_session_timeout_seconds: float = 45.0  # when a JoinGroup's is not passed in
    default_rebalance_timeout_seconds: float = 300.0  # when a JoinGroup's is not passed in
    # Kafka's bounds on a classic member's session timeout: a JoinGroup outside them is answered
    # INVALID_SESSION_TIMEOUT by the coordinator, so no member it admits has one. Here they bound
    # the timeouts a join's slot lives by (the rebalance timeout too: see _rebalance_timeout).
    min_session_timeout_seconds: float = int_default(GROUP_MIN_SESSION_TIMEOUT_MS) / 1000
    max_session_timeout_seconds: float = int_default(GROUP_MAX_SESSION_TIMEOUT_MS) / 1000
    # A join forwarded this long before a describe was sent has reached the coordinator if it ever
    # will (Kafka lists a member awaiting join from the moment it reads the join): an awaiting slot
    # that old which the coordinator does not list is not a member (see _reconcile_members).
    join_transit_seconds: float = 10.0

    def __post_init__(self) -> None:
        _int_setting(GROUP_MAX_SIZE, self.group_max_size, 1, "must be at least 1")
        _int_setting(GROUP_CONSUMER_MAX_SIZE, self.group_consumer_max_size, 1, "must be at least 1")
        rate = _int_setting(GROUP_JOIN_RATE_PER_MINUTE, self.join_rate_per_minute, -1, "must be -1 (off) or >= 1")
        if rate == 0:
            raise ValueError(f"{GROUP_JOIN_RATE_PER_MINUTE} must be -1 (off) or at least 1, got 0")
        _int_setting("max_groups", self.max_groups, 1, "must be at least 1")
        _int_setting("reconcile_margin", self.reconcile_margin, 0, "must be at least 0")
        _seconds_setting(GROUP_CONSUMER_SESSION_TIMEOUT_MS, self.consumer_session_timeout_seconds)
        _seconds_setting("idle_group_seconds", self.idle_group_seconds)
        _seconds_setting("reconcile_interval_seconds", self.reconcile_interval_seconds)
        _seconds_setting("default_session_timeout_seconds", self.default_session_timeout_seconds)
        _seconds_setting("default_rebalance_timeout_seconds", self.default_rebalance_timeout_seconds)
        _seconds_setting("join_transit_seconds", self.join_transit_seconds)
        low, high = self.min_session_timeout_seconds, self.max_session_timeout_seconds
        for key, value in ((GROUP_MIN_SESSION_TIMEOUT_MS, low), (GROUP_MAX_SESSION_TIMEOUT_MS, high)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"{key} must be a number of milliseconds, got {value!r}")
            if not 0 <= value <= INT_MAX / 1000:
                raise ValueError(f"{key} must be between 0 and {INT_MAX}, got {value * 1000:g}")
        if high <= 0:
            raise ValueError(f"{GROUP_MAX_SESSION_TIMEOUT_MS} must be at least 1, got {high * 1000:g}")
        if low > high:
            raise ValueError(
                f"{GROUP_MIN_SESSION_TIMEOUT_MS} must be at most {GROUP_MAX_SESSION_TIMEOUT_MS}, "
                f"got {low * 1000:g} > {high * 1000:g}"
            )


# ---------------------------------------------------------------------------------------------
# What the policy reports


@dataclass(frozen=True, slots=True)
class GroupView:
    """A read-only summary of one tracked group (no member ids)."""

    kind: GroupKind
    state: GroupState
    generation: int
    members: int  # tracked members, joins in flight and members known only by count included
    awaiting_join: int  # members with a join in flight
    counted: int  # what the cap is compared with in the current state
    pending: int  # KIP-394 pending member ids (not counted)
    max_size: int
    reconciled_at: float | None


@dataclass(frozen=True, slots=True)
class ExpiryReport:
    members_expired: int = 0
    groups_dropped: int = 0


# ---------------------------------------------------------------------------------------------
# Internal state


class _BeforeJoin(NamedTuple):
    """What a member's newest join changed, as it was before: a join that takes no effect at the
    coordinator (failed, or its connection ended unanswered) puts it back."""

    ticket: int
    awaiting: bool
    session_s: float
    rebalance_s: float
    join_sent_at: float
    protocols: object

    @classmethod
    def of(cls, slot: _Slot) -> _BeforeJoin:
        return cls(slot.ticket, slot.awaiting, slot.session_s, slot.rebalance_s, slot.join_sent_at, slot.protocols)


@dataclass(slots=True)
class _Slot:
    """One member's place in a group. Keyed by instance id (static), member id, or ticket."""

    key: str
    member_id: str | None  # None until the coordinator's answer names it
    instance_id: str | None
    created_at: float
    last_seen: float
    session_s: float
    rebalance_s: float
    join_sent_at: float
    ticket: int = 0  # the newest join from this member
    created_ticket: int = -1  # the join that created this slot, if one did
    prior: _BeforeJoin | None = None  # before the newest join from it, if it joined through this policy
    awaiting: bool = False  # a join from it is in flight
    sync_sent_at: float | None = None  # a SyncGroup from it is in flight (Kafka keeps it alive)
    protocols: object = None

    def deadline(self) -> float:
        if self.awaiting:
            return self.join_sent_at + self.rebalance_s + self.session_s
        if self.sync_sent_at is not None:
            return max(self.last_seen, self.sync_sent_at + self.rebalance_s) + self.session_s
        return self.last_seen + self.session_s


@dataclass(slots=True)
class _Group:
    kind: GroupKind
    last_activity: float
    tokens: float
    tokens_at: float
    state: GroupState = GroupState.EMPTY  # written only by fire()
    before_rebalance: GroupState = GroupState.EMPTY  # the state the current rebalance started from
    generation: int = -1
    leader: str | None = None
    slots: dict[str, _Slot] = field(default_factory=dict)
    by_member: dict[str, str] = field(default_factory=dict)
    pending: dict[str, float] = field(default_factory=dict)  # pending member id -> expires at
    phantom: int = 0  # members known only by a count from the coordinator
    n_awaiting: int = 0
    n_static_idle: int = 0  # static members not awaiting join
    reconciled_at: float | None = None
    reconcile_started_at: float | None = None
    scheduled: float | None = None  # earliest timer queued for this group
    rebalance_cause: int = 0  # the join (ticket) that alone started the current rebalance
    joins_only: bool = False  # joins started the current rebalance, and nothing else told of it since
    rebalance_asked: bool = False  # the coordinator was asked about the current rebalance (needs_reconcile)
    hint: float = math.inf  # lower bound of deadlines changed since the last _schedule

    def fire(self, event: GroupEvent) -> None:
        """The one place a group's state changes."""
        new = next_state(self.state, event, self.before_rebalance)
        if new is _P and self.state is not _P:
            self.before_rebalance = self.state
            self.joins_only = event is _Ev.JOIN_STARTS_REBALANCE
            self.rebalance_asked = False
        elif event in _REBALANCE_TOLD:
            self.joins_only = False
        self.state = new

    def settle_consumer_state(self) -> None:
        """A KIP-848 group is Stable while it has members, else Empty."""
        self.fire(_Ev.MEMBER_ADDED if self.size else _Ev.GROUP_EMPTIED)

    @property
    def size(self) -> int:
        return len(self.slots) + self.phantom

    @property
    def counted(self) -> int:
        if self.kind is _CLASSIC and self.state is _P:
            return self.n_awaiting + self.n_static_idle + self.phantom
        return self.size

    @property
    def idle(self) -> bool:
        return not self.slots and not self.pending


def _static_key(instance_id: str) -> str:
    return "i:" + instance_id


def _member_key(member_id: str) -> str:
    return "m:" + member_id


def _ticket_key(ticket: int) -> str:
    return f"t:{ticket}"


_STATE_NAMES: Final[Mapping[str, GroupState]] = {
    "empty": _E,
    "preparingrebalance": _P,
    "completingrebalance": _C,
    "stable": _S,
    "dead": GroupState.DEAD,
    # KIP-848 ConsumerGroupDescribe states
    "assigning": _S,
    "reconciling": _S,
    "notready": _S,
}
_CONSUMER_STATE_NAMES: Final = frozenset({"assigning", "reconciling", "notready"})

# A member awaiting its SyncGroup answer gets the assignment (NONE) or REBALANCE_IN_PROGRESS (a
# rebalance began first); Kafka restarts its session with either (propagateAssignment).
_SYNC_ANSWERS: Final = frozenset({_NONE, _REBALANCE_IN_PROGRESS})
# JoinGroup answers after which Kafka has removed the member (group.remove(memberId)).
_JOIN_REMOVED: Final = frozenset({_UNKNOWN_MEMBER_ID, _GROUP_MAX_SIZE_REACHED})
_FORWARD: Final = Admission(None, None)


# ---------------------------------------------------------------------------------------------
# The policy


class GroupSizePolicy:
    """Tracks consumer group membership from traffic and admits joins up to the group's cap."""

    def __init__(self, config: GroupSizeConfig | None = None, mode: Mode = Mode.ENFORCE) -> None:
        self.config = config if config is not None else GroupSizeConfig()
        self.mode = mode
        self._groups: OrderedDict[str, _Group] = OrderedDict()
        self._timers: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        self._tickets = itertools.count(1)

    def reconfigure(self, config: GroupSizeConfig, mode: Mode) -> None:
        """Apply a reloaded config and mode to the live policy; every tracked group is kept.

        New caps apply from the next join (see the module docstring for groups already over a
        lowered cap); session defaults from each member's next join; a changed join rate keeps each
        group's tokens up to the new bucket size (a bucket switched on starts full, as a new group's).
        """
        old, self.config, self.mode = self.config, config, mode
        rate = config.join_rate_per_minute
        if rate != old.join_rate_per_minute and rate > 0:
            for g in self._groups.values():
                g.tokens = float(rate) if old.join_rate_per_minute < 0 else min(g.tokens, float(rate))
        while len(self._groups) > config.max_groups:
            self._groups.popitem(last=False)
        if config.idle_group_seconds < old.idle_group_seconds:
            for group_id, g in self._groups.items():
                self._schedule(group_id, g)  # idle groups may now be due sooner

    # -- metrics -----------------------------------------------------------------------------

    @property
    def groups_tracked(self) -> int:
        return len(self._groups)

    def member_counts(self) -> Iterator[int]:
        """Each tracked group's member count (for a histogram; no group ids)."""
        return (g.size for g in self._groups.values())

    def view(self, group_id: str) -> GroupView | None:
        g = self._groups.get(group_id)
        if g is None:
            return None
        return GroupView(
            kind=g.kind,
            state=g.state,
            generation=g.generation,
            members=g.size,
            awaiting_join=g.n_awaiting,
            counted=g.counted,
            pending=len(g.pending),
            max_size=self._cap(g),
            reconciled_at=g.reconciled_at,
        )

    def has_member(self, group_id: str, member_id: str | None = None, instance_id: str | None = None) -> bool:
        g = self._groups.get(group_id)
        return g is not None and self._find(g, member_id or "", instance_id) is not None

    # -- classic protocol ----------------------------------------------------------------------

    def on_join_request(
        self,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        now: float,
        *,
        session_timeout_ms: int | None = None,
        rebalance_timeout_ms: int | None = None,
        require_known_member_id: bool = True,
        protocols: object = None,
    ) -> Admission:
        """Decide on a JoinGroup request before it is forwarded: (decision, ticket).

        ``decision`` is None for a plain admit; else a GROUP_SIZE REFUSE (81) or THROTTLE (14) in
        the policy's mode: enforced, answer the request with it and do not forward (ticket None);
        observed, record it and forward. ``ticket`` names a forwarded join: pass it back with the
        response (``on_join_response``). It tells a late answer to an older join from the answer
        to the newest one, and finds the slot of a member whose id the coordinator has yet to
        assign. A join whose answer never comes is undone by ``on_join_unanswered`` when its
        connection ends; otherwise its slot is freed when it times out.

        ``require_known_member_id`` is ``api_version >= 4`` (KIP-394); ``protocols`` is any
        hashable fingerprint of the request's protocols (e.g. a hash of names and metadata),
        used to tell whether a rejoin starts a rebalance, or None if unknown.
        """
        g = self._groups.get(group_id)
        if g is None:
            g = self._create(group_id, _CLASSIC, now)
        elif g.kind is _CONSUMER and g.size == 0:
            g.kind = _CLASSIC
            g.fire(_Ev.GROUP_EMPTIED)
        self._touch_group(group_id, g, now)
        slot = self._find(g, member_id, group_instance_id)

        if g.kind is _CONSUMER:
            decision = self._consumer_refusal(g, slot, group_id, member_id)
        else:
            decision = self._classic_refusal(g, slot, group_id, member_id, known=slot is not None and bool(member_id))
        # Not counted toward the rate: the second half of a KIP-394 join (the same join), and a known
        # member's rejoin while the group rebalances (the join that started the rebalance paid for it,
        # and the coordinator waits for every member: throttled, they would only hold it up, and a
        # group bigger than the rate would never finish rebalancing).
        rejoin = slot is not None and bool(member_id) and g.state is _P
        if decision is None and not rejoin and not (member_id and member_id in g.pending):
            decision = self._take_token(g, group_id, member_id, now)

        if decision is not None and self.mode is _ENFORCE:
            if decision.action is _REFUSE:
                # Kafka removes a refused member (group.remove(memberId)), pending or not. The
                # coordinator behind us has not seen the request: it drops a dynamic member that
                # has not rejoined when the join phase completes, but keeps a static one until
                # its session ends, so a static member keeps its slot until then.
                g.pending.pop(member_id, None)
                if slot is not None and member_id and slot.member_id == member_id and slot.instance_id is None:
                    self._drop(g, slot)
                    self._after_removal(g, rebalance=False)
                self._schedule(group_id, g)
            return Admission(decision, None)

        session_s = self._session_timeout(session_timeout_ms, self.config.default_session_timeout_seconds)
        rebalance_s = self._rebalance_timeout(rebalance_timeout_ms, session_s)
        ticket = next(self._tickets)
        self._apply_classic_join(
            g,
            slot,
            member_id,
            group_instance_id,
            now,
            session_s,
            rebalance_s,
            require_known_member_id,
            protocols,
            ticket,
        )
        self._schedule(group_id, g)
        return Admission(decision, ticket)

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
    ) -> None:
        """Settle a JoinGroup the policy admitted, from the coordinator's response.

        ``members`` is the leader's member list ((member_id, group_instance_id) pairs), or None
        for followers. A request that never reached the coordinator must be settled too, with
        the error code the client was answered with.
        """
        g = self._groups.get(group_id)
        if g is None:
            if error_code != _NONE and error_code != _MEMBER_ID_REQUIRED:
                return
            g = self._create(group_id, _CLASSIC, now)
        self._touch_group(group_id, g, now)
        slot = g.slots.get(_ticket_key(ticket)) if ticket is not None else None
        if slot is None:
            slot = self._find(g, request_member_id, group_instance_id)
        session_s = self._session_timeout(session_timeout_ms, slot.session_s if slot else self._default_session(g))
        # An answer to an older join of a member that has joined again since (e.g. a fenced
        # static incarnation): the newest join is still in flight.
        stale = ticket is not None and slot is not None and slot.ticket != ticket
        if stale and error_code != _NONE:
            slot = None

        if error_code == _NONE:
            if assigned_member_id:
                # Kafka restarts sessions when a join phase completes, not on a rejoin it answers at once
                touch = g.kind is _CONSUMER or generation_id > g.generation
                slot = self._confirm(
                    g, slot, assigned_member_id, group_instance_id, now, session_s, still_awaiting=stale, touch=touch
                )
            elif slot is not None and not stale:
                self._set_awaiting(g, slot, False)
            if g.kind is _CLASSIC:
                self._classic_generation(g, slot, generation_id, leader_id, now)
                if g.state is _P and g.joins_only and not g.n_awaiting and generation_id == g.generation:
                    g.fire(_Ev.JOINS_ANSWERED_AT_ONCE)
                    g.rebalance_cause = 0
            else:
                g.settle_consumer_state()
            if members is not None and leader_id is not None and assigned_member_id == leader_id:
                if generation_id >= g.generation:
                    self._reconcile_members(g, members, now, cutoff=now)
                    g.reconciled_at = now
        elif error_code == _MEMBER_ID_REQUIRED:
            if slot is not None:
                self._undo_join(g, slot)
            if assigned_member_id:
                self._add_pending(g, assigned_member_id, now + session_s)
        elif error_code in _JOIN_REMOVED:
            # a static member that joined without its member id keeps its slot
            if slot is not None:
                drop = error_code == _UNKNOWN_MEMBER_ID or slot.member_id == request_member_id
                self._undo_join(g, slot, drop=drop)
        elif error_code == _REBALANCE_IN_PROGRESS:
            if slot is not None:
                self._set_awaiting(g, slot, False)
            self._begin_rebalance(g)
        elif slot is not None:
            # The join took no effect (coordinator unavailable, fenced, invalid, ...).
            self._undo_join(g, slot)
        self._schedule(group_id, g)

    def on_sync_request(
        self, group_id: str, member_id: str, now: float, *, group_instance_id: str | None = None
    ) -> None:
        """A SyncGroup request was forwarded: Kafka keeps a member awaiting sync alive."""
        g = self._groups.get(group_id)
        slot = self._find(g, member_id, group_instance_id) if g is not None else None
        if g is not None and slot is not None:
            slot.sync_sent_at = now
            self._note(g, slot)
            self._schedule(group_id, g)

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
    ) -> None:
        """A SyncGroup, Heartbeat or OffsetCommit response (``api_key`` says which).

        ``member_id``, ``group_instance_id`` and ``generation_id`` are the request's;
        ``error_code`` is the response's (OffsetCommit: its first non-zero partition error, or 0).
        Kafka validates the member id and generation before answering NONE or
        REBALANCE_IN_PROGRESS, so either proves the member is in the group; UNKNOWN_MEMBER_ID
        says it is not. What REBALANCE_IN_PROGRESS says about the group depends on the API:
        SyncGroup and Heartbeat get it in PreparingRebalance, OffsetCommit only in
        CompletingRebalance (``ClassicGroup.validateOffsetCommit``; commits are accepted while
        the group prepares a rebalance).
        """
        g = self._groups.get(group_id)
        if api_key == SYNC_GROUP:
            slot = self._find(g, member_id, group_instance_id) if g is not None else None
            if g is not None and slot is not None:
                if slot.sync_sent_at is not None and error_code in _SYNC_ANSWERS:
                    slot.last_seen = max(slot.last_seen, now)  # its session restarts with the answer
                slot.sync_sent_at = None
                self._note(g, slot)
        elif api_key == OFFSET_COMMIT:
            if generation_id is not None and generation_id < 0:
                return  # a commit from outside group management (validateOffsetCommit)
        elif api_key != HEARTBEAT:
            raise ValueError(f"on_member_response takes SyncGroup, Heartbeat or OffsetCommit, not API key {api_key}")
        if not member_id:
            return  # e.g. a standalone consumer's commit: not a group member
        if error_code == _NONE:
            g = self._learn(group_id, g, member_id, group_instance_id, now, True)
            if api_key == SYNC_GROUP and g.kind is _CLASSIC:
                if generation_id is not None and generation_id > g.generation:
                    self._new_generation(g, generation_id)  # its join phase completed unseen
                g.fire(_Ev.SYNC_COMPLETED)
                g.rebalance_cause = 0
        elif error_code == _REBALANCE_IN_PROGRESS:
            # Kafka restarts the session of a heartbeat so answered, not of a sync or commit
            g = self._learn(group_id, g, member_id, group_instance_id, now, api_key == HEARTBEAT)
            if api_key != OFFSET_COMMIT:
                if generation_id is None or generation_id >= g.generation:
                    self._begin_rebalance(g)
            elif g.kind is _CLASSIC and generation_id is not None and generation_id > g.generation:
                # a commit is so answered only in CompletingRebalance: news for a generation not seen yet
                self._new_generation(g, generation_id)
        elif g is None:
            return
        else:
            self._touch_group(group_id, g, now)
            if error_code == _UNKNOWN_MEMBER_ID:
                # by member id only: a static member's new incarnation keeps the instance's slot
                slot = self._find(g, member_id, None)
                if slot is not None:
                    self._drop(g, slot)
                    self._after_removal(g, rebalance=False)
        self._schedule(group_id, g)

    def on_leave_group(self, group_id: str, members: Iterable[tuple[str, str | None]], now: float) -> int:
        """Members that left (LeaveGroup response entries with error 0); returns how many were tracked."""
        g = self._groups.get(group_id)
        if g is None:
            return 0
        removed = 0
        for member_id, instance_id in members:
            if member_id in g.pending:
                del g.pending[member_id]
            slot = self._find(g, member_id, instance_id)
            if slot is not None:
                self._drop(g, slot)
                removed += 1
        if removed:
            self._after_removal(g, rebalance=True)
        self._touch_group(group_id, g, now)
        self._schedule(group_id, g)
        return removed

    # -- KIP-848 consumer protocol ---------------------------------------------------------------

    def on_consumer_heartbeat_request(
        self,
        group_id: str,
        member_id: str,
        member_epoch: int,
        instance_id: str | None,
        now: float,
    ) -> Admission:
        """Decide on a ConsumerGroupHeartbeat: (decision, ticket), as ``on_join_request``.

        Only joins (epoch 0) can be refused or throttled, and only joins get a ticket (pass it
        to ``on_consumer_heartbeat_response``); any other heartbeat is (None, None).
        """
        g = self._groups.get(group_id)
        if member_epoch != JOIN_EPOCH:
            if g is not None:
                self._touch_group(group_id, g, now)
                slot = self._find(g, member_id, instance_id)
                if slot is not None:
                    slot.last_seen = max(slot.last_seen, now)
            return _FORWARD
        if g is None:
            g = self._create(group_id, _CONSUMER, now)
        if g.kind is _CLASSIC:
            g.kind = _CONSUMER
            g.fire(_Ev.UPGRADED_TO_CONSUMER)
            g.settle_consumer_state()
        self._touch_group(group_id, g, now)
        slot = self._find(g, member_id, instance_id)
        decision = self._consumer_refusal(g, slot, group_id, member_id)
        if decision is None:
            decision = self._take_token(g, group_id, member_id, now)
        if decision is not None and self.mode is _ENFORCE:
            return Admission(decision, None)
        ticket = next(self._tickets)
        session_s = self.config.consumer_session_timeout_seconds
        if slot is None:
            if instance_id is not None:
                key = _static_key(instance_id)
            elif member_id:
                key = _member_key(member_id)
            else:
                key = _ticket_key(ticket)
            slot = _Slot(key, member_id or None, instance_id, now, now, session_s, 0.0, now, created_ticket=ticket)
            self._add(g, slot)
        else:
            slot.last_seen = max(slot.last_seen, now)
            slot.session_s = session_s
        slot.prior = _BeforeJoin.of(slot)
        slot.ticket = ticket
        slot.join_sent_at = now
        self._set_awaiting(g, slot, True)
        g.fire(_Ev.MEMBER_ADDED)  # KIP-848 has no join phase: the coordinator adds the member at once
        self._schedule(group_id, g)
        return Admission(decision, ticket)

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
    ) -> None:
        """A ConsumerGroupHeartbeat response; ``member_id`` is the request's, ``member_epoch`` the response's."""
        g = self._groups.get(group_id)
        if g is None:
            if error_code != _NONE or member_epoch < 0:
                return
            g = self._create(group_id, _CONSUMER, now)
        self._touch_group(group_id, g, now)
        slot = g.slots.get(_ticket_key(ticket)) if ticket is not None else None
        if slot is None:
            slot = self._find(g, member_id, instance_id)
        stale = ticket is not None and slot is not None and slot.ticket != ticket
        if stale and error_code != _NONE:
            slot = None
        if error_code == _NONE:
            if member_epoch == LEAVE_EPOCH:
                if slot is not None:
                    self._drop(g, slot)
                    self._after_removal(g, rebalance=False)
            elif member_epoch == STATIC_LEAVE_EPOCH:
                # Kafka keeps a static member that left until its session times out.
                if slot is not None:
                    self._set_awaiting(g, slot, False)
                    slot.last_seen = max(slot.last_seen, now)
            else:
                new_id = assigned_member_id or member_id
                if new_id:
                    session_s = self.config.consumer_session_timeout_seconds
                    self._confirm(g, slot, new_id, instance_id, now, session_s, still_awaiting=stale)
                if g.kind is _CONSUMER:
                    g.settle_consumer_state()
        elif slot is not None:
            if error_code in _JOIN_REMOVED:
                self._drop(g, slot)
                self._after_removal(g, rebalance=False)
            elif ticket is not None and slot.awaiting:
                self._undo_join(g, slot)  # a join that failed; other heartbeat errors leave members be
        self._schedule(group_id, g)

    # -- joins whose answer never comes ---------------------------------------------------------------

    def on_join_unanswered(self, group_id: str, member_id: str, group_instance_id: str | None, ticket: int) -> None:
        """The connection of a join (JoinGroup, or a ConsumerGroupHeartbeat with epoch 0) ended
        before its answer came: whether or not it reached the coordinator, its client will never
        learn its member id or generation, so it holds no slot.

        ``member_id`` and ``group_instance_id`` are the request's, ``ticket`` the one
        ``on_join_request`` / ``on_consumer_heartbeat_request`` gave it. Only the member's newest
        join, still unanswered, is undone: a slot this join created goes, a known member goes back
        to what it was before (a static member keeps its slot until its session ends, as in
        Kafka). A join that did reach the coordinator may have made a member there: the group is
        recounted at the coordinator before its next join (``needs_reconcile``), which counts that
        member if the coordinator has it.
        """
        g = self._groups.get(group_id)
        if g is None:
            return
        slot = g.slots.get(_ticket_key(ticket)) or self._find(g, member_id, group_instance_id)
        if slot is None:
            return
        if slot.ticket != ticket:
            # Superseded by a newer join of the same member, still in flight. If that one is undone
            # too, the member must not go back to awaiting this dead one.
            if slot.prior is not None and slot.prior.ticket == ticket and slot.prior.awaiting:
                if slot.created_ticket == ticket:
                    slot.created_ticket = slot.ticket  # the slot now stands on the newer join alone
                slot.prior = slot.prior._replace(awaiting=False)
            return
        if not slot.awaiting:
            return  # answered
        self._undo_join(g, slot)
        g.reconciled_at = None
        self._schedule(group_id, g)

    # -- reconciliation ------------------------------------------------------------------------------

    def observe_group_size(
        self,
        group_id: str,
        members: Iterable[tuple[str, str | None]] | int,
        now: float,
        *,
        state: str | GroupState | None = None,
        kind: GroupKind | None = None,
        sent_at: float | None = None,
    ) -> None:
        """Apply the coordinator's view of a group (DescribeGroups / ConsumerGroupDescribe).

        ``members`` is the list of (member_id, group_instance_id) pairs, or only a count (a count
        can only raise the estimate). ``sent_at`` is when the describe request was sent: tracked
        members that joined after it are kept even if the answer does not list them.
        """
        state_value: GroupState | None
        if isinstance(state, str):
            name = state.replace("_", "").replace(" ", "").lower()
            state_value = _STATE_NAMES.get(name)
            if kind is None and name in _CONSUMER_STATE_NAMES:
                kind = _CONSUMER
        else:
            state_value = state
        if state_value is GroupState.DEAD:
            self.forget_group(group_id)
            return
        g = self._groups.get(group_id)
        if g is None:
            g = self._create(group_id, kind or _CLASSIC, now)
        elif kind is not None:
            g.kind = kind
        self._touch_group(group_id, g, now)
        if isinstance(members, int):
            g.phantom = max(0, members - len(g.slots))
        else:
            cutoff = now if sent_at is None else sent_at
            joins_cutoff = cutoff - self.config.join_transit_seconds
            self._reconcile_members(g, members, now, cutoff=cutoff, joins_cutoff=joins_cutoff)
        if g.kind is _CONSUMER:
            # ConsumerGroupDescribe's assigning / reconciling are Stable for counting
            g.fire(_Ev.DESCRIBED_STABLE if g.size else _Ev.DESCRIBED_EMPTY)
        else:
            if state_value is not None:
                g.fire(_DESCRIBED[state_value])
            if g.size == 0:
                g.fire(_Ev.GROUP_EMPTIED)
            elif g.state is _E:
                # members that joined after the describe was sent: joins in flight rebalance it again
                g.fire(_Ev.JOIN_STARTS_REBALANCE if g.n_awaiting else _Ev.MEMBER_ADDED)
        g.reconciled_at = now
        g.reconcile_started_at = None
        self._schedule(group_id, g)

    def needs_reconcile(self, group_id: str, now: float) -> bool:
        """Whether the shell should ask the coordinator about this group now.

        True, with a finite cap, for a group never reconciled (first contact, e.g. after a
        restart) or within ``reconcile_margin`` of its cap, at most once per
        ``reconcile_interval_seconds`` (counting from ``reconcile_started``); and once per
        rebalance for a full classic group rebalancing with no member awaiting join.
        """
        g = self._groups.get(group_id)
        if g is None:
            return False
        cap = self._cap(g)
        if cap >= INT_MAX:
            return False
        if g.kind is _CLASSIC and g.state is _P and not g.n_awaiting and g.size >= cap and not g.rebalance_asked:
            # Only members awaiting join count in a join phase, so any join would be admitted. The phase is
            # the proxy's reading of answers that may be stale, and a coordinator that ran none (Tansu
            # answers rejoins with the old generation, after REBALANCE_IN_PROGRESS too) is not rebalancing.
            return True
        interval = self.config.reconcile_interval_seconds
        if g.reconcile_started_at is not None and now - g.reconcile_started_at < interval:
            return False
        if g.reconciled_at is None:
            return True
        near = max(g.size, g.counted) >= cap - self.config.reconcile_margin
        return near and now - g.reconciled_at >= interval

    def reconcile_started(self, group_id: str, now: float) -> None:
        """The shell sent a describe request for this group."""
        g = self._groups.get(group_id)
        if g is not None:
            g.reconcile_started_at = now
            g.rebalance_asked = g.state is _P

    def forget_group(self, group_id: str) -> None:
        """Drop a group (deleted, or reported Dead)."""
        self._groups.pop(group_id, None)

    # -- time --------------------------------------------------------------------------------------

    def expire(self, now: float) -> ExpiryReport:
        """Remove members whose session timed out and drop idle empty groups."""
        expired = dropped = 0
        while self._timers and self._timers[0][0] < now:
            deadline, _, group_id = heapq.heappop(self._timers)
            g = self._groups.get(group_id)
            if g is None or g.scheduled != deadline:
                continue
            g.scheduled = None
            removed = 0
            for slot in list(g.slots.values()):
                if now > slot.deadline():
                    self._drop(g, slot)
                    removed += 1
            if removed:
                expired += removed
                self._after_removal(g, rebalance=True)
            for member_id, until in list(g.pending.items()):
                if now > until:
                    del g.pending[member_id]
            g.hint = min((s.deadline() for s in g.slots.values()), default=math.inf)
            if g.pending:
                g.hint = min(g.hint, min(g.pending.values()))
            if g.idle and now > g.last_activity + self.config.idle_group_seconds:
                del self._groups[group_id]
                dropped += 1
                continue
            self._schedule(group_id, g)
        if len(self._timers) > 4 * len(self._groups) + 1024:
            self._rebuild_timers()
        return ExpiryReport(expired, dropped)

    # ============================================================================================
    # internals

    def _cap(self, g: _Group) -> int:
        if g.kind is _CONSUMER:
            return self.config.group_consumer_max_size
        return self.config.group_max_size

    def _default_session(self, g: _Group) -> float:
        if g.kind is _CONSUMER:
            return self.config.consumer_session_timeout_seconds
        return self.config.default_session_timeout_seconds

    def _default_rebalance(self, g: _Group) -> float:
        if g.kind is _CONSUMER:
            return 0.0
        return min(self.config.default_rebalance_timeout_seconds, self.config.max_session_timeout_seconds)

    def _session_timeout(self, ms: int | None, default: float) -> float:
        """A JoinGroup's session timeout, within group.min/max.session.timeout.ms. The coordinator
        answers a join outside them INVALID_SESSION_TIMEOUT (its slot then goes with the answer);
        clamped, a join's own numbers cannot make its slot outlive what Kafka allows a member."""
        if ms is None:
            return default
        config = self.config
        return min(max(ms / 1000.0, config.min_session_timeout_seconds), config.max_session_timeout_seconds)

    def _rebalance_timeout(self, ms: int | None, session_s: float) -> float:
        """A JoinGroup's rebalance timeout (how long the coordinator may hold it), at most
        group.max.session.timeout.ms. Kafka bounds it by no broker property (max.poll.interval.ms
        is the client's), so the proxy takes the bound the operator already sets on how long the
        coordinator waits for a member: a join held longer loses its slot here, and its answer,
        when it comes, gives the member back (``on_join_response`` learns members it names)."""
        config = self.config
        seconds = max(session_s, config.default_rebalance_timeout_seconds) if ms is None else max(0.0, ms / 1000.0)
        return min(seconds, config.max_session_timeout_seconds)

    def _create(self, group_id: str, kind: GroupKind, now: float) -> _Group:
        rate = self.config.join_rate_per_minute
        g = _Group(kind, now, float(max(rate, 0)), now)
        self._groups[group_id] = g
        while len(self._groups) > self.config.max_groups:
            self._groups.popitem(last=False)
        return g

    def _touch_group(self, group_id: str, g: _Group, now: float) -> None:
        g.last_activity = max(g.last_activity, now)
        self._groups.move_to_end(group_id)

    def _schedule(self, group_id: str, g: _Group) -> None:
        """Make sure a timer fires no later than the group's earliest deadline.

        Deadlines only move later except where ``_note`` records them, so the timer already
        queued (``scheduled``) plus the noted ``hint`` bound them all; ``expire`` rescans.
        """
        deadline, g.hint = g.hint, math.inf
        if g.idle:
            deadline = min(deadline, g.last_activity + self.config.idle_group_seconds)
        if deadline == math.inf:
            return
        if g.scheduled is None or deadline < g.scheduled:
            g.scheduled = deadline
            heapq.heappush(self._timers, (deadline, next(self._seq), group_id))

    def _rebuild_timers(self) -> None:
        self._timers = [
            (g.scheduled, next(self._seq), gid) for gid, g in self._groups.items() if g.scheduled is not None
        ]
        heapq.heapify(self._timers)

    # -- decisions --------------------------------------------------------------------------------

    def _refuse(self, limit_key: str, cap: int, reason: str, group_id: str, member_id: str) -> Decision:
        return Decision(
            policy=_GROUP_SIZE,
            action=_REFUSE,
            mode=self.mode,
            limit_key=limit_key,
            reason=reason,
            limit=cap,
            error_code=_GROUP_MAX_SIZE_REACHED,
            subject={"group_id": group_id, "member_id": member_id},
        )

    def _classic_refusal(
        self, g: _Group, slot: _Slot | None, group_id: str, member_id: str, *, known: bool
    ) -> Decision | None:
        """``slot`` is the member's place if it has one (by member or instance id); ``known``
        says whether the request named it by its member id (Kafka's ``group.hasMember``)."""
        cap = self.config.group_max_size
        state = g.state
        if state is _E or state is GroupState.DEAD:
            return None
        if state is _P:
            if known and slot is not None and slot.awaiting:
                return None
            if slot is not None and slot.instance_id is not None:
                if g.n_awaiting < cap:
                    return None
            elif g.counted < cap:
                return None
            reason = f"{GROUP_MAX_SIZE}={cap} reached: {g.counted} members rejoining while the group rebalances"
            return self._refuse(GROUP_MAX_SIZE, cap, reason, group_id, member_id)
        if known or g.size < cap:
            return None
        reason = f"{GROUP_MAX_SIZE}={cap} reached: the group has {g.size} members"
        return self._refuse(GROUP_MAX_SIZE, cap, reason, group_id, member_id)

    def _consumer_refusal(self, g: _Group, slot: _Slot | None, group_id: str, member_id: str) -> Decision | None:
        cap = self.config.group_consumer_max_size
        if slot is not None or g.size < cap:
            return None
        reason = f"The consumer group has reached its maximum capacity of {cap} members."
        return self._refuse(GROUP_CONSUMER_MAX_SIZE, cap, reason, group_id, member_id)

    def _take_token(self, g: _Group, group_id: str, member_id: str, now: float) -> Decision | None:
        rate = self.config.join_rate_per_minute
        if rate < 0:
            return None
        per_second = rate / 60.0
        if now > g.tokens_at:
            g.tokens = min(float(rate), g.tokens + (now - g.tokens_at) * per_second)
            g.tokens_at = now
        if g.tokens >= 1.0:
            g.tokens -= 1.0
            return None
        wait_ms = math.ceil((1.0 - g.tokens) / per_second * 1000.0)
        return Decision(
            policy=_GROUP_SIZE,
            action=Action.THROTTLE,
            mode=self.mode,
            limit_key=GROUP_JOIN_RATE_PER_MINUTE,
            reason=f"{GROUP_JOIN_RATE_PER_MINUTE}={rate} exceeded",
            limit=rate,
            error_code=ErrorCode.coordinator_load_in_progress,
            throttle_ms=min(max(wait_ms, 1), INT_MAX),
            subject={"group_id": group_id, "member_id": member_id},
        )

    # -- slots ------------------------------------------------------------------------------------

    def _find(self, g: _Group, member_id: str, instance_id: str | None) -> _Slot | None:
        if instance_id is not None:
            slot = g.slots.get(_static_key(instance_id))
            if slot is not None:
                return slot
        if member_id:
            key = g.by_member.get(member_id)
            if key is not None:
                return g.slots[key]
        return None

    @staticmethod
    def _note(g: _Group, slot: _Slot) -> None:
        g.hint = min(g.hint, slot.deadline())

    def _add(self, g: _Group, slot: _Slot) -> None:
        self._note(g, slot)
        g.slots[slot.key] = slot
        if slot.member_id is not None:
            g.by_member[slot.member_id] = slot.key
        if slot.instance_id is not None and not slot.awaiting:
            g.n_static_idle += 1
        if slot.awaiting:
            g.n_awaiting += 1

    def _drop(self, g: _Group, slot: _Slot) -> None:
        if g.slots.get(slot.key) is not slot:
            return
        del g.slots[slot.key]
        if slot.member_id is not None and g.by_member.get(slot.member_id) == slot.key:
            del g.by_member[slot.member_id]
        if slot.awaiting:
            g.n_awaiting -= 1
        elif slot.instance_id is not None:
            g.n_static_idle -= 1

    def _set_awaiting(self, g: _Group, slot: _Slot, awaiting: bool) -> None:
        if slot.awaiting != awaiting and g.slots.get(slot.key) is slot:
            step = 1 if awaiting else -1
            g.n_awaiting += step
            if slot.instance_id is not None:
                g.n_static_idle -= step
        slot.awaiting = awaiting
        self._note(g, slot)

    def _rekey(self, g: _Group, slot: _Slot, member_id: str, instance_id: str | None) -> _Slot:
        """Give a slot its coordinator-assigned member id (and instance id, if learnt)."""
        iid = instance_id if instance_id is not None else slot.instance_id
        key = _static_key(iid) if iid is not None else _member_key(member_id)
        if slot.key == key and slot.member_id == member_id:
            return slot
        other = g.slots.get(key)
        if other is None and member_id in g.by_member:
            other = g.slots.get(g.by_member[member_id])
        self._drop(g, slot)
        if other is not None and other is not slot:
            self._drop(g, other)
            slot.created_at = min(slot.created_at, other.created_at)
        if slot.member_id is not None and g.leader == slot.member_id:
            g.leader = member_id  # a static leader replaced by its new incarnation
        slot.key, slot.member_id, slot.instance_id = key, member_id, iid
        self._add(g, slot)
        return slot

    def _new_slot(self, g: _Group, member_id: str, instance_id: str | None, now: float, session_s: float) -> _Slot:
        """A member the coordinator named that the policy did not track."""
        key = _static_key(instance_id) if instance_id is not None else _member_key(member_id)
        slot = _Slot(key, member_id, instance_id, now, now, session_s, self._default_rebalance(g), now)
        self._add(g, slot)
        return slot

    def _confirm(
        self,
        g: _Group,
        slot: _Slot | None,
        member_id: str,
        instance_id: str | None,
        now: float,
        session_s: float,
        *,
        still_awaiting: bool = False,
        touch: bool = True,
    ) -> _Slot:
        if slot is None:
            slot = self._find(g, member_id, instance_id)
        if slot is None:
            slot = self._new_slot(g, member_id, instance_id, now, session_s)
            if g.phantom:
                g.phantom -= 1
        else:
            touch = touch or slot.member_id != member_id  # a new incarnation starts its session
            slot = self._rekey(g, slot, member_id, instance_id)
        slot.session_s = session_s
        if touch:
            slot.last_seen = max(slot.last_seen, now)
        self._set_awaiting(g, slot, still_awaiting)
        return slot

    def _learn(
        self, group_id: str, g: _Group | None, member_id: str, instance_id: str | None, now: float, alive: bool
    ) -> _Group:
        """A response that proves ``member_id`` is in the group; ``alive``: its session restarts."""
        if g is None:
            g = self._create(group_id, _CLASSIC, now)
        self._touch_group(group_id, g, now)
        slot = self._find(g, member_id, instance_id)
        if slot is None:
            self._new_slot(g, member_id, instance_id, now, self._default_session(g))
            if g.phantom:
                g.phantom -= 1
            g.fire(_Ev.MEMBER_ADDED)
        elif alive:
            slot.last_seen = max(slot.last_seen, now)
        return g

    def _undo_join(self, g: _Group, slot: _Slot, *, drop: bool = False) -> None:
        """The newest join of this slot had no effect at the coordinator (``drop``: and the
        coordinator does not have the member either)."""
        failed = slot.ticket
        if drop or slot.created_ticket == failed:
            self._drop(g, slot)
        else:
            before = slot.prior
            if before is None:  # no join of it was seen: nothing to put back
                self._set_awaiting(g, slot, False)
            else:
                slot.ticket, slot.session_s, slot.rebalance_s = before.ticket, before.session_s, before.rebalance_s
                slot.join_sent_at, slot.protocols = before.join_sent_at, before.protocols
                self._set_awaiting(g, slot, before.awaiting)
        if g.rebalance_cause == failed and g.state is _P:
            g.fire(_Ev.STARTING_JOIN_FAILED)
            g.rebalance_cause = 0
        self._after_removal(g, rebalance=False)

    def _add_pending(self, g: _Group, member_id: str, until: float) -> None:
        g.pending.pop(member_id, None)
        g.pending[member_id] = until
        g.hint = min(g.hint, until)
        while len(g.pending) > _MAX_PENDING_PER_GROUP:
            del g.pending[next(iter(g.pending))]

    # -- classic protocol: what the coordinator does -------------------------------------------------

    def _apply_classic_join(
        self,
        g: _Group,
        slot: _Slot | None,
        member_id: str,
        instance_id: str | None,
        now: float,
        session_s: float,
        rebalance_s: float,
        require_known_member_id: bool,
        protocols: object,
        ticket: int,
    ) -> None:
        """What the coordinator does with an admitted JoinGroup (GroupCoordinator.handleJoinGroup)."""
        if slot is None:
            if not member_id and instance_id is None and require_known_member_id:
                return  # KIP-394 first round: the coordinator only hands out a pending member id
            g.pending.pop(member_id, None)
            if instance_id is not None:
                key = _static_key(instance_id)
            elif member_id:
                key = _member_key(member_id)
            else:
                key = _ticket_key(ticket)
            slot = _Slot(key, member_id or None, instance_id, now, now, session_s, rebalance_s, now, ticket, ticket)
            slot.protocols = protocols
            self._add(g, slot)
            rebalance = True  # addMemberAndRebalance
        else:
            changed = protocols is not None and slot.protocols is not None and protocols != slot.protocols
            if g.state is _S:
                # a rejoining leader or changed metadata forces a rebalance; a static member
                # replacing itself (no member id) does not
                is_leader = bool(member_id) and member_id == slot.member_id == g.leader
                rebalance = is_leader or changed
            elif g.state is _C:
                # unchanged metadata gets the current generation back, but a static member
                # replacing itself does force a rebalance (updateStaticMemberAndRebalance)
                rebalance = changed or not member_id
            else:
                rebalance = True
            if instance_id is not None and slot.instance_id is None:
                slot = self._rekey(g, slot, slot.member_id or member_id, instance_id)
            slot.prior = _BeforeJoin.of(slot)
            if protocols is not None:
                slot.protocols = protocols
            slot.session_s, slot.rebalance_s, slot.join_sent_at = session_s, rebalance_s, now
            slot.ticket = ticket
        self._set_awaiting(g, slot, True)
        if g.kind is _CONSUMER:
            g.fire(_Ev.MEMBER_ADDED)  # a classic member of a KIP-848 group: no join phase
            return
        # A join that fails before reaching the coordinator undoes the rebalance it started,
        # unless another join has joined that rebalance since.
        g.rebalance_cause = 0
        if rebalance:
            if g.state is not _P:
                g.rebalance_cause = ticket
            g.fire(_Ev.JOIN_STARTS_REBALANCE)

    def _classic_generation(
        self, g: _Group, slot: _Slot | None, generation_id: int, leader_id: str | None, now: float
    ) -> None:
        if generation_id > g.generation:
            # The join phase completed: Kafka drops the dynamic members that did not rejoin.
            # Every remaining member's session restarts then (rescheduleHeartbeat).
            self._new_generation(g, generation_id)
            for other in list(g.slots.values()):
                if other is not slot and not other.awaiting and other.instance_id is None:
                    self._drop(g, other)
                else:
                    other.last_seen = max(other.last_seen, now)
            if g.size == 0:
                g.fire(_Ev.GROUP_EMPTIED)
        if leader_id and generation_id >= g.generation:
            g.leader = leader_id

    @staticmethod
    def _new_generation(g: _Group, generation_id: int) -> None:
        g.generation = generation_id
        g.fire(_Ev.JOIN_PHASE_COMPLETED)
        g.rebalance_cause = 0

    @staticmethod
    def _begin_rebalance(g: _Group) -> None:
        g.rebalance_cause = 0  # the coordinator says so: no join can undo it
        if g.kind is _CLASSIC:
            g.fire(_Ev.REBALANCE_ANSWERED)

    def _after_removal(self, g: _Group, *, rebalance: bool) -> None:
        if g.kind is _CONSUMER:
            g.settle_consumer_state()
        elif g.size == 0:
            g.fire(_Ev.GROUP_EMPTIED)
        elif rebalance:
            g.rebalance_cause = 0
            g.fire(_Ev.MEMBER_REMOVED)

    def _reconcile_members(
        self,
        g: _Group,
        members: Iterable[tuple[str, str | None]],
        now: float,
        *,
        cutoff: float,
        joins_cutoff: float = -math.inf,
    ) -> None:
        """Make the tracked members those listed; members newer than ``cutoff`` stay, and so do
        joins in flight forwarded after ``joins_cutoff`` (older ones the coordinator would list)."""
        listed = list(members)
        listed_members = {mid for mid, _ in listed}
        listed_instances = {iid for _, iid in listed if iid is not None}
        for tracked in list(g.slots.values()):
            present = (tracked.member_id is not None and tracked.member_id in listed_members) or (
                tracked.instance_id is not None and tracked.instance_id in listed_instances
            )
            if present or tracked.created_at > cutoff:
                continue
            if not tracked.awaiting:
                self._drop(g, tracked)
            elif tracked.join_sent_at <= joins_cutoff:
                self._undo_join(g, tracked, drop=True)  # a join the coordinator never had
        for member_id, instance_id in listed:
            slot = self._find(g, member_id, instance_id)
            if slot is None and member_id in g.pending:
                # Answered MEMBER_ID_REQUIRED here and not joined since: Kafka lists no such member, a
                # coordinator that does (Tansu) counts a join it has yet to see. It is counted when it
                # joins with its id; taken as a member now, that join would be a known member's, let in
                # beyond the cap without a decision.
                continue
            if slot is None:
                self._new_slot(g, member_id, instance_id, now, self._default_session(g))
            elif slot.member_id != member_id or (instance_id is not None and slot.instance_id != instance_id):
                self._rekey(g, slot, member_id, instance_id)
        g.phantom = 0
