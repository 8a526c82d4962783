"""KIP-72 memory pool (sans-I/O): the non-strict byte budget, its FIFO of waiters,
the per-connection fair share, observe mode and depleted-time accounting."""

from __future__ import annotations

import random
from collections.abc import Hashable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from policies.memory_pool import (
    QUEUED_MAX_REQUEST_BYTES,
    QUEUED_MAX_REQUEST_BYTES_PER_CONNECTION,
    SOCKET_REQUEST_MAX_BYTES,
    UNBOUNDED,
    Grant,
    MemoryPool,
    Wait,
    WaitReason,
    validate_settings,
)
from policies.mode import Mode

KIB = 1024
MIB = 1024 * KIB


def granted(decision: Grant | Wait) -> Grant:
    assert isinstance(decision, Grant), decision
    return decision


def waits(decision: Grant | Wait) -> Wait:
    assert isinstance(decision, Wait), decision
    return decision


# -- the non-strict budget ---------------------------------------------------------


def test_a_request_larger_than_what_remains_is_granted_while_any_budget_remains() -> None:
    pool = MemoryPool(2 * MIB, 1 * MIB)
    granted(pool.reserve("a", MIB, 0.0))
    granted(pool.reserve("a", MIB - 1, 0.0))
    big = granted(pool.reserve("b", 1 * MIB, 0.0))
    assert big.size == MIB and not big.would_wait
    assert pool.used == 3 * MIB - 1
    assert pool.available == -(MIB - 1)


def test_an_exhausted_pool_queues_the_request() -> None:
    pool = MemoryPool(2 * MIB, 1 * MIB)
    granted(pool.reserve("a", MIB, 0.0))
    granted(pool.reserve("a", MIB, 0.0))
    wait = waits(pool.reserve("b", 1, 0.0))
    assert wait.reason is WaitReason.POOL_DEPLETED and wait.size == 1 and wait.conn_id == "b"
    assert pool.waiting == 1


@given(st.lists(st.integers(min_value=1, max_value=MIB), max_size=60), st.randoms(use_true_random=False))
def test_used_never_exceeds_pool_plus_largest_request_under_any_sequence(sizes: list[int], rnd: random.Random) -> None:
    pool = MemoryPool(2 * MIB, 1 * MIB)
    held: list[int] = []
    for i, size in enumerate(sizes):
        decision = pool.reserve(i % 5, size, float(i))
        if isinstance(decision, Grant):
            held.append(decision.ticket)
        if held and rnd.random() < 0.4:
            held.extend(g.ticket for g in pool.release(held.pop(rnd.randrange(len(held))), float(i)))
        assert pool.used <= 3 * MIB - 1
    assert pool.high_water_mark <= 3 * MIB - 1


def test_a_large_request_waiting_behind_small_ones_is_granted_before_later_small_ones() -> None:
    pool = MemoryPool(2 * MIB, 1 * MIB)
    smalls = [granted(pool.reserve(f"s{i}", 512 * KIB, 0.0)) for i in range(4)]
    assert pool.available == 0
    big = waits(pool.reserve("big", MIB, 1.0))
    later = [waits(pool.reserve(f"late{i}", KIB, 2.0)) for i in range(3)]

    # One small request finishes: 512 KiB free, less than the big one needs,
    # but the big one is at the head of the queue and the pool is non-strict.
    woken = pool.release(smalls[0].ticket, 3.0)
    assert [g.ticket for g in woken] == [big.ticket]
    assert woken[0].waited_seconds == 2.0
    assert pool.used == 2 * MIB + 512 * KIB
    assert pool.waiting == 3

    # The later small ones keep their FIFO order once the pool has room again.
    woken = pool.release(smalls[1].ticket, 4.0) + pool.release(smalls[2].ticket, 4.0)
    woken += pool.release(big.ticket, 5.0)
    assert [g.ticket for g in woken] == [w.ticket for w in later]


def test_a_new_request_does_not_jump_ahead_of_waiters_while_the_pool_is_depleted() -> None:
    pool = MemoryPool(2 * MIB, 1 * MIB)
    first = granted(pool.reserve("a", MIB, 0.0))
    second = granted(pool.reserve("a", MIB, 0.0))
    big = waits(pool.reserve("big", MIB, 0.0))
    small = waits(pool.reserve("small", KIB, 0.0))
    assert [g.ticket for g in pool.release(first.ticket, 1.0)] == [big.ticket]
    assert pool.available == 0
    newcomer = waits(pool.reserve("new", KIB, 1.0))
    assert newcomer.reason is WaitReason.POOL_DEPLETED
    assert [g.ticket for g in pool.release(second.ticket, 2.0)] == [small.ticket, newcomer.ticket]


@pytest.mark.parametrize("size", [0, -1, MIB + 1])
def test_a_request_size_outside_one_to_socket_request_max_bytes_is_a_programming_error(size: int) -> None:
    pool = MemoryPool(2 * MIB, 1 * MIB)
    with pytest.raises(ValueError, match=SOCKET_REQUEST_MAX_BYTES):
        pool.reserve("a", size, 0.0)


# -- tickets -----------------------------------------------------------------------


def test_releasing_a_ticket_twice_raises() -> None:
    pool = MemoryPool(2 * MIB, 1 * MIB)
    grant = granted(pool.reserve("a", KIB, 0.0))
    pool.release(grant.ticket, 1.0)
    with pytest.raises(ValueError, match="not outstanding"):
        pool.release(grant.ticket, 2.0)
    assert pool.used == 0


def test_releasing_a_ticket_never_issued_raises() -> None:
    with pytest.raises(ValueError, match="not outstanding"):
        MemoryPool(2 * MIB, 1 * MIB).release(42, 0.0)


def test_a_waiter_is_granted_under_the_ticket_its_wait_named() -> None:
    pool = MemoryPool(2 * MIB, 1 * MIB)
    first = granted(pool.reserve("a", MIB, 0.0))
    second = granted(pool.reserve("a", MIB, 0.0))
    wait = waits(pool.reserve("b", KIB, 0.0))
    assert len({first.ticket, second.ticket, wait.ticket}) == 3
    (grant,) = pool.release(first.ticket, 1.0)
    assert (grant.ticket, grant.conn_id, grant.size) == (wait.ticket, "b", KIB)


def test_releasing_a_queued_ticket_withdraws_the_wait() -> None:
    pool = MemoryPool(2 * MIB, 1 * MIB)
    first = granted(pool.reserve("a", MIB, 0.0))
    second = granted(pool.reserve("a", MIB, 0.0))
    wait = waits(pool.reserve("b", KIB, 0.0))
    assert pool.release(wait.ticket, 1.0) == []
    assert pool.waiting == 0
    assert pool.release(first.ticket, 2.0) == []
    assert pool.release(second.ticket, 2.0) == []
    assert pool.used == 0


# -- disconnects -------------------------------------------------------------------


def test_a_disconnect_returns_all_its_bytes_and_the_pool_is_full_again() -> None:
    pool = MemoryPool(2 * MIB, 1 * MIB)
    tickets = [granted(pool.reserve("a", 700 * KIB, 0.0)).ticket for _ in range(3)]
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
    b = waits(pool.reserve("b", MIB, 0.0))
    c = waits(pool.reserve("c", MIB, 0.0))
    assert [g.ticket for g in pool.cancel("a", 1.0)] == [b.ticket, c.ticket]
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
    grants = [granted(pool.reserve(i % 3, MIB, 0.0)) for i in range(100)]
    assert not any(g.would_wait for g in grants)
    assert (pool.used, pool.high_water_mark, pool.waiting, pool.available) == (100 * MIB, 100 * MIB, 0, UNBOUNDED)
    assert pool.depleted_seconds(10.0) == 0.0
    for g in grants:
        assert pool.release(g.ticket, 1.0) == []
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
    wait = waits(pool.reserve("greedy", 600 * KIB, 0.0))
    assert wait.reason is WaitReason.CONNECTION_SHARE
    assert pool.held("greedy") == 600 * KIB
    # Another connection is not held up behind it.
    granted(pool.reserve("other", MIB, 0.0))


def test_a_share_limited_waiter_does_not_block_waiters_behind_it() -> None:
    pool = MemoryPool(2 * MIB, MIB, per_connection=MIB)
    g1 = granted(pool.reserve("greedy", 800 * KIB, 0.0))
    filler = granted(pool.reserve("filler", MIB, 0.0))
    granted(pool.reserve("filler2", 224 * KIB, 0.0))
    assert pool.available == 0
    greedy_wait = waits(pool.reserve("greedy", 800 * KIB, 0.0))
    other_wait = waits(pool.reserve("other", 512 * KIB, 0.0))
    # The pool has room again; "greedy" is still over its share, "other" goes first.
    woken = pool.release(filler.ticket, 1.0)
    assert [g.ticket for g in woken] == [other_wait.ticket]
    assert pool.waiting == 1
    # Once "greedy" gives its first request back, its queued one is granted.
    assert [g.ticket for g in pool.release(g1.ticket, 2.0)] == [greedy_wait.ticket]


def test_a_connections_later_request_stays_behind_its_own_queued_one() -> None:
    pool = MemoryPool(4 * MIB, MIB, per_connection=MIB)
    granted(pool.reserve("a", 800 * KIB, 0.0))
    queued = waits(pool.reserve("a", 800 * KIB, 0.0))
    # 100 KiB would fit in the share, but the 800 KiB one asked first.
    later = waits(pool.reserve("a", 100 * KIB, 0.0))
    assert later.reason is WaitReason.CONNECTION_SHARE
    assert [g.ticket for g in pool.release(queued.ticket, 1.0)] == [later.ticket]


def test_a_connections_queued_requests_are_granted_in_its_own_order_when_the_pool_frees_up() -> None:
    pool = MemoryPool(2 * MIB, MIB, per_connection=MIB)
    granted(pool.reserve("a", 800 * KIB, 0.0))
    hog = granted(pool.reserve("hog", MIB, 0.0))
    granted(pool.reserve("hog2", 224 * KIB, 0.0))
    first = waits(pool.reserve("a", 800 * KIB, 0.0))  # the pool refuses it
    second = waits(pool.reserve("a", 100 * KIB, 0.0))
    assert first.reason is WaitReason.POOL_DEPLETED and second.reason is WaitReason.POOL_DEPLETED
    # The pool has room, "a" is over its share for the first; the second fits but stays behind it.
    assert pool.release(hog.ticket, 1.0) == []
    assert pool.waiting == 2
    assert [g.ticket for g in pool.cancel("hog2", 2.0)] == []
    assert pool.held("a") == 800 * KIB


def test_a_request_larger_than_the_share_is_granted_to_a_connection_holding_nothing() -> None:
    pool = MemoryPool(4 * MIB, 2 * MIB, per_connection=MIB)
    granted(pool.reserve("a", 2 * MIB, 0.0))
    assert pool.held("a") == 2 * MIB
    # Holding more than its share, even one more byte waits.
    assert waits(pool.reserve("a", 1, 0.0)).reason is WaitReason.CONNECTION_SHARE


def test_a_queued_request_larger_than_the_share_is_granted_once_its_connection_holds_nothing() -> None:
    pool = MemoryPool(4 * MIB, 2 * MIB, per_connection=MIB)
    first = granted(pool.reserve("a", 512 * KIB, 0.0))
    big = waits(pool.reserve("a", 2 * MIB, 0.0))
    assert [g.ticket for g in pool.release(first.ticket, 1.0)] == [big.ticket]


def test_a_waiter_blocked_by_the_pool_blocks_the_waiters_behind_it_even_with_fairness() -> None:
    pool = MemoryPool(2 * MIB, 2 * MIB, per_connection=MIB)
    hog = granted(pool.reserve("hog", 2 * MIB, 0.0))
    big = waits(pool.reserve("big", 2 * MIB, 0.0))
    small = waits(pool.reserve("small", 1, 0.0))
    assert big.reason is WaitReason.POOL_DEPLETED and small.reason is WaitReason.POOL_DEPLETED
    assert [g.ticket for g in pool.release(hog.ticket, 1.0)] == [big.ticket]
    assert pool.waiting == 1


# -- observe -------------------------------------------------------------------------


def test_observe_mode_never_waits_but_reports_would_wait() -> None:
    pool = MemoryPool(2 * MIB, MIB, per_connection=MIB, mode=Mode.OBSERVE)
    first = granted(pool.reserve("a", MIB, 0.0))
    over_share = granted(pool.reserve("a", 1, 0.0))
    filler = granted(pool.reserve("b", MIB, 0.0))
    depleted = granted(pool.reserve("c", MIB, 0.0))
    assert not first.would_wait and not filler.would_wait
    assert over_share.would_wait and depleted.would_wait
    assert pool.waiting == 0
    assert pool.used == 3 * MIB + 1
    for g in (first, over_share, filler, depleted):
        assert pool.release(g.ticket, 1.0) == []
    assert pool.used == 0


# -- depleted time ---------------------------------------------------------------------


def test_depleted_time_counts_only_spells_with_nothing_available() -> None:
    pool = MemoryPool(2 * MIB, MIB)
    a = granted(pool.reserve("a", MIB, 0.0))
    assert pool.depleted_seconds(5.0) == 0.0
    b = granted(pool.reserve("b", MIB, 10.0))  # available == 0 from t=10
    assert pool.depleted_seconds(12.5) == 2.5
    pool.release(a.ticket, 13.0)  # spell ends: 3 s
    assert pool.depleted_seconds(100.0) == 3.0
    c = granted(pool.reserve("c", MIB, 20.0))  # second spell from t=20
    assert pool.depleted_seconds(21.0) == 4.0
    pool.release(b.ticket, 24.0)
    pool.release(c.ticket, 25.0)
    assert pool.depleted_seconds(30.0) == 7.0


def test_depleted_time_ignores_a_clock_that_goes_backwards() -> None:
    pool = MemoryPool(2 * MIB, MIB)
    a = granted(pool.reserve("a", MIB, 10.0))
    granted(pool.reserve("b", MIB, 10.0))
    pool.release(a.ticket, 5.0)  # earlier than seen: counts as t=10
    assert pool.depleted_seconds(50.0) == 0.0


def test_a_waiter_granted_on_release_keeps_the_depleted_spell_going() -> None:
    pool = MemoryPool(2 * MIB, MIB)
    a1 = granted(pool.reserve("a", MIB, 0.0))
    a2 = granted(pool.reserve("a", MIB, 0.0))
    waits(pool.reserve("b", MIB, 1.0))
    assert len(pool.release(a1.ticket, 4.0)) == 1  # b takes the freed MiB at once
    assert pool.available == 0
    assert pool.depleted_seconds(9.0) == 9.0
    pool.release(a2.ticket, 10.0)
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

    def take(self, grants: list[Grant]) -> None:
        """Record grants handed out by release/cancel: they must be queued waiters, in FIFO order."""
        assert [g.ticket for g in grants] == self.expected_wakeups()
        positions = [next(i for i, (t, _, _) in enumerate(self.queue) if t == g.ticket) for g in grants]
        assert positions == sorted(positions), "waiters granted out of FIFO order"
        for g in grants:
            self.record_grant(g)
            self.queue = [w for w in self.queue if w[0] != g.ticket]

    def record_grant(self, g: Grant) -> None:
        assert g.ticket not in self.ever_granted, "ticket granted twice"
        self.ever_granted.add(g.ticket)
        self.held[g.ticket] = (g.conn_id, g.size)

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
        decision = self.pool.reserve(conn, size, self.now)
        assert decision.ticket not in self.ever_issued
        self.ever_issued.add(decision.ticket)
        if self.pool.mode is Mode.OBSERVE or not self.pool.enabled:
            g = granted(decision)
            assert g.would_wait == enforce_would_wait
            self.record_grant(g)
        elif enforce_would_wait:
            self.queue.append((waits(decision).ticket, conn, size))
        else:
            self.record_grant(granted(decision))

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
