"""One KIP-72 budget across N worker processes (issue 29): pool bytes leased by an owner.

Kafka's network threads share one ``SimpleMemoryPool``; with ``workers: N`` the proxy's
workers share ``queued.max.request.bytes`` through leases, so that a request does not wait
on another process in the common case (docs/workers.md, "The pool: leases"):

* :class:`LeasedMemoryPool` is a worker's pool. It grants a request from its lease when the
  request fits (strictly: the bytes in use never pass the lease) and nobody in the worker
  waits; otherwise the request queues (the pool's FIFO) and :meth:`LeasedMemoryPool.wanted`
  says what lease the worker must ask the owner for. It gives back what it holds unused beyond
  ``2 L`` when nothing waits, keeping ``L``; while the owner recalls, all it holds unused, and
  its own waiters then get their bytes from the owner, in the owner's order, so bytes coming
  back in any worker reach the request that waited first.
* :class:`LeaseBook` is the owner's book: grants while any budget remains, as Kafka's
  non-strict pool does (a grant may pass the budget by less than one request), so the bytes
  leased, hence the bytes in use, never pass ``queued.max.request.bytes +
  socket.request.max.bytes - 1``, the bound of one ``MemoryPool``. Asks it cannot grant queue
  FIFO across workers, and while any waits the workers are recalled. A dead worker's lease
  comes back.

An ask names the lease the worker must hold (``hold``: its bytes in use and its first
waiter), not an increment, so bytes it gave back while the ask was on its way are counted:
the owner grants ``hold`` minus what it has leased to that worker, and at least ``want`` (L)
while that much budget remains. ``queued.max.request.bytes.per.connection`` stays in the
worker (a connection lives in one). Time is passed in as ``now``.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Final

from policies.decision import Admission, Decision
from policies.memory_pool import _PER_CONNECTION_OFF, MemoryPool, _Conn, _granted
from policies.mode import Mode
from policies.properties import QUEUED_MAX_REQUEST_BYTES, SOCKET_REQUEST_MAX_BYTES

# The largest lease L: measured (bench/RESULTS.md) 0.02% of a mixed load asking the owner at 4 MiB.
MAX_LEASE: Final = 4 * 1024 * 1024


def lease_size(capacity: int, workers: int) -> int:
    """L = min(4 MiB, queued.max.request.bytes / (4 N)): at most half the budget sits unused in
    leases (a worker keeps up to 2 L) before a recall. At least one byte."""
    return max(1, min(MAX_LEASE, capacity // (4 * workers)))


class LeasedMemoryPool(MemoryPool):
    """A worker's part of the one pool: a :class:`MemoryPool` whose room is its lease."""

    def __init__(
        self,
        capacity: int,
        max_request: int,
        lease_size: int,
        per_connection: int = _PER_CONNECTION_OFF,
        mode: Mode = Mode.ENFORCE,
    ) -> None:
        if capacity <= 0:
            raise ValueError(f"leases need {QUEUED_MAX_REQUEST_BYTES} > 0 (the pool on), got {capacity}")
        super().__init__(capacity, max_request, per_connection, mode)
        self._lease = 0
        self._lease_size = lease_size
        self._recalled = False

    @property
    def lease(self) -> int:
        """Bytes this worker holds of the owner's budget (in use or not)."""
        return self._lease

    @property
    def lease_size(self) -> int:
        """L: the least a worker asks for, and what it keeps unused."""
        return self._lease_size

    @property
    def recalled(self) -> bool:
        """The owner has asks waiting: unused bytes go back to it at once."""
        return self._recalled

    # -- requests ----------------------------------------------------------------

    def reserve(self, conn_id: Hashable, size: int, now: float) -> Admission:
        """As :meth:`MemoryPool.reserve`, from the lease: granted now when it fits and nobody waits."""
        if not 1 <= size <= self._max_request:
            raise ValueError(f"request size {size} is outside 1..{SOCKET_REQUEST_MAX_BYTES} ({self._max_request})")
        if now > self._last_now:
            self._last_now = now
        now = self._last_now
        ticket = next(self._tickets)
        used = self._used
        if not self._queue and conn_id not in self._conns and used + size <= self._lease and not self._recalled:
            # The common case, inline: it fits in the lease and nobody waits.
            self._held[ticket] = (conn_id, size)
            self._conns[conn_id] = _Conn(size, {ticket})
            used = self._used = used + size
            if used > self._window_high_water_mark:
                self._window_high_water_mark = used
                if used > self._high_water_mark:
                    self._high_water_mark = used
            return _granted((None, ticket))
        decision = self._wait_decision(conn_id, size)
        if decision is not None and decision.enforced:
            self._queue[ticket] = (conn_id, size)
            self._conn(conn_id).queued.add(ticket)
            self._settle(now)
            return Admission(decision, ticket)
        self._grant(ticket, conn_id, size)  # observe mode may pass the lease: wanted() asks for the debt
        self._settle(now)
        return _granted((decision, ticket))

    # -- the lease -----------------------------------------------------------------

    def grow(self, size: int, now: float) -> list[int]:
        """The owner granted ``size`` more bytes: returns the queued tickets they let go, FIFO."""
        if size < 0:
            raise ValueError(f"a lease grows by a positive size, got {size}")
        now = self._advance(now)
        self._lease += size
        granted = self._grant_fitting()
        self._settle(now)
        return granted

    def wanted(self) -> int:
        """The lease to ask the owner for (its bytes in use and its first waiter's size; in
        observe mode, what it granted beyond its lease), or 0 when the lease suffices."""
        hold = self._used
        head = self._head()
        if head is not None:
            hold += head
        return hold if hold > self._lease else 0

    def give_back(self) -> int:
        """The bytes to give back to the owner now (the lease shrinks by them): while it recalls,
        all those unused; else, when no request waits for the lease, what is unused beyond
        ``2 L``, keeping ``L``."""
        spare = self._lease - self._used
        if spare <= 0:
            return 0
        if self._recalled:
            back = spare
        elif spare > 2 * self._lease_size and self._head() is None:
            back = spare - self._lease_size
        else:
            return 0
        self._lease -= back
        return back

    def recall(self, recalled: bool, now: float) -> list[int]:
        """The owner starts (True) or ends (False) a recall; returns the queued tickets granted
        by its end (from bytes the lease still has)."""
        self._recalled = recalled
        if recalled:
            return []
        now = self._advance(now)
        granted = self._grant_fitting()
        self._settle(now)
        return granted

    # -- internals -----------------------------------------------------------------

    def _head(self) -> int | None:
        """The size of the first waiter its lease holds back (not only its connection's share)."""
        if not self._queue:
            return None
        held_back: set[Hashable] = set()
        for conn_id, size in self._queue.values():
            if conn_id in held_back or self._over_share(self._conns[conn_id], size):
                held_back.add(conn_id)
                continue
            return size
        return None

    def _wait_decision(self, conn_id: Hashable, size: int) -> Decision | None:
        if self._recalled or self._used + size > self._lease or self._head() is not None:
            key, limit = QUEUED_MAX_REQUEST_BYTES, self._capacity
            return self._wait(
                key,
                f"{key}={limit}: this worker's lease of {self._lease} bytes has {self._lease - self._used} free; "
                f"a request of {size} bytes waits for the owner's budget",
                size,
            )
        return self._share_wait(conn_id, size)

    def _grant_waiters(self) -> list[int]:
        # Bytes released during a recall go back to the owner, whose FIFO decides who gets them.
        return [] if self._recalled else self._grant_fitting()

    def _grant_fitting(self) -> list[int]:
        granted: list[int] = []
        held_back: set[Hashable] = set()
        for ticket, (conn_id, size) in list(self._queue.items()):
            conn = self._conns[conn_id]
            if conn_id in held_back or self._over_share(conn, size):
                held_back.add(conn_id)  # its later requests stay behind it; others go ahead
                continue
            if self._used + size > self._lease:
                break  # the lease refuses the head of the queue: everyone behind waits too
            del self._queue[ticket]
            conn.queued.discard(ticket)
            self._grant(ticket, conn_id, size)
            granted.append(ticket)
        return granted

    def _settle(self, now: float) -> None:
        # Depleted, per worker: a request waits for bytes its lease lacks.
        depleted = self._head() is not None
        if depleted and self._depleted_since is None:
            self._depleted_since = now
        elif not depleted and self._depleted_since is not None:
            self._depleted_total += now - self._depleted_since
            self._depleted_since = None


@dataclass(frozen=True, slots=True)
class LeaseGrant:
    """A queued ask granted: ``size`` bytes to ``worker``, answering its ask ``ask``."""

    worker: int
    ask: int
    size: int


class LeaseBook:
    """The owner's account of ``queued.max.request.bytes``: what each worker holds, and the
    asks waiting for bytes, FIFO across workers."""

    def __init__(self, capacity: int, max_request: int) -> None:
        if capacity <= 0:
            raise ValueError(f"leases need {QUEUED_MAX_REQUEST_BYTES} > 0 (the pool on), got {capacity}")
        self._capacity = capacity
        self._max_request = max_request
        self._leases: dict[int, int] = {}
        self._leased = 0
        self._peak = 0
        self._queue: dict[tuple[int, int], tuple[int, int]] = {}  # (worker, ask) -> (hold, want); FIFO
        self._depleted_total = 0.0
        self._depleted_since: float | None = None
        self._last_now = float("-inf")

    @property
    def capacity(self) -> int:
        """``queued.max.request.bytes``."""
        return self._capacity

    @property
    def max_request(self) -> int:
        """``socket.request.max.bytes``: what a grant may pass the budget by, less one byte."""
        return self._max_request

    @property
    def leased(self) -> int:
        """Bytes leased to the workers, in use or not."""
        return self._leased

    @property
    def peak_leased(self) -> int:
        """The most bytes ever leased at once."""
        return self._peak

    @property
    def waiting(self) -> int:
        """Asks waiting for bytes."""
        return len(self._queue)

    @property
    def recalling(self) -> bool:
        """Asks wait: every worker gives back what it holds unused."""
        return bool(self._queue)

    def lease(self, worker: int) -> int:
        """Bytes leased to ``worker``."""
        return self._leases.get(worker, 0)

    def depleted_seconds(self, now: float) -> float:
        """Total time an ask waited (the budget was all leased and a worker needed more)."""
        total = self._depleted_total
        if self._depleted_since is not None:
            total += max(0.0, max(now, self._last_now) - self._depleted_since)
        return total

    # -- decisions -----------------------------------------------------------------

    def ask(self, worker: int, ask: int, hold: int, want: int, now: float) -> int | None:
        """``worker`` must hold ``hold`` bytes (and would take ``want`` more than it holds): the
        bytes granted now (0: it holds enough already), or None: queued, granted by a later
        ``give_back`` or ``worker_gone`` (as a :class:`LeaseGrant`)."""
        if self._queue or self._leased >= self._capacity:
            self._queue[(worker, ask)] = (hold, want)
            self._settle(now)
            return None
        return self._grant(worker, hold, want)

    def give_back(self, worker: int, size: int, now: float) -> list[LeaseGrant]:
        """``worker`` gives back ``size`` unused bytes: returns the queued asks they let go, FIFO."""
        lease = self._leases.get(worker, 0)
        if not 0 < size <= lease:
            raise ValueError(f"worker {worker} gives back {size} bytes of a lease of {lease}")
        self._set_lease(worker, lease - size)
        self._leased -= size
        granted = self._grant_waiting()
        self._settle(now)
        return granted

    def worker_gone(self, worker: int, now: float) -> tuple[int, list[LeaseGrant]]:
        """``worker`` died or ended: its lease comes back and its asks are dropped; returns the
        bytes released and the queued asks of other workers they let go."""
        released = self._leases.pop(worker, 0)
        self._leased -= released
        for key in [key for key in self._queue if key[0] == worker]:
            del self._queue[key]
        granted = self._grant_waiting()
        self._settle(now)
        return released, granted

    def reconfigure(self, max_request: int) -> None:
        """A reload: ``socket.request.max.bytes`` for the grants to come (the budget is sized at start)."""
        self._max_request = max_request

    # -- internals -----------------------------------------------------------------

    def _grant(self, worker: int, hold: int, want: int) -> int:
        """What ``worker`` lacks of ``hold`` (at most one request: what a grant may pass the budget
        by) and up to ``want`` while budget remains. Only called while some budget remains."""
        lease = self._leases.get(worker, 0)
        need = min(hold - lease, self._max_request)
        if need <= 0:
            return 0
        size = max(need, min(want, self._capacity - self._leased))
        self._set_lease(worker, lease + size)
        self._leased += size
        if self._leased > self._peak:
            self._peak = self._leased
        return size

    def _grant_waiting(self) -> list[LeaseGrant]:
        granted: list[LeaseGrant] = []
        queue = self._queue
        while queue and self._leased < self._capacity:
            (worker, ask), (hold, want) = next(iter(queue.items()))
            del queue[(worker, ask)]
            granted.append(LeaseGrant(worker, ask, self._grant(worker, hold, want)))
        return granted

    def _set_lease(self, worker: int, lease: int) -> None:
        if lease:
            self._leases[worker] = lease
        else:
            self._leases.pop(worker, None)

    def _settle(self, now: float) -> None:
        if now > self._last_now:
            self._last_now = now
        now = self._last_now
        if self._queue and self._depleted_since is None:
            self._depleted_since = now
        elif not self._queue and self._depleted_since is not None:
            self._depleted_total += now - self._depleted_since
            self._depleted_since = None
