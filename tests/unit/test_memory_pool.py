"""KIP-72 memory pool (sans-I/O): the non-strict byte budget, its FIFO of waiters,
the per-connection fair share, observe mode and depleted-time accounting."""

from __future__ import annotations

import random
from collections.abc import Hashable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from policies.decision import Action, Admission, Decision, Policy
from policies.memory_pool import UNBOUNDED, MemoryPool, validate_settings
from policies.mode import Mode
from policies.properties import (
    QUEUED_MAX_REQUEST_BYTES,
    QUEUED_MAX_REQUEST_BYTES_PER_CONNECTION,
    SOCKET_REQUEST_MAX_BYTES,
)

KIB = 1024
MIB = 1024 * KIB
POOL_DEPLETED = QUEUED_MAX_REQUEST_BYTES  # what a WAIT names when the pool itself is exhausted
CONNECTION_SHARE = QUEUED_MAX_REQUEST_BYTES_PER_CONNECTION  # ... and when the connection's share holds it back


def granted(result: Admission) -> int:
    """The ticket of a plain grant."""
    decision, ticket = result
    assert ticket is not None
    assert decision is None, decision
    return ticket


def waits(result: Admission, mode: Mode = Mode.ENFORCE) -> tuple[int, Decision]:
    """The ticket and WAIT decision of a request that waits (ENFORCE: queued; OBSERVE: granted anyway)."""
    decision, ticket = result
    assert ticket is not None
    assert decision is not None, "granted, expected a WAIT"
    assert (decision.policy, decision.action, decision.mode) == (Policy.MEMORY_POOL, Action.WAIT, mode), decision
    return ticket, decision


# -- the non-strict budget ---------------------------------------------------------


def test_a_request_larger_than_what_remains_is_granted_while_any_budget_remains() -> None:
    pool = MemoryPool(2 * MIB, 1 * MIB)
    granted(pool.reserve("a", MIB, 0.0))
    granted(pool.reserve("a", MIB - 1, 0.0))
    granted(pool.reserve("b", 1 * MIB, 0.0))
    assert pool.held("b") == MIB
    assert pool.used == 3 * MIB - 1
    assert pool.available == -(MIB - 1)


def test_an_exhausted_pool_queues_the_request() -> None:
    pool = MemoryPool(2 * MIB, 1 * MIB)
    granted(pool.reserve("a", MIB, 0.0))
    granted(pool.reserve("a", MIB, 0.0))
    _, wait = waits(pool.reserve("b", 1, 0.0))
    assert wait == Decision(
        Policy.MEMORY_POOL,
        Action.WAIT,
        Mode.ENFORCE,
        QUEUED_MAX_REQUEST_BYTES,
        "queued.max.request.bytes=2097152 exhausted (2097152 bytes in use): a request of 1 bytes waits for memory",
        limit=2 * MIB,
        subject={"size": 1, "used": 2 * MIB, "capacity": 2 * MIB},
    )
    assert pool.waiting == 1 and pool.held("b") == 0
    assert pool.cancel("b", 1.0) == [] and pool.waiting == 0  # the wait was b's


@given(st.lists(st.integers(min_value=1, max_value=MIB), max_size=60), st.randoms(use_true_random=False))
def test_used_never_exceeds_pool_plus_largest_request_under_any_sequence(sizes: list[int], rnd: random.Random) -> None:
    pool = MemoryPool(2 * MIB, 1 * MIB)
    held: list[int] = []
    for i, size in enumerate(sizes):
        decision, ticket = pool.reserve(i % 5, size, float(i))
        if decision is None:
            held.append(ticket)
        if held and rnd.random() < 0.4:
            held.extend(pool.release(held.pop(rnd.randrange(len(held))), float(i)))
        assert pool.used <= 3 * MIB - 1
    assert pool.high_water_mark <= 3 * MIB - 1


def test_a_large_request_waiting_behind_small_ones_is_granted_before_later_small_ones() -> None:
    pool = MemoryPool(2 * MIB, 1 * MIB)
    smalls = [granted(pool.reserve(f"s{i}", 512 * KIB, 0.0)) for i in range(4)]
    assert pool.available == 0
    big, _ = waits(pool.reserve("big", MIB, 1.0))
    later = [waits(pool.reserve(f"late{i}", KIB, 2.0))[0] for i in range(3)]

    # One small request finishes: 512 KiB free, less than the big one needs,
    # but the big one is at the head of the queue and the pool is non-strict.
    assert pool.release(smalls[0], 3.0) == [big]
    assert pool.held("big") == MIB
    assert pool.used == 2 * MIB + 512 * KIB
    assert pool.waiting == 3

    # The later small ones keep their FIFO order once the pool has room again.
    woken = pool.release(smalls[1], 4.0) + pool.release(smalls[2], 4.0)
    woken += pool.release(big, 5.0)
    assert woken == later


def test_a_new_request_does_not_jump_ahead_of_waiters_while_the_pool_is_depleted() -> None:
    pool = MemoryPool(2 * MIB, 1 * MIB)
    first = granted(pool.reserve("a", MIB, 0.0))
    second = granted(pool.reserve("a", MIB, 0.0))
    big, _ = waits(pool.reserve("big", MIB, 0.0))
    small, _ = waits(pool.reserve("small", KIB, 0.0))
    assert pool.release(first, 1.0) == [big]
    assert pool.available == 0
    newcomer, wait = waits(pool.reserve("new", KIB, 1.0))
    assert wait.limit_key == POOL_DEPLETED
    assert pool.release(second, 2.0) == [small, newcomer]


@pytest.mark.parametrize("size", [0, -1, MIB + 1])
def test_a_request_size_outside_one_to_socket_request_max_bytes_is_a_programming_error(size: int) -> None:
    pool = MemoryPool(2 * MIB, 1 * MIB)
    with pytest.raises(ValueError, match=SOCKET_REQUEST_MAX_BYTES):
        pool.reserve("a", size, 0.0)


# -- tickets -----------------------------------------------------------------------


def test_releasing_a_ticket_twice_raises() -> None:
    pool = MemoryPool(2 * MIB, 1 * MIB)
    ticket = granted(pool.reserve("a", KIB, 0.0))
    pool.release(ticket, 1.0)
    with pytest.raises(ValueError, match="not outstanding"):
        pool.release(ticket, 2.0)
    assert pool.used == 0


def test_releasing_a_ticket_never_issued_raises() -> None:
    with pytest.raises(ValueError, match="not outstanding"):
        MemoryPool(2 * MIB, 1 * MIB).release(42, 0.0)


def test_a_waiter_is_granted_under_the_ticket_its_wait_named() -> None:
    pool = MemoryPool(2 * MIB, 1 * MIB)
    first = granted(pool.reserve("a", MIB, 0.0))
    second = granted(pool.reserve("a", MIB, 0.0))
    wait, _ = waits(pool.reserve("b", KIB, 0.0))
    assert len({first, second, wait}) == 3
    assert pool.held("b") == 0
    assert pool.release(first, 1.0) == [wait]
    assert pool.held("b") == KIB  # granted to b, for its size
    assert pool.release(wait, 2.0) == [] and pool.held("b") == 0


def test_releasing_a_queued_ticket_withdraws_the_wait() -> None:
    pool = MemoryPool(2 * MIB, 1 * MIB)
    first = granted(pool.reserve("a", MIB, 0.0))
    second = granted(pool.reserve("a", MIB, 0.0))
    wait, _ = waits(pool.reserve("b", KIB, 0.0))
    assert pool.release(wait, 1.0) == []
    assert pool.waiting == 0
    assert pool.release(first, 2.0) == []
    assert pool.release(second, 2.0) == []
    assert pool.used == 0


# -- disconnects -------------------------------------------------------------------


def test_a_disconnect_returns_all_its_bytes_and_the_pool_is_full_again() -> None:
    pool = MemoryPool(2 * MIB, 1 * MIB)
    tickets = [granted(pool.reserve("a", 700 * KIB, 0.0)) for _ in range(3)]
    waits(pool.reserve("a", MIB, 0.0))
    assert pool.held("a") == 2100 * KIB and pool.waiting == 1
    assert pool.cancel("a", 1.0) == []
    assert (pool.used, pool.available, pool.waiting, pool.held("a")) == (0, 2 * MIB, 0, 0)
    with pytest.raises(ValueError):
        pool.release(tickets[0], 2.0)


def test_a_disconnect_grants_the_waiters_of_other_connections() -> None:
    pool = MemoryPool(2 * MIB, 1 * MIB)
    granted(pool.reserve("a", MIB, 0.0))
    granted(pool.reserve("a", MIB, 0.0))
    b, _ = waits(pool.reserve("b", MIB, 0.0))
    c, _ = waits(pool.reserve("c", MIB, 0.0))
    assert pool.cancel("a", 1.0) == [b, c]
    assert pool.used == 2 * MIB


def test_cancelling_an_unknown_connection_changes_nothing() -> None:
    pool = MemoryPool(2 * MIB, 1 * MIB)
    assert pool.cancel("nobody", 0.0) == []
    assert pool.used == 0


# -- off -----------------------------------------------------------------------------


@pytest.mark.parametrize("capacity", [-1, 0])
def test_an_off_pool_grants_everything_and_still_counts(capacity: int) -> None:
    pool = MemoryPool(capacity, MIB)
    assert not pool.enabled
    grants = [granted(pool.reserve(i % 3, MIB, 0.0)) for i in range(100)]  # none waits, none would
    assert (pool.used, pool.high_water_mark, pool.waiting, pool.available) == (100 * MIB, 100 * MIB, 0, UNBOUNDED)
    assert pool.depleted_seconds(10.0) == 0.0
    for ticket in grants:
        assert pool.release(ticket, 1.0) == []
    assert pool.used == 0


# -- validation ------------------------------------------------------------------------


@pytest.mark.parametrize("capacity", [1, MIB, 100 * MIB - 1])
def test_a_pool_smaller_than_the_largest_request_is_refused_naming_both_keys(capacity: int) -> None:
    with pytest.raises(ValueError) as info:
        MemoryPool(capacity, 100 * MIB)
    assert QUEUED_MAX_REQUEST_BYTES in str(info.value)
    assert SOCKET_REQUEST_MAX_BYTES in str(info.value)


@pytest.mark.parametrize("capacity", [-1, 0, 100 * MIB, 500 * MIB])
def test_off_or_at_least_the_largest_request_is_valid(capacity: int) -> None:
    validate_settings(capacity, 100 * MIB)


def test_a_per_connection_share_without_a_pool_is_refused() -> None:
    with pytest.raises(ValueError, match=QUEUED_MAX_REQUEST_BYTES_PER_CONNECTION):
        MemoryPool(-1, MIB, per_connection=MIB)


def test_a_non_positive_largest_request_is_refused() -> None:
    with pytest.raises(ValueError, match=SOCKET_REQUEST_MAX_BYTES):
        MemoryPool(-1, 0)


# -- fair share ------------------------------------------------------------------------


def test_a_connection_cannot_hold_more_than_its_share_while_the_pool_has_room() -> None:
    pool = MemoryPool(4 * MIB, MIB, per_connection=MIB)
    granted(pool.reserve("greedy", 600 * KIB, 0.0))
    _, wait = waits(pool.reserve("greedy", 600 * KIB, 0.0))
    assert wait.limit_key == CONNECTION_SHARE and wait.limit == MIB
    assert wait.reason == (
        "queued.max.request.bytes.per.connection=1048576: the connection holds 614400 bytes; "
        "a request of 614400 bytes waits for them"
    )
    assert wait.subject == {"size": 600 * KIB, "used": 600 * KIB, "capacity": 4 * MIB}
    assert pool.held("greedy") == 600 * KIB
    # Another connection is not held up behind it.
    granted(pool.reserve("other", MIB, 0.0))


def test_a_share_limited_waiter_does_not_block_waiters_behind_it() -> None:
    pool = MemoryPool(2 * MIB, MIB, per_connection=MIB)
    g1 = granted(pool.reserve("greedy", 800 * KIB, 0.0))
    filler = granted(pool.reserve("filler", MIB, 0.0))
    granted(pool.reserve("filler2", 224 * KIB, 0.0))
    assert pool.available == 0
    greedy_wait, _ = waits(pool.reserve("greedy", 800 * KIB, 0.0))
    other_wait, _ = waits(pool.reserve("other", 512 * KIB, 0.0))
    # The pool has room again; "greedy" is still over its share, "other" goes first.
    assert pool.release(filler, 1.0) == [other_wait]
    assert pool.waiting == 1
    # Once "greedy" gives its first request back, its queued one is granted.
    assert pool.release(g1, 2.0) == [greedy_wait]


def test_a_connections_later_request_stays_behind_its_own_queued_one() -> None:
    pool = MemoryPool(4 * MIB, MIB, per_connection=MIB)
    granted(pool.reserve("a", 800 * KIB, 0.0))
    queued, _ = waits(pool.reserve("a", 800 * KIB, 0.0))
    # 100 KiB would fit in the share, but the 800 KiB one asked first.
    later, wait = waits(pool.reserve("a", 100 * KIB, 0.0))
    assert wait.limit_key == CONNECTION_SHARE
    assert wait.reason == (
        "queued.max.request.bytes.per.connection=1048576: a request of 102400 bytes waits behind its connection's "
        "earlier one"
    )
    assert pool.release(queued, 1.0) == [later]


def test_a_connections_queued_requests_are_granted_in_its_own_order_when_the_pool_frees_up() -> None:
    pool = MemoryPool(2 * MIB, MIB, per_connection=MIB)
    granted(pool.reserve("a", 800 * KIB, 0.0))
    hog = granted(pool.reserve("hog", MIB, 0.0))
    granted(pool.reserve("hog2", 224 * KIB, 0.0))
    _, first = waits(pool.reserve("a", 800 * KIB, 0.0))  # the pool refuses it
    _, second = waits(pool.reserve("a", 100 * KIB, 0.0))
    assert first.limit_key == POOL_DEPLETED and second.limit_key == POOL_DEPLETED
    # The pool has room, "a" is over its share for the first; the second fits but stays behind it.
    assert pool.release(hog, 1.0) == []
    assert pool.waiting == 2
    assert pool.cancel("hog2", 2.0) == []
    assert pool.held("a") == 800 * KIB


def test_a_request_larger_than_the_share_is_granted_to_a_connection_holding_nothing() -> None:
    pool = MemoryPool(4 * MIB, 2 * MIB, per_connection=MIB)
    granted(pool.reserve("a", 2 * MIB, 0.0))
    assert pool.held("a") == 2 * MIB
    # Holding more than its share, even one more byte waits.
    assert waits(pool.reserve("a", 1, 0.0))[1].limit_key == CONNECTION_SHARE


def test_a_queued_request_larger_than_the_share_is_granted_once_its_connection_holds_nothing() -> None:
    pool = MemoryPool(4 * MIB, 2 * MIB, per_connection=MIB)
    first = granted(pool.reserve("a", 512 * KIB, 0.0))
    big, _ = waits(pool.reserve("a", 2 * MIB, 0.0))
    assert pool.release(first, 1.0) == [big]


def test_a_waiter_blocked_by_the_pool_blocks_the_waiters_behind_it_even_with_fairness() -> None:
    pool = MemoryPool(2 * MIB, 2 * MIB, per_connection=MIB)
    hog = granted(pool.reserve("hog", 2 * MIB, 0.0))
    big, big_wait = waits(pool.reserve("big", 2 * MIB, 0.0))
    _, small_wait = waits(pool.reserve("small", 1, 0.0))
    assert big_wait.limit_key == POOL_DEPLETED and small_wait.limit_key == POOL_DEPLETED
    assert pool.release(hog, 1.0) == [big]
    assert pool.waiting == 1


# -- observe -------------------------------------------------------------------------


def test_observe_mode_never_waits_but_reports_would_wait() -> None:
    pool = MemoryPool(2 * MIB, MIB, per_connection=MIB, mode=Mode.OBSERVE)
    first = granted(pool.reserve("a", MIB, 0.0))
    over_share, share_wait = waits(pool.reserve("a", 1, 0.0), Mode.OBSERVE)
    filler = granted(pool.reserve("b", MIB, 0.0))
    depleted, pool_wait = waits(pool.reserve("c", MIB, 0.0), Mode.OBSERVE)
    assert not share_wait.enforced and share_wait.limit_key == CONNECTION_SHARE
    assert not pool_wait.enforced and pool_wait.limit_key == POOL_DEPLETED
    assert pool_wait.subject == {"size": MIB, "used": 2 * MIB + 1, "capacity": 2 * MIB}
    assert pool.waiting == 0
    assert pool.used == 3 * MIB + 1 and pool.held("a") == MIB + 1 and pool.held("c") == MIB  # granted all the same
    for ticket in (first, over_share, filler, depleted):
        assert pool.release(ticket, 1.0) == []
    assert pool.used == 0


# -- observation windows -----------------------------------------------------------------


@pytest.mark.parametrize("capacity", [-1, 4 * MIB])
def test_the_window_high_water_mark_is_the_peak_since_the_last_reset(capacity: int) -> None:
    pool = MemoryPool(capacity, MIB)
    assert pool.reset_window_high_water_mark(0.0) == 0
    a = granted(pool.reserve("a", MIB, 1.0))
    b = granted(pool.reserve("b", MIB, 1.0))
    pool.release(a, 2.0)
    assert pool.reset_window_high_water_mark(3.0) == 2 * MIB  # the first window's peak, though 1 MiB is in use now
    assert pool.reset_window_high_water_mark(4.0) == MIB  # b was in use all through the second window
    pool.release(b, 5.0)
    c = granted(pool.reserve("c", 512 * KIB, 6.0))
    pool.release(c, 7.0)
    assert pool.reset_window_high_water_mark(8.0) == MIB  # b, until it was released
    assert pool.reset_window_high_water_mark(9.0) == 0
    assert pool.high_water_mark == 2 * MIB  # the all-time mark is not reset


# -- depleted time ---------------------------------------------------------------------


def test_depleted_time_counts_only_spells_with_nothing_available() -> None:
    pool = MemoryPool(2 * MIB, MIB)
    a = granted(pool.reserve("a", MIB, 0.0))
    assert pool.depleted_seconds(5.0) == 0.0
    b = granted(pool.reserve("b", MIB, 10.0))  # available == 0 from t=10
    assert pool.depleted_seconds(12.5) == 2.5
    pool.release(a, 13.0)  # spell ends: 3 s
    assert pool.depleted_seconds(100.0) == 3.0
    c = granted(pool.reserve("c", MIB, 20.0))  # second spell from t=20
    assert pool.depleted_seconds(21.0) == 4.0
    pool.release(b, 24.0)
    pool.release(c, 25.0)
    assert pool.depleted_seconds(30.0) == 7.0


def test_depleted_time_ignores_a_clock_that_goes_backwards() -> None:
    pool = MemoryPool(2 * MIB, MIB)
    a = granted(pool.reserve("a", MIB, 10.0))
    granted(pool.reserve("b", MIB, 10.0))
    pool.release(a, 5.0)  # earlier than seen: counts as t=10
    assert pool.depleted_seconds(50.0) == 0.0


def test_a_waiter_granted_on_release_keeps_the_depleted_spell_going() -> None:
    pool = MemoryPool(2 * MIB, MIB)
    a1 = granted(pool.reserve("a", MIB, 0.0))
    a2 = granted(pool.reserve("a", MIB, 0.0))
    waits(pool.reserve("b", MIB, 1.0))
    assert len(pool.release(a1, 4.0)) == 1  # b takes the freed MiB at once
    assert pool.available == 0
    assert pool.depleted_seconds(9.0) == 9.0
    pool.release(a2, 10.0)
    assert pool.depleted_seconds(20.0) == 10.0


# -- the model-checked state machine -----------------------------------------------------

CONNS = ["c0", "c1", "c2"]


class MemoryPoolMachine(RuleBasedStateMachine):
    """Random reserve/release/withdraw/cancel interleavings checked against a plain model."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = MemoryPool(-1, 1)
        self.now = 0.0
        self.held: dict[int, tuple[Hashable, int]] = {}  # ticket -> (conn, size)
        self.queue: list[tuple[int, Hashable, int]] = []  # FIFO of (ticket, conn, size)
        self.ever_granted: set[int] = set()
        self.ever_issued: set[int] = set()
        self.retired: list[int] = []
        self.depleted_total = 0.0
        self.spell_start: float | None = None
        self.window_peak = 0

    @initialize(
        # Small numbers so that shares, sizes and the pool collide; mostly enforce with a share.
        max_request=st.integers(min_value=1, max_value=16),
        extra=st.integers(min_value=0, max_value=32),
        off=st.sampled_from([False, False, False, True]),
        share=st.one_of(st.integers(min_value=1, max_value=32), st.just(-1)),
        mode=st.sampled_from([Mode.ENFORCE, Mode.ENFORCE, Mode.ENFORCE, Mode.OBSERVE]),
    )
    def configure(self, max_request: int, extra: int, off: bool, share: int, mode: Mode) -> None:
        capacity = -1 if off else max_request + extra
        per_connection = -1 if off else share
        self.pool = MemoryPool(capacity, max_request, per_connection, mode)

    # -- helpers

    def held_by(self, conn: Hashable) -> int:
        return sum(size for c, size in self.held.values() if c == conn)

    def expected_wakeups(self) -> list[int]:
        """The spec, written plainly: walk the FIFO; stop at the first waiter the pool refuses
        (available <= 0); skip a waiter over its connection's share, and that connection's later ones."""
        if not self.pool.enabled or self.pool.mode is Mode.OBSERVE:
            return []
        used = sum(size for _, size in self.held.values())
        held: dict[Hashable, int] = {conn: self.held_by(conn) for conn in CONNS}
        share = self.pool.per_connection
        woken: list[int] = []
        held_back: set[Hashable] = set()
        for ticket, conn, size in self.queue:
            if used >= self.pool.capacity:
                break
            if conn in held_back or (0 < share < held[conn] + size and held[conn] > 0):
                held_back.add(conn)
                continue
            woken.append(ticket)
            used += size
            held[conn] += size
        return woken

    def take(self, grants: list[int]) -> None:
        """Record grants handed out by release/cancel: they must be queued waiters, in FIFO order."""
        assert grants == self.expected_wakeups()
        positions = [next(i for i, (t, _, _) in enumerate(self.queue) if t == ticket) for ticket in grants]
        assert positions == sorted(positions), "waiters granted out of FIFO order"
        for ticket in grants:
            _, conn, size = self.queue[next(i for i, (t, _, _) in enumerate(self.queue) if t == ticket)]
            self.record_grant(ticket, conn, size)
            self.queue = [w for w in self.queue if w[0] != ticket]

    def record_grant(self, ticket: int, conn: Hashable, size: int) -> None:
        assert ticket not in self.ever_granted, "ticket granted twice"
        self.ever_granted.add(ticket)
        self.held[ticket] = (conn, size)
        self.window_peak = max(self.window_peak, sum(size for _, size in self.held.values()))

    # -- rules

    @rule(conn=st.sampled_from(CONNS), size=st.integers(min_value=1, max_value=16), dt=st.floats(0, 5))
    def reserve(self, conn: str, size: int, dt: float) -> None:
        self.now += dt
        size = min(size, self.pool.max_request)
        enforce_would_wait = self.pool.enabled and (
            self.pool.available <= 0
            or any(c == conn for _, c, _ in self.queue)
            or (0 < self.pool.per_connection < self.held_by(conn) + size and self.held_by(conn) > 0)
        )
        used = self.pool.used
        result = self.pool.reserve(conn, size, self.now)
        ticket = result.ticket
        assert ticket not in self.ever_issued
        self.ever_issued.add(ticket)
        if not enforce_would_wait:
            self.record_grant(granted(result), conn, size)
            return
        _, wait = waits(result, self.pool.mode)
        assert wait.subject == {"size": size, "used": used, "capacity": self.pool.capacity}
        if used >= self.pool.capacity:
            assert (wait.limit_key, wait.limit) == (QUEUED_MAX_REQUEST_BYTES, self.pool.capacity)
        else:
            assert (wait.limit_key, wait.limit) == (QUEUED_MAX_REQUEST_BYTES_PER_CONNECTION, self.pool.per_connection)
            assert self.pool.per_connection > 0
        if self.pool.mode is Mode.OBSERVE:
            self.record_grant(ticket, conn, size)
        else:
            self.queue.append((ticket, conn, size))

    @precondition(lambda self: bool(self.held))
    @rule(index=st.integers(min_value=0), dt=st.floats(0, 5))
    def release(self, index: int, dt: float) -> None:
        self.now += dt
        ticket = sorted(self.held)[index % len(self.held)]
        del self.held[ticket]
        self.retired.append(ticket)
        self.take(self.pool.release(ticket, self.now))

    @precondition(lambda self: bool(self.queue))
    @rule(index=st.integers(min_value=0))
    def withdraw(self, index: int) -> None:
        ticket = self.queue[index % len(self.queue)][0]
        self.queue = [w for w in self.queue if w[0] != ticket]
        self.retired.append(ticket)
        self.take(self.pool.release(ticket, self.now))

    @rule(conn=st.sampled_from(CONNS), dt=st.floats(0, 5))
    def disconnect(self, conn: str, dt: float) -> None:
        self.now += dt
        gone = [t for t, (c, _) in self.held.items() if c == conn] + [t for t, c, _ in self.queue if c == conn]
        self.held = {t: v for t, v in self.held.items() if v[0] != conn}
        self.queue = [w for w in self.queue if w[1] != conn]
        self.retired.extend(gone)
        self.take(self.pool.cancel(conn, self.now))
        assert self.pool.held(conn) == 0

    @rule(dt=st.floats(0, 5))
    def close_a_window(self, dt: float) -> None:
        self.now += dt
        assert self.pool.reset_window_high_water_mark(self.now) == self.window_peak
        self.window_peak = self.pool.used

    @precondition(lambda self: bool(self.retired))
    @rule(index=st.integers(min_value=0))
    def release_a_retired_ticket_again(self, index: int) -> None:
        with pytest.raises(ValueError):
            self.pool.release(self.retired[index % len(self.retired)], self.now)

    # -- invariants

    @invariant()
    def accounting_never_leaks(self) -> None:
        assert self.pool.used == sum(size for _, size in self.held.values())
        for conn in CONNS:
            assert self.pool.held(conn) == self.held_by(conn)
        assert self.pool.waiting == len(self.queue)
        assert self.pool.high_water_mark >= self.pool.used

    @invariant()
    def enforce_mode_stays_within_the_non_strict_bound(self) -> None:
        if self.pool.enabled and self.pool.mode is Mode.ENFORCE:
            assert self.pool.used <= self.pool.capacity + self.pool.max_request - 1
            assert self.pool.high_water_mark <= self.pool.capacity + self.pool.max_request - 1

    @invariant()
    def no_queued_waiter_could_have_been_granted(self) -> None:
        """Every waiter left in the queue is held back by the pool or by its connection's share."""
        if not self.queue:
            return
        if self.pool.available <= 0:
            return
        share = self.pool.per_connection
        held_back: set[Hashable] = set()
        for _, conn, size in self.queue:
            held = self.held_by(conn)
            assert conn in held_back or (0 < share < held + size and held > 0), "a grantable waiter was left queued"
            held_back.add(conn)

    @invariant()
    def depleted_time_matches_the_time_spent_with_nothing_available(self) -> None:
        # Runs after every step, at the step's time: the model's own bookkeeping of spells.
        depleted = self.pool.enabled and sum(size for _, size in self.held.values()) >= self.pool.capacity
        if depleted and self.spell_start is None:
            self.spell_start = self.now
        elif not depleted and self.spell_start is not None:
            self.depleted_total += self.now - self.spell_start
            self.spell_start = None
        ongoing = self.now - self.spell_start if self.spell_start is not None else 0.0
        assert self.pool.depleted_seconds(self.now) == pytest.approx(self.depleted_total + ongoing, abs=1e-6)

    def teardown(self) -> None:
        """Releasing everything granted eventually grants every waiter and empties the pool."""
        rounds = 0
        while self.held:
            rounds += 1
            assert rounds <= 10_000
            ticket = min(self.held)
            del self.held[ticket]
            self.take(self.pool.release(ticket, self.now))
        assert self.queue == []
        assert (self.pool.used, self.pool.waiting) == (0, 0)
        if self.pool.enabled:
            assert self.pool.available == self.pool.capacity


MemoryPoolMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)
test_memory_pool_state_machine = MemoryPoolMachine.TestCase


def test_reconfigure_applies_a_new_request_size_and_mode_and_observe_lets_waiters_go() -> None:
    pool = MemoryPool(100, 50, mode=Mode.ENFORCE)
    pool.reserve("a", 50, 0.0)
    pool.reserve("b", 50, 0.0)
    decision, waiting = pool.reserve("c", 10, 0.0)
    assert decision is not None and decision.enforced
    assert pool.reconfigure(60, Mode.ENFORCE, 1.0) == []
    assert pool.max_request == 60 and pool.waiting == 1
    assert pool.reconfigure(60, Mode.OBSERVE, 2.0) == [waiting]
    assert pool.waiting == 0 and pool.used == 110 and pool.mode is Mode.OBSERVE
    with pytest.raises(ValueError, match=r"queued\.max\.request\.bytes"):
        pool.reconfigure(200, Mode.ENFORCE, 3.0)
