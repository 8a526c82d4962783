"""Bounds the bytes of requests held in memory at once (KIP-72).

Mirrors Kafka's non-strict ``SimpleMemoryPool``, which the broker builds from
``queued.max.request.bytes`` and ``socket.request.max.bytes``:

* ``queued.max.request.bytes`` (default -1): the pool's budget. ``<= 0`` turns
  the pool off (every request is granted at once; bytes are still counted for
  metrics). When set it must be ``>= socket.request.max.bytes`` so the largest
  single request fits.
* ``socket.request.max.bytes`` (default 104857600): the largest single
  request; asking for more (or for less than one byte) is a programming error,
  since :mod:`policies.frame_check` refuses such frames first.
* A request is granted whenever *any* budget remains (``available > 0``), even
  if it is larger than what remains, so ``available`` may go negative. In-use
  bytes therefore never exceed ``queued.max.request.bytes +
  socket.request.max.bytes - 1``, and a large request is never starved by a
  stream of small ones (KIP-72, "Implementation Concerns" 2).

Where Kafka's network threads retry the read later (shuffling selection keys so
no socket is always last), a request the pool refuses here joins one FIFO queue
of waiters and is granted by a later ``release``/``cancel``: no busy loop, and
a waiter refused by the pool blocks every waiter behind it, so the queue order
is the grant order.

``reserve`` answers a ticket and None (granted) or a WAIT
:class:`policies.decision.Decision` (``Policy.MEMORY_POOL``); ``release`` and
``cancel`` answer the queued tickets they granted, in grant order.

Beyond Kafka, ``queued.max.request.bytes.per.connection`` (default -1 = off;
only meaningful with the pool on) is a fair share: one connection may hold at
most that many bytes of the pool, and a request that would take it over waits
even if the pool has room -- unless the connection holds nothing, so a single
request larger than the share is still granted whenever the pool has room. A
waiter held back only by its connection's share stays queued without blocking
waiters of other connections behind it (no head-of-line blocking), while the
connection's own later requests stay behind it (per-connection order).

In ``Mode.OBSERVE`` every request is granted at once; where enforcing would
have queued it, ``reserve`` still answers the WAIT decision (``mode=OBSERVE``).

``depleted_seconds`` is the total time ``available <= 0`` (Kafka's
``MemoryPoolDepletedTimeTotal``; Kafka times from the first refusal instead).
``high_water_mark`` is the most bytes ever in use; ``reset_window_high_water_mark``
the most in use since its last call (the audit's observation windows).
Time is passed in as ``now``, seconds from a monotonic clock; a ``now`` earlier
than one seen before counts as no time passing.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Final

from policies.decision import Action, Admission, Decision, Policy
from policies.mode import Mode
from policies.properties import (
    LONG_MAX,
    QUEUED_MAX_REQUEST_BYTES,
    QUEUED_MAX_REQUEST_BYTES_PER_CONNECTION,
    REQUEST_BODY_TIMEOUT_MS,
    SOCKET_REQUEST_MAX_BYTES,
    int_default,
)

_PER_CONNECTION_OFF: Final = int_default(QUEUED_MAX_REQUEST_BYTES_PER_CONNECTION)

# Admission(...) without its Python-level __new__: the grant is on every request's path.
_granted: Callable[[tuple[Decision | None, int]], Admission] = functools.partial(tuple.__new__, Admission)

# What ``available`` reports while the pool is off (Kafka's MemoryPool.NONE: Long.MAX_VALUE).
UNBOUNDED = LONG_MAX


def validate_settings(
    queued_max_request_bytes: int,
    socket_request_max_bytes: int,
    per_connection: int = _PER_CONNECTION_OFF,
) -> None:
    """Raise ``ValueError`` naming the keys involved if the settings cannot be used together."""
    if socket_request_max_bytes <= 0:
        raise ValueError(f"{SOCKET_REQUEST_MAX_BYTES} must be positive, got {socket_request_max_bytes}")
    if 0 < queued_max_request_bytes < socket_request_max_bytes:
        raise ValueError(
            f"{QUEUED_MAX_REQUEST_BYTES} ({queued_max_request_bytes}) must be <= 0 (off) or >= "
            f"{SOCKET_REQUEST_MAX_BYTES} ({socket_request_max_bytes}), so the largest request fits"
        )
    if per_connection > 0 and queued_max_request_bytes <= 0:
        raise ValueError(
            f"{QUEUED_MAX_REQUEST_BYTES_PER_CONNECTION} ({per_connection}) needs "
            f"{QUEUED_MAX_REQUEST_BYTES} to be set (> 0), got {queued_max_request_bytes}"
        )


@dataclass(slots=True)
class _Conn:
    held_bytes: int = 0
    held: set[int] = field(default_factory=set)
    queued: set[int] = field(default_factory=set)


class MemoryPool:
    """The byte budget for requests in flight, shared by all connections."""

    def __init__(
        self,
        capacity: int,
        max_request: int,
        per_connection: int = _PER_CONNECTION_OFF,
        mode: Mode = Mode.ENFORCE,
    ) -> None:
        validate_settings(capacity, max_request, per_connection)
        self._capacity = capacity
        self._max_request = max_request
        self._per_connection = per_connection
        self._mode = mode
        self._tickets = itertools.count(1)
        self._used = 0
        self._high_water_mark = 0
        self._window_high_water_mark = 0
        self._held: dict[int, tuple[Hashable, int]] = {}  # ticket -> (conn_id, size)
        self._queue: dict[int, tuple[Hashable, int]] = {}  # the same, for waiters; insertion order is FIFO order
        self._conns: dict[Hashable, _Conn] = {}
        self._depleted_total = 0.0
        self._depleted_since: float | None = None
        self._last_now = float("-inf")

    # -- settings and metrics -------------------------------------------------

    @property
    def enabled(self) -> bool:
        """Whether the pool limits anything (``queued.max.request.bytes > 0``)."""
        return self._capacity > 0

    @property
    def capacity(self) -> int:
        """``queued.max.request.bytes`` as configured (``<= 0``: off)."""
        return self._capacity

    @property
    def max_request(self) -> int:
        """``socket.request.max.bytes``."""
        return self._max_request

    @property
    def per_connection(self) -> int:
        """``queued.max.request.bytes.per.connection`` (``<= 0``: off)."""
        return self._per_connection

    @property
    def mode(self) -> Mode:
        """Enforce (queue waiters) or observe (grant, and report the WAIT)."""
        return self._mode

    @property
    def used(self) -> int:
        """Bytes granted and not yet released."""
        return self._used

    @property
    def available(self) -> int:
        """``capacity - used``; negative after a non-strict grant; ``UNBOUNDED`` while off."""
        return self._capacity - self._used if self.enabled else UNBOUNDED

    @property
    def high_water_mark(self) -> int:
        """The most bytes ever in use at once."""
        return self._high_water_mark

    def reset_window_high_water_mark(self, now: float) -> int:
        """The most bytes in use at once since the last call (or since the pool was made).

        A new window starts at ``now``, from the bytes in use now (they are in use in it too).
        """
        self._advance(now)
        peak = self._window_high_water_mark
        self._window_high_water_mark = self._used
        return peak

    @property
    def waiting(self) -> int:
        """Requests queued for a grant."""
        return len(self._queue)

    def held(self, conn_id: Hashable) -> int:
        """Bytes the connection holds now."""
        conn = self._conns.get(conn_id)
        return conn.held_bytes if conn is not None else 0

    def depleted_seconds(self, now: float) -> float:
        """Total time with ``available <= 0``, including a spell still going on at ``now``."""
        total = self._depleted_total
        if self._depleted_since is not None:
            total += max(0.0, max(now, self._last_now) - self._depleted_since)
        return total

    # -- decisions --------------------------------------------------------------

    def reconfigure(self, max_request: int, mode: Mode, now: float) -> list[int]:
        """A config reload: ``socket.request.max.bytes`` and the mode, for the requests to
        come (the budget itself is sized at start). Switching to OBSERVE lets whoever waits
        go: returns the queued tickets granted by it."""
        validate_settings(self._capacity, max_request, self._per_connection)
        self._max_request = max_request
        self._mode = mode
        if mode is not Mode.OBSERVE:
            return []
        granted = list(self._queue)
        for ticket in granted:
            conn_id, size = self._queue.pop(ticket)
            self._conns[conn_id].queued.discard(ticket)
            self._grant(ticket, conn_id, size)
        self._settle(self._advance(now))
        return granted

    def reserve(self, conn_id: Hashable, size: int, now: float) -> Admission:
        """Ask for ``size`` bytes for one request read from ``conn_id``: None if granted now, and its ticket.

        Otherwise a WAIT decision: enforced, the ticket is queued and a later
        ``release``/``cancel`` grants it; in OBSERVE it is granted now all the same.
        """
        if not 1 <= size <= self._max_request:
            raise ValueError(f"request size {size} is outside 1..{SOCKET_REQUEST_MAX_BYTES} ({self._max_request})")
        if now > self._last_now:  # _advance, inline
            self._last_now = now
        now = self._last_now
        ticket = next(self._tickets)
        used, capacity = self._used, self._capacity
        if conn_id not in self._conns and (used < capacity or capacity <= 0):
            # The common case, inline (it runs per request): the pool is off or has room, and the
            # connection holds nothing, so neither the pool nor a share holds it back (_wait_decision
            # is None).
            self._held[ticket] = (conn_id, size)
            self._conns[conn_id] = _Conn(size, {ticket})
            used = self._used = used + size
            if used > self._window_high_water_mark:
                self._window_high_water_mark = used
                if used > self._high_water_mark:
                    self._high_water_mark = used
            if capacity > 0 and (used >= capacity or self._depleted_since is not None):
                self._settle(now)
            return _granted((None, ticket))
        if self._capacity <= 0:  # off: only counted (the common case costs nothing more)
            self._grant(ticket, conn_id, size)
            return _granted((None, ticket))
        decision = self._wait_decision(conn_id, size)
        if decision is not None and decision.enforced:
            self._queue[ticket] = (conn_id, size)
            self._conn(conn_id).queued.add(ticket)
            return Admission(decision, ticket)
        self._grant(ticket, conn_id, size)
        self._settle(now)
        return _granted((decision, ticket))

    def release(self, ticket: int, now: float) -> list[int]:
        """Give back a granted ticket's bytes (or withdraw a queued one); returns the queued tickets now granted, FIFO.

        A ticket is given back once: one never issued, already released, or
        dropped by ``cancel`` raises ``ValueError``.
        """
        if now > self._last_now:  # _advance, inline (it runs per request)
            self._last_now = now
        now = self._last_now
        held = self._held.pop(ticket, None)
        if held is not None:
            conn_id, size = held
            self._used -= size
            conn = self._conns[conn_id]
            conn.held_bytes -= size
            conn.held.discard(ticket)
            if not conn.held and not conn.queued:  # _forget_if_idle, inline
                del self._conns[conn_id]
        elif ticket in self._queue:
            conn_id, _ = self._queue.pop(ticket)
            conn = self._conns[conn_id]
            conn.queued.discard(ticket)
            self._forget_if_idle(conn_id, conn)
        else:
            raise ValueError(f"ticket {ticket} is not outstanding (never issued, released already, or cancelled)")
        if not self._queue:
            # _settle, only when it has something to do: the pool is on and a depleted spell
            # may end (or go on: the bytes used may still be at or over capacity).
            if self._depleted_since is not None or (self._capacity > 0 and self._used >= self._capacity):
                self._settle(now)
            return []
        granted = self._grant_waiters()
        self._settle(now)
        return granted

    def cancel(self, conn_id: Hashable, now: float) -> list[int]:
        """The connection is gone: free all it holds, drop its waits; returns the queued tickets now granted, FIFO."""
        now = self._advance(now)
        conn = self._conns.pop(conn_id, None)
        if conn is None:
            return []
        for ticket in conn.held:
            self._used -= self._held.pop(ticket)[1]
        for ticket in conn.queued:
            del self._queue[ticket]
        granted = self._grant_waiters()
        self._settle(now)
        return granted

    # -- internals ------------------------------------------------------------

    def _wait_decision(self, conn_id: Hashable, size: int) -> Decision | None:
        """Why this request must wait (the pool is exhausted, or its connection's share), if it must."""
        if self._used >= self._capacity:
            key, limit = QUEUED_MAX_REQUEST_BYTES, self._capacity
            return self._wait(
                key,
                f"{key}={limit} exhausted ({self._used} bytes in use): a request of {size} bytes waits for memory",
                size,
            )
        return self._share_wait(conn_id, size)

    def _share_wait(self, conn_id: Hashable, size: int) -> Decision | None:
        """Why its connection's share (queued.max.request.bytes.per.connection) holds this request back, if it does."""
        conn = self._conns.get(conn_id)
        if conn is None:
            return None
        # Holding queued requests implies a share is set: with room in the pool only a share holds one back.
        key, limit = QUEUED_MAX_REQUEST_BYTES_PER_CONNECTION, self._per_connection
        if conn.queued:
            reason = f"{key}={limit}: a request of {size} bytes waits behind its connection's earlier one"
        elif self._over_share(conn, size):
            reason = (
                f"{key}={limit}: the connection holds {conn.held_bytes} bytes; a request of {size} bytes waits for them"
            )
        else:
            return None
        return self._wait(key, reason, size)

    def _wait(self, key: str, reason: str, size: int) -> Decision:
        return Decision(
            Policy.MEMORY_POOL,
            Action.WAIT,
            self._mode,
            key,
            reason,
            limit=self._capacity if key == QUEUED_MAX_REQUEST_BYTES else self._per_connection,
            subject={"size": size, "used": self._used, "capacity": self._capacity},
        )

    def _over_share(self, conn: _Conn, size: int) -> bool:
        return 0 < self._per_connection < conn.held_bytes + size and conn.held_bytes > 0

    def _grant_waiters(self) -> list[int]:
        granted: list[int] = []
        held_back: set[Hashable] = set()
        for ticket, (conn_id, size) in list(self._queue.items()):
            if self._used >= self._capacity:
                break  # the pool refuses the head of the queue: everyone behind waits too
            conn = self._conns[conn_id]
            if conn_id in held_back or self._over_share(conn, size):
                held_back.add(conn_id)  # its later requests stay behind it; others go ahead
                continue
            del self._queue[ticket]
            conn.queued.discard(ticket)
            self._grant(ticket, conn_id, size)
            granted.append(ticket)
        return granted

    def _conn(self, conn_id: Hashable) -> _Conn:
        conn = self._conns.get(conn_id)
        if conn is None:
            conn = self._conns[conn_id] = _Conn()
        return conn

    def _grant(self, ticket: int, conn_id: Hashable, size: int) -> None:
        self._held[ticket] = (conn_id, size)
        conn = self._conn(conn_id)
        conn.held.add(ticket)
        conn.held_bytes += size
        self._used += size
        if self._used > self._window_high_water_mark:
            self._window_high_water_mark = self._used
            self._high_water_mark = max(self._high_water_mark, self._used)

    def _forget_if_idle(self, conn_id: Hashable, conn: _Conn) -> None:
        if not conn.held and not conn.queued:
            del self._conns[conn_id]

    def _advance(self, now: float) -> float:
        if now > self._last_now:
            self._last_now = now
        return self._last_now

    def _settle(self, now: float) -> None:
        depleted = self.enabled and self._used >= self._capacity
        if depleted and self._depleted_since is None:
            self._depleted_since = now
        elif not depleted and self._depleted_since is not None:
            self._depleted_total += now - self._depleted_since
            self._depleted_since = None


def decide_body_timeout(size: int, timeout_ms: int, waiting_for: str) -> Decision:
    """``request.body.timeout.ms`` passed with a frame's memory or body still to come (``waiting_for``:
    "pool memory" or "its body"): the connection is closed, in every mode, so that a stalled sender
    holds neither memory nor a place in the pool's queue for long."""
    return Decision(
        Policy.MEMORY_POOL,
        Action.CLOSE,
        Mode.ENFORCE,
        REQUEST_BODY_TIMEOUT_MS,
        f"a {size}-byte request did not complete within {REQUEST_BODY_TIMEOUT_MS}={timeout_ms} "
        f"(waiting for {waiting_for})",
        limit=timeout_ms,
        subject={"size": size},
    )
