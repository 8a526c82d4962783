"""One KIP-72 budget across workers (sans-I/O): a worker's LeasedMemoryPool and the owner's
LeaseBook, wired by a synchronous stand-in for the link (every message delivered at once, in
order), as proxy/workers/owner_pool.py and proxy/serve/pool_gate.py wire them over a socket."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from policies.decision import Action, Admission, Policy
from policies.memory_pool import MemoryPool
from policies.mode import Mode
from policies.pool_leases import MAX_LEASE, LeaseBook, LeasedMemoryPool, lease_size
from policies.properties import QUEUED_MAX_REQUEST_BYTES, QUEUED_MAX_REQUEST_BYTES_PER_CONNECTION

KIB = 1024
MIB = 1024 * KIB


def granted(result: Admission) -> int:
    decision, ticket = result
    assert decision is None, decision
    assert ticket is not None
    return ticket


def waits(result: Admission) -> int:
    decision, ticket = result
    assert decision is not None and (decision.policy, decision.action) == (Policy.MEMORY_POOL, Action.WAIT)
    assert decision.mode is Mode.ENFORCE
    assert ticket is not None
    return ticket


class Cluster:
    """N workers' pools and the owner's book, with what the two shells do between them: a
    worker asks for ``wanted()`` (one ask at a time), gives back ``give_back()`` after each
    change, and follows the owner's recall."""

    def __init__(self, workers: int, capacity: int, max_request: int, per_connection: int = -1) -> None:
        self.capacity, self.max_request, self.per_connection = capacity, max_request, per_connection
        self.book = LeaseBook(capacity, max_request)
        self.size = lease_size(capacity, workers)
        self.pools = [self._pool() for _ in range(workers)]
        self.asking: set[int] = set()  # workers with an ask at the owner
        self.asks = 0
        self.woken: list[tuple[int, int]] = []  # (worker, ticket) granted after waiting, in order
        self.now = 0.0

    def _pool(self) -> LeasedMemoryPool:
        return LeasedMemoryPool(self.capacity, self.max_request, self.size, self.per_connection)

    # -- what a worker's shell does ------------------------------------------------

    def reserve(self, worker: int, conn: str, size: int) -> Admission:
        admission = self.pools[worker].reserve(conn, size, self.now)
        self.settle()
        return admission

    def take(self, worker: int, conn: str, size: int) -> int:
        """A request that holds its bytes once the messages settled (at once, or after an ask)."""
        _, ticket = self.reserve(worker, conn, size)
        assert ticket is not None and ticket in self.pools[worker]._held, "still waiting"
        return ticket

    def wait(self, worker: int, conn: str, size: int) -> int:
        """A request that still waits once the messages settled."""
        _, ticket = self.reserve(worker, conn, size)
        assert ticket is not None and ticket not in self.pools[worker]._held, "granted"
        return ticket

    def release(self, worker: int, ticket: int) -> None:
        self._woke(worker, self.pools[worker].release(ticket, self.now))
        self.settle()

    def cancel(self, worker: int, conn: str) -> None:
        self._woke(worker, self.pools[worker].cancel(conn, self.now))
        self.settle()

    def kill(self, worker: int) -> int:
        """The worker dies and is restarted with an empty pool; returns the bytes released."""
        released, grants = self.book.worker_gone(worker, self.now)
        self.asking.discard(worker)
        self.pools[worker] = self._pool()
        self._granted(grants)
        self.settle()
        return released

    def settle(self) -> None:
        """Deliver messages until nothing changes (bounded)."""
        for _ in range(1000):
            moved = False
            recalling = self.book.recalling
            for worker, pool in enumerate(self.pools):
                if pool.recalled != recalling:
                    self._woke(worker, pool.recall(recalling, self.now))
                    moved = True
                back = pool.give_back()
                if back:
                    self._granted(self.book.give_back(worker, back, self.now))
                    moved = True
                hold = pool.wanted()
                if hold and worker not in self.asking:
                    self.asks += 1
                    got = self.book.ask(worker, self.asks, hold, pool.lease_size, self.now)
                    if got is None:
                        self.asking.add(worker)
                    else:
                        self._woke(worker, pool.grow(got, self.now))
                    moved = True
            if not moved:
                return
        raise AssertionError("the messages did not settle")

    def _granted(self, grants: list) -> None:
        for grant in grants:
            self.asking.discard(grant.worker)
            self._woke(grant.worker, self.pools[grant.worker].grow(grant.size, self.now))

    def _woke(self, worker: int, tickets: list[int]) -> None:
        self.woken += [(worker, ticket) for ticket in tickets]

    @property
    def used(self) -> int:
        return sum(pool.used for pool in self.pools)

    def check(self) -> None:
        leases = [pool.lease for pool in self.pools]
        assert [self.book.lease(w) for w in range(len(self.pools))] == leases  # both ends agree
        assert sum(leases) == self.book.leased
        assert self.book.leased <= self.capacity + self.max_request - 1
        for pool in self.pools:
            assert pool.used <= pool.lease  # strict in the worker


# -- lease size ----------------------------------------------------------------------


def test_the_lease_is_a_quarter_of_a_workers_share_of_the_budget_and_at_most_4_mib() -> None:
    assert lease_size(16 * MIB, 2) == 2 * MIB
    assert lease_size(512 * MIB, 2) == MAX_LEASE == 4 * MIB
    assert lease_size(2 * MIB, 4) == 128 * KIB


def test_leases_need_the_pool_on() -> None:
    with pytest.raises(ValueError, match=QUEUED_MAX_REQUEST_BYTES):
        LeasedMemoryPool(-1, MIB, MIB)
    with pytest.raises(ValueError, match=QUEUED_MAX_REQUEST_BYTES):
        LeaseBook(0, MIB)


# -- a worker's pool -------------------------------------------------------------------


def test_a_request_that_fits_the_lease_is_granted_without_the_owner() -> None:
    pool = LeasedMemoryPool(16 * MIB, MIB, MIB)
    assert pool.wanted() == 0
    assert pool.grow(MIB, 0.0) == []
    granted(pool.reserve("a", 600 * KIB, 0.0))
    granted(pool.reserve("b", 424 * KIB, 0.0))
    assert pool.used == pool.lease == MIB
    assert pool.wanted() == 0


def test_a_request_over_the_lease_waits_and_names_what_it_lacks() -> None:
    pool = LeasedMemoryPool(16 * MIB, MIB, MIB)
    pool.grow(MIB, 0.0)
    granted(pool.reserve("a", 600 * KIB, 0.0))
    ticket = waits(pool.reserve("b", 500 * KIB, 0.0))
    decision = pool.reserve("c", 10, 0.0).decision  # fits, but waits behind b: FIFO
    assert decision is not None and decision.limit_key == QUEUED_MAX_REQUEST_BYTES and decision.limit == 16 * MIB
    assert pool.wanted() == 1100 * KIB  # in use and b: the lease it must hold
    assert pool.grow(76 * KIB, 1.0) == [ticket]  # b, and c behind it, still short of 10 bytes
    assert pool.waiting == 1 and pool.wanted() == 1100 * KIB + 10


def test_unused_bytes_beyond_twice_the_lease_size_go_back_keeping_one() -> None:
    pool = LeasedMemoryPool(16 * MIB, MIB, MIB)
    pool.grow(3 * MIB, 0.0)
    ticket = granted(pool.reserve("a", MIB, 0.0))
    assert pool.give_back() == 0  # 2 MiB unused: kept
    pool.release(ticket, 1.0)
    assert pool.give_back() == 2 * MIB  # 3 MiB unused: keep L
    assert pool.lease == MIB and pool.give_back() == 0


def test_a_recalled_worker_gives_back_all_it_does_not_use_and_grants_its_waiters_only_from_the_owner() -> None:
    pool = LeasedMemoryPool(16 * MIB, MIB, MIB)
    pool.grow(MIB, 0.0)
    first = granted(pool.reserve("a", 800 * KIB, 0.0))
    second = waits(pool.reserve("b", 800 * KIB, 0.0))
    assert pool.recall(True, 0.0) == []
    assert pool.give_back() == 224 * KIB  # even with a waiter: the owner's FIFO decides
    assert pool.release(first, 1.0) == []  # released bytes go back, not to b
    assert pool.give_back() == 800 * KIB and pool.lease == 0
    assert pool.wanted() == 800 * KIB
    assert pool.grow(800 * KIB, 2.0) == [second]


def test_the_share_of_a_connection_stays_in_the_worker_and_does_not_block_others() -> None:
    pool = LeasedMemoryPool(16 * MIB, MIB, MIB, per_connection=100 * KIB)
    pool.grow(MIB, 0.0)
    granted(pool.reserve("a", 80 * KIB, 0.0))
    held = pool.reserve("a", 80 * KIB, 0.0)
    decision = held.decision
    assert decision is not None and decision.limit_key == QUEUED_MAX_REQUEST_BYTES_PER_CONNECTION
    granted(pool.reserve("b", 80 * KIB, 0.0))  # the lease has room: b goes ahead
    assert pool.wanted() == 0  # a waits for its own bytes, not the owner's


def test_observe_mode_grants_beyond_the_lease_and_asks_for_the_debt() -> None:
    pool = LeasedMemoryPool(16 * MIB, MIB, MIB, mode=Mode.OBSERVE)
    decision, _ = pool.reserve("a", 500 * KIB, 0.0)
    assert decision is not None and decision.mode is Mode.OBSERVE
    assert pool.used == 500 * KIB and pool.waiting == 0
    assert pool.wanted() == 500 * KIB


def test_a_worker_is_depleted_while_a_request_waits_for_its_lease() -> None:
    pool = LeasedMemoryPool(16 * MIB, MIB, MIB)
    ticket = waits(pool.reserve("a", 10, 1.0))
    pool.grow(MIB, 3.5)
    assert pool.depleted_seconds(10.0) == 2.5
    pool.release(ticket, 11.0)


def test_the_single_process_pool_is_unchanged_by_leases() -> None:
    pool = MemoryPool(2 * MIB, MIB)
    granted(pool.reserve("a", MIB, 0.0))
    granted(pool.reserve("b", MIB, 0.0))
    assert waits(pool.reserve("c", 1, 0.0))


# -- the owner's book ------------------------------------------------------------------


def test_the_owner_grants_what_the_worker_lacks_and_up_to_its_lease_size() -> None:
    book = LeaseBook(16 * MIB, MIB)
    assert book.ask(0, 1, hold=300 * KIB, want=2 * MIB, now=0.0) == 2 * MIB
    assert book.ask(0, 2, hold=3 * MIB, want=2 * MIB, now=0.0) == 2 * MIB  # lacks 1 MiB, takes L
    assert book.ask(0, 3, hold=MIB, want=2 * MIB, now=0.0) == 0  # holds enough already
    assert book.lease(0) == book.leased == 4 * MIB


def test_the_owner_grants_past_the_budget_by_less_than_one_request_then_queues() -> None:
    book = LeaseBook(4 * MIB, MIB)
    assert book.ask(0, 1, hold=4 * MIB - 1, want=MIB, now=0.0) == MIB  # at most one request's worth of need
    assert book.ask(0, 2, hold=4 * MIB - 1, want=MIB, now=0.0) == MIB
    assert book.ask(0, 3, hold=4 * MIB - 1, want=MIB, now=0.0) == MIB
    assert book.ask(0, 4, hold=4 * MIB - 1, want=1, now=0.0) == MIB - 1
    assert book.ask(1, 1, hold=MIB, want=MIB, now=0.0) == MIB  # one byte remained: granted non-strictly
    assert book.leased == 5 * MIB - 1 == book.capacity + book.max_request - 1
    assert book.ask(1, 2, hold=2 * MIB, want=MIB, now=0.0) is None
    assert book.recalling and book.waiting == 1


def test_queued_asks_are_granted_fifo_across_workers_as_bytes_come_back() -> None:
    book = LeaseBook(2 * MIB, MIB)
    assert book.ask(0, 1, hold=MIB, want=2 * MIB, now=0.0) == 2 * MIB
    assert book.ask(1, 1, hold=MIB, want=512 * KIB, now=1.0) is None
    assert book.ask(2, 1, hold=MIB, want=512 * KIB, now=1.0) is None
    assert book.ask(0, 2, hold=2 * MIB + 1, want=512 * KIB, now=1.0) is None  # behind the others
    grants = book.give_back(0, MIB, now=2.0)
    assert [(g.worker, g.ask, g.size) for g in grants] == [(1, 1, MIB)]
    grants = book.give_back(0, MIB, now=3.0)
    assert [(g.worker, g.ask, g.size) for g in grants] == [(2, 1, MIB)]
    assert book.waiting == 1 and book.depleted_seconds(3.0) == 2.0


def test_a_dead_workers_lease_returns_and_grants_a_waiter_elsewhere() -> None:
    book = LeaseBook(2 * MIB, MIB)
    assert book.ask(0, 1, hold=MIB, want=2 * MIB, now=0.0) == 2 * MIB
    assert book.ask(1, 1, hold=MIB, want=MIB, now=0.0) is None
    assert book.ask(0, 2, hold=3 * MIB, want=MIB, now=0.0) is None
    released, grants = book.worker_gone(0, now=1.0)
    assert released == 2 * MIB
    assert [(g.worker, g.ask, g.size) for g in grants] == [(1, 1, MIB)]  # worker 0's own ask is dropped
    assert book.waiting == 0 and not book.recalling and book.leased == MIB


# -- the two together --------------------------------------------------------------------


def test_a_request_waiting_in_one_worker_is_granted_when_another_worker_releases() -> None:
    cluster = Cluster(2, capacity=4 * MIB, max_request=MIB)
    held = [cluster.take(1, f"b{i}", MIB) for i in range(4)]
    ticket = cluster.wait(0, "a", MIB)
    assert cluster.book.recalling and cluster.used == 4 * MIB
    cluster.release(1, held[0])
    assert cluster.woken[-1] == (0, ticket)
    assert cluster.pools[0].used == MIB and cluster.used == 4 * MIB
    cluster.check()


def test_two_workers_each_holding_part_of_what_their_waiter_needs_do_not_deadlock() -> None:
    # The budget is all leased, and each worker waits for more than it holds: the recall makes
    # each give back what it holds unused even while it waits, so the owner's first ask is granted.
    cluster = Cluster(2, capacity=2 * MIB, max_request=2 * MIB)
    first = [cluster.take(worker, f"x{worker}", MIB) for worker in (0, 1)]
    waiting = [cluster.wait(worker, f"y{worker}", 2 * MIB) for worker in (0, 1)]
    for worker in (0, 1):
        cluster.release(worker, first[worker])
    assert cluster.woken[-1] == (0, waiting[0]) and cluster.pools[1].waiting == 1
    cluster.release(0, waiting[0])
    assert cluster.woken[-1] == (1, waiting[1])
    cluster.check()


def test_a_dead_worker_returns_its_lease_and_a_waiter_elsewhere_is_granted() -> None:
    cluster = Cluster(3, capacity=3 * MIB, max_request=MIB)
    for i in range(3):
        cluster.take(0, f"a{i}", MIB)
    ticket = cluster.wait(2, "c", MIB)
    assert cluster.kill(0) >= 3 * MIB
    assert cluster.woken[-1] == (2, ticket)
    cluster.check()


class LeasesAcrossWorkers(RuleBasedStateMachine):
    """Random requests, releases, disconnects and worker deaths over 3 workers."""

    def __init__(self) -> None:
        super().__init__()
        self.cluster = Cluster(3, capacity=MIB, max_request=512 * KIB, per_connection=768 * KIB)
        self.held: dict[int, set[int]] = {0: set(), 1: set(), 2: set()}
        self.queued: dict[int, dict[int, str]] = {0: {}, 1: {}, 2: {}}

    def _collect_woken(self) -> None:
        for worker, ticket in self.cluster.woken:
            assert self.queued[worker].pop(ticket, None) is not None, "granted a ticket that did not wait"
            self.held[worker].add(ticket)
        self.cluster.woken.clear()

    @rule(
        worker=st.integers(0, 2),
        conn=st.sampled_from("abcd"),
        size=st.one_of(st.sampled_from([100 * KIB, 256 * KIB, 512 * KIB]), st.integers(1, 512 * KIB)),
    )
    def reserve(self, worker: int, conn: str, size: int) -> None:
        self.cluster.now += 0.01
        decision, ticket = self.cluster.pools[worker].reserve(f"{worker}{conn}", size, self.cluster.now)
        assert ticket is not None
        if decision is None:
            self.held[worker].add(ticket)
        else:
            self.queued[worker][ticket] = f"{worker}{conn}"
        self.cluster.settle()
        self._collect_woken()

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        worker = data.draw(st.sampled_from([w for w, held in self.held.items() if held]))
        ticket = data.draw(st.sampled_from(sorted(self.held[worker])))
        self.held[worker].discard(ticket)
        self.cluster.release(worker, ticket)
        self._collect_woken()

    @rule(worker=st.integers(0, 2), conn=st.sampled_from("abcd"))
    def disconnect(self, worker: int, conn: str) -> None:
        conn_id = f"{worker}{conn}"
        pool = self.cluster.pools[worker]
        self.held[worker] = {t for t in self.held[worker] if pool._held[t][0] != conn_id}
        self.queued[worker] = {t: c for t, c in self.queued[worker].items() if c != conn_id}
        self.cluster.cancel(worker, conn_id)
        self._collect_woken()

    @rule(worker=st.integers(0, 2))
    def worker_dies(self, worker: int) -> None:
        lease = self.cluster.pools[worker].lease
        assert self.cluster.kill(worker) == lease
        assert self.cluster.book.lease(worker) == 0
        self.held[worker], self.queued[worker] = set(), {}
        self._collect_woken()

    @invariant()
    def the_leased_total_stays_within_one_pools_bound(self) -> None:
        self.cluster.check()

    def teardown(self) -> None:
        # Every waiter is granted once the bytes come back: release all, until nobody waits.
        for _ in range(200):
            if not any(self.held.values()):
                break
            for worker, held in self.held.items():
                for ticket in sorted(held):
                    held.discard(ticket)
                    self.cluster.release(worker, ticket)
                    self._collect_woken()
        assert not any(self.queued.values()), self.queued
        assert self.cluster.used == 0 and self.cluster.book.waiting == 0
        self.cluster.check()


TestLeasesAcrossWorkers = LeasesAcrossWorkers.TestCase
TestLeasesAcrossWorkers.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


@settings(max_examples=100, deadline=None)
@given(
    workers=st.integers(2, 4),
    senders=st.lists(st.integers(0, 3), min_size=1, max_size=24),
)
def test_equal_requests_never_pass_the_budget_in_total_and_fill_it(workers: int, senders: list[int]) -> None:
    """As one process: with requests of one size and a budget a multiple of it, the bytes in
    use across workers never pass the budget, and every request that could be held is."""
    size = 256 * KIB
    cluster = Cluster(workers, capacity=4 * size, max_request=size)
    for i, worker in enumerate(senders):
        cluster.reserve(worker % workers, f"c{i}", size)
        assert cluster.used <= cluster.capacity
        cluster.check()
    assert cluster.used == min(len(senders), 4) * size
