"""Connection quotas (sans-I/O): Kafka's ``ConnectionQuotas`` plus KIP-1015's TLS cap.

Mirrors the broker-side connection limits of Apache Kafka:

* ``max.connections`` -- all listeners together; connections on a *protected*
  listener (Kafka: the inter-broker listener when there is more than one) are
  neither counted nor capped by it.
* ``listener.name.<listener>.max.connections`` -- one listener (protected ones
  included, as in Kafka).
* ``max.connections.per.ip`` and ``max.connections.per.ip.overrides`` -- a
  connection over its address's limit is refused at once (Kafka's
  ``TooManyConnectionsException``); nothing is ever closed for this limit.
* ``max.ssl.connections`` (KIP-1015) -- all TLS connections on non-protected
  listeners together; plaintext connections are never affected by it.
* ``connections.max.idle.ms`` -- Kafka's ``Selector`` idle expiry: a connection
  with no request in flight whose last activity is *more* than that long ago is
  closed; a negative value turns idle expiry off (as in Kafka).

At a listener, broker-wide or TLS cap the connection is admitted by closing the
least-recently-used idle connection of the class that is full (KIP-1015: "we
will use the LRU algorithm to close connections"; Kafka's
``Selector.lowestPriorityChannel``: a closing channel first, then the least
recently used one). If nothing can be closed the answer is a WAIT: the shell
stops accepting on that listener, as Kafka's acceptor blocks in
``waitForConnectionSlot``, and asks again after a connection closes, turns
idle, or the limits change.

Decisions are :class:`policies.decision.Decision` values (``Policy.CONNECTIONS``):
``on_accept`` answers None (admitted), REFUSE (per-IP limit), WAIT (a cap is full
and nothing idle can be closed) or EVICT (admitted; ``victims`` are to be closed);
``idle_expired``, ``update_limits`` and ``reclaim_excess`` answer one CLOSE per
connection to close (``victims=(conn_id,)``).

Counting. A connection is counted from the moment it is admitted (None or
EVICT) until the shell reports ``on_closed``. A connection the
policy told the shell to close is *closing*: it is still counted (see
``counts()``), but it has already given up its slot -- caps compare
``count - closing`` with the limit. That is Kafka's "a closing channel first":
such a connection is always the first to make room, and it is never named for
closing twice. So once the shell has closed what it was told to close, no count
is above its cap (ENFORCE mode; but see lowering, below).

Differences from Kafka, on purpose:

* Kafka's acceptor blocks at a listener or broker-wide cap and closes LRU
  connections only when a protected listener pushes the total over
  ``max.connections``; here every cap makes room by LRU closing, as KIP-1015
  proposes, and only waits when there is nothing idle to close.
* A connection with a request in flight is never closed to make room (Kafka's
  ``lowestPriorityChannel`` would fall back to any channel).
* The per-IP limit is checked before the caps, so a connection that would be
  refused never costs another client its connection.
* Kafka counts protected-listener connections in ``max.connections`` and
  closes client connections to make room for them; here they are not counted
  (nor in ``max.ssl.connections``), so inter-broker traffic never costs a
  client its connection.

Lowering a limit (``update_limits``) closes the excess at once, LRU-first among
idle connections. Busy connections are not closed, so the count may stay above
the new limit (``over_cap``); new connections of that class then WAIT (or must
evict enough idle connections to land at the limit) and ``reclaim_excess()`` --
the analogue of Kafka's per-poll ``closeExcessConnections`` -- closes each
over-the-limit connection as soon as it turns idle. The excess also shrinks as
clients disconnect. Lowering a per-IP limit never closes anything (Kafka
doesn't either); it only refuses new connections.

Time is the caller's: every ``now`` is in seconds from any monotonic clock.
Activity order is the order of calls (``now`` is clamped to be non-decreasing).

In ``Mode.OBSERVE`` nothing is refused, closed or made to wait: every
connection is admitted and counted, and the decision (``mode=Mode.OBSERVE``)
names what ENFORCE would have done; its victims are not marked closing, and
CLOSE decisions are reports for the shell to count, not carry out. So the shell
admits a connection iff ``d is None or d.action is Action.EVICT or not
d.enforced``. Counts track the real connections, so they may exceed the caps --
that is the point of a dry run. Idle expiry (``connections.max.idle.ms``) is not
a cap but the proxy's own hygiene, as it is the broker's: it closes in both
modes, or a silent client would be held for ever in a dry run.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from policies.api_keys import INT_MAX
from policies.decision import Action, Decision, Policy
from policies.mode import Mode
from policies.properties import (
    CONNECTIONS_MAX_IDLE_MS as CONNECTIONS_MAX_IDLE_MS,  # also named from here by proxy/serve/passthrough.py
)
from policies.properties import (
    LONG_MAX,
    LONG_MIN,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_IP,
    MAX_CONNECTIONS_PER_IP_OVERRIDES,
    MAX_SSL_CONNECTIONS,
    int_default,
    per_listener,
)

_NO_SUBJECT: Mapping[str, object] = MappingProxyType({})


def listener_max_connections_key(listener: str) -> str:
    """Kafka's per-listener key, e.g. ``listener.name.external.max.connections``."""
    return per_listener(listener, MAX_CONNECTIONS)


def _check_int(key: str, value: object, low: int, high: int = INT_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be an integer, got {value!r}")
    if value < low:
        raise ValueError(f"{key} must be >= {low}, got {value}")
    if value > high:
        raise ValueError(f"{key} must be <= {high}, got {value}")
    return value


# ---------------------------------------------------------------------------
# Limits


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The connection limits, validated as Kafka validates them.

    ``max.connections``, ``max.connections.per.ip`` (and each override) and
    ``max.ssl.connections`` are ``atLeast(0)``; a listener's ``max.connections``
    must be > 0 (Kafka's ``ListenerConnectionQuota``); ``max.connections.per.ip``
    may be 0 only when overrides are set; int limits are at most 2147483647.
    Mappings are copied and frozen.
    """

    max_connections: int = int_default(MAX_CONNECTIONS)
    max_connections_per_ip: int = int_default(MAX_CONNECTIONS_PER_IP)
    max_connections_per_ip_overrides: Mapping[str, int] = field(default_factory=dict)
    max_ssl_connections: int = int_default(MAX_SSL_CONNECTIONS)
    listener_max_connections: Mapping[str, int] = field(default_factory=dict)
    connections_max_idle_ms: int = int_default(CONNECTIONS_MAX_IDLE_MS)

    def __post_init__(self) -> None:
        _check_int(MAX_CONNECTIONS, self.max_connections, 0)
        _check_int(MAX_CONNECTIONS_PER_IP, self.max_connections_per_ip, 0)
        _check_int(MAX_SSL_CONNECTIONS, self.max_ssl_connections, 0)
        _check_int(CONNECTIONS_MAX_IDLE_MS, self.connections_max_idle_ms, LONG_MIN, LONG_MAX)
        overrides: dict[str, int] = {}
        for ip, limit in dict(self.max_connections_per_ip_overrides).items():
            if not isinstance(ip, str) or not ip:
                raise ValueError(f"{MAX_CONNECTIONS_PER_IP_OVERRIDES} keys must be non-empty addresses, got {ip!r}")
            overrides[ip] = _check_int(f"{MAX_CONNECTIONS_PER_IP_OVERRIDES}[{ip}]", limit, 0)
        if self.max_connections_per_ip == 0 and not overrides:
            raise ValueError(
                f"{MAX_CONNECTIONS_PER_IP} can be set to zero only if {MAX_CONNECTIONS_PER_IP_OVERRIDES} is set"
            )
        listeners: dict[str, int] = {}
        for listener, limit in dict(self.listener_max_connections).items():
            if not isinstance(listener, str) or not listener:
                raise ValueError(f"listener names must be non-empty strings, got {listener!r}")
            listeners[listener] = _check_int(listener_max_connections_key(listener), limit, 1)
        object.__setattr__(self, "max_connections_per_ip_overrides", MappingProxyType(overrides))
        object.__setattr__(self, "listener_max_connections", MappingProxyType(listeners))

    def __hash__(self) -> int:
        return hash(
            (
                self.max_connections,
                self.max_connections_per_ip,
                frozenset(self.max_connections_per_ip_overrides.items()),
                self.max_ssl_connections,
                frozenset(self.listener_max_connections.items()),
                self.connections_max_idle_ms,
            )
        )

    def per_ip_limit(self, ip: str) -> tuple[int, str]:
        """The limit for ``ip`` and the key it comes from."""
        override = self.max_connections_per_ip_overrides.get(ip)
        if override is not None:
            return override, MAX_CONNECTIONS_PER_IP_OVERRIDES
        return self.max_connections_per_ip, MAX_CONNECTIONS_PER_IP

    def listener_limit(self, listener: str) -> int:
        """``listener.name.<listener>.max.connections`` (INT_MAX when unset)."""
        return self.listener_max_connections.get(listener, INT_MAX)


# ---------------------------------------------------------------------------
# Counts


@dataclass(frozen=True, slots=True)
class ConnectionCounts:
    """A snapshot for metrics. All counts include closing connections."""

    total: int  # every connection, protected listeners included
    broker: int  # non-protected: what max.connections counts
    ssl: int  # non-protected TLS: what max.ssl.connections counts (KIP-1015 metric)
    closing: int  # told to close, not yet reported closed
    busy: int  # with a request in flight
    listeners: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class OpenCounts:
    """What the limits counted right after a connection was admitted, itself included: the live
    counts (closing connections left out) that ``max.connections`` and ``max.ssl.connections``
    compare (None where the connection does not count against the cap: a protected listener, or
    plaintext for the TLS cap), and the count of its IP (``max.connections.per.ip``). The audit
    records them, so the report can tell which connections a lower limit would have refused.
    ``node_id``: the broker whose limits counted it (cluster mode, node ports and bootstrap-port
    connections to a known broker; None for the ``BOOTSTRAP`` pool and sidecar mode)."""

    broker: int | None
    ssl: int | None
    ip: int
    node_id: int | None = None


# ---------------------------------------------------------------------------
# The policy


class _Conn:
    __slots__ = ("closing", "conn_id", "idle", "in_flight", "ip", "last", "listener", "protected", "seq", "tls")

    def __init__(
        self,
        conn_id: str,
        listener: str,
        ip: str,
        tls: bool,
        protected: bool,
        now: float,
        seq: int,
        idle: OrderedDict[str, _Conn],
    ) -> None:
        self.conn_id = conn_id
        self.listener = listener
        self.ip = ip
        self.tls = tls
        self.protected = protected
        self.in_flight = 0
        self.last = now
        self.seq = seq
        self.closing = False
        # The idle connections of its cell (listener, TLS), LRU first: where it sits while idle
        # and not closing (held here, not looked up per request).
        self.idle = idle


_Cell = tuple[str, bool]  # (listener, tls): connections that belong to the same caps


class _Cursor:
    """Walks one cell's idle connections in LRU order without mutating them."""

    __slots__ = ("head", "it", "keys")

    def __init__(self, it: Iterator[_Conn], keys: list[str]) -> None:
        self.it = it
        self.keys = keys
        self.head: _Conn | None = next(it, None)


class ConnectionQuotas:
    """Kafka's connection quotas and the KIP-1015 TLS cap, as a sans-I/O object.

    ``protected_listeners`` are exempt from ``max.connections`` and
    ``max.ssl.connections`` (Kafka protects the inter-broker listener).
    """

    def __init__(
        self,
        limits: ConnectionLimits | None = None,
        *,
        mode: Mode = Mode.ENFORCE,
        protected_listeners: Iterable[str] = (),
    ) -> None:
        self.mode = mode
        self._limits = limits if limits is not None else ConnectionLimits()
        self._protected = frozenset(protected_listeners)
        self._conns: dict[str, _Conn] = {}
        # idle (no request in flight), not closing; LRU first
        self._idle: dict[_Cell, OrderedDict[str, _Conn]] = {}
        self._ip_count: dict[str, int] = {}
        self._listener_count: dict[str, int] = {}
        self._listener_closing: dict[str, int] = {}
        self._broker_count = 0
        self._broker_closing = 0
        self._ssl_count = 0
        self._ssl_closing = 0
        self._closing = 0
        self._busy = 0
        self._seq = 0
        self._now = float("-inf")
        # the caps whose live count is above their limit now (kept current per change: over_cap is O(1))
        self._over: set[str] = set()

    # -- introspection -----------------------------------------------------

    @property
    def limits(self) -> ConnectionLimits:
        """The limits in force."""
        return self._limits

    @property
    def protected_listeners(self) -> frozenset[str]:
        """Listeners exempt from ``max.connections`` and ``max.ssl.connections``."""
        return self._protected

    def __len__(self) -> int:
        return len(self._conns)

    def __contains__(self, conn_id: object) -> bool:
        return conn_id in self._conns

    def is_closing(self, conn_id: str) -> bool:
        """Told to close (still counted until ``on_closed``)."""
        conn = self._conns.get(conn_id)
        return conn is not None and conn.closing

    def in_flight(self, conn_id: str) -> int:
        """Requests in flight on ``conn_id`` (0 for unknown ids)."""
        conn = self._conns.get(conn_id)
        return 0 if conn is None else conn.in_flight

    def ip_count(self, ip: str) -> int:
        """Connections counted for ``ip``, protected and closing ones included."""
        return self._ip_count.get(ip, 0)

    def open_counts(self, conn_id: str) -> OpenCounts:
        """What each limit counts now, with ``conn_id`` (admitted, not closing) among them."""
        conn = self._conns[conn_id]
        ip = self._ip_count[conn.ip]
        if conn.protected:
            return OpenCounts(None, None, ip)
        return OpenCounts(self._live_broker(), self._live_ssl() if conn.tls else None, ip)

    def counts(self) -> ConnectionCounts:
        """A snapshot of the counts, for metrics."""
        return ConnectionCounts(
            total=len(self._conns),
            broker=self._broker_count,
            ssl=self._ssl_count,
            closing=self._closing,
            busy=self._busy,
            listeners=MappingProxyType({k: v for k, v in self._listener_count.items() if v}),
        )

    # -- admission -----------------------------------------------------------

    def on_accept(self, conn_id: str, *, listener: str, ip: str, tls: bool, now: float) -> Decision | None:
        """Decide on a new connection: None admits it; otherwise a REFUSE, WAIT or EVICT decision.

        An admitted connection (None, EVICT, or any OBSERVE decision) is counted from now
        on; EVICT's victims are closing from now on (ENFORCE only). An enforced REFUSE or
        WAIT counts nothing, so the shell may call this again with the same ``conn_id``
        for a waiting connection.
        """
        if conn_id in self._conns:
            raise ValueError(f"connection {conn_id!r} is already counted")
        now = self._tick(now)
        decision = self._decide(listener, ip, tls)
        if decision is None or not decision.enforced:
            self._register(conn_id, listener, ip, tls, now)
        elif decision.action is Action.EVICT:
            for victim in decision.victims:
                self._mark_closing(self._conns[victim])
            self._register(conn_id, listener, ip, tls, now)
        return decision

    def _decide(self, listener: str, ip: str, tls: bool) -> Decision | None:
        """What to do with a new connection, in this policy's mode, without changing anything."""
        limit, key = self._limits.per_ip_limit(ip)
        if self._ip_count.get(ip, 0) >= limit:
            where = f"[{ip}]" if key == MAX_CONNECTIONS_PER_IP_OVERRIDES else ""
            reason = f"{key}{where}={limit} reached for {ip}"
            return self._decision(Action.REFUSE, key, reason, limit, subject={"ip": ip})
        protected = listener in self._protected
        needs: dict[str, int] = {}
        for key, live, limit in self._caps_for(listener, tls, protected):
            if live >= limit:
                needs[key] = live - limit + 1
        if not needs:
            return None
        victims, unmet = self._select_victims(needs)
        if unmet:
            key = next(k for k in needs if k in unmet)
            limit = self._cap_limit(key)
            reason = f"{key}={limit} reached; no idle {_scope(key, listener)} connection to close"
            return self._decision(Action.WAIT, key, reason, limit)
        first = next(iter(needs))
        reached = "; ".join(f"{k}={self._cap_limit(k)} reached" for k in needs)
        what = (
            "the least recently used idle connection"
            if len(victims) == 1
            else f"the {len(victims)} least recently used idle connections"
        )
        return self._decision(
            Action.EVICT,
            first,
            f"{reached}: closing {what}",
            self._cap_limit(first),
            victims=tuple(v.conn_id for v, _ in victims),
        )

    def _decision(
        self,
        action: Action,
        limit_key: str,
        reason: str,
        limit: int,
        *,
        victims: tuple[str, ...] = (),
        subject: Mapping[str, object] = _NO_SUBJECT,
        mode: Mode | None = None,
    ) -> Decision:
        return Decision(
            Policy.CONNECTIONS,
            action,
            self.mode if mode is None else mode,
            limit_key,
            reason,
            limit=limit,
            victims=victims,
            subject=subject,
        )

    # -- activity ------------------------------------------------------------

    def on_request(self, conn_id: str, now: float) -> None:
        """A request started on ``conn_id``: one more in flight, active now. Unknown ids are ignored."""
        conn = self._conns.get(conn_id)
        if conn is None:
            return
        # The connection's activity (its time and LRU sequence), written out here and in
        # on_response rather than in a helper: both run per request.
        if now > self._now:
            self._now = now
        conn.last = self._now
        self._seq += 1
        conn.seq = self._seq
        if conn.in_flight == 0:
            self._busy += 1
            if not conn.closing:
                conn.idle.pop(conn_id, None)
        conn.in_flight += 1

    def on_response(self, conn_id: str, now: float) -> None:
        """A response went out on ``conn_id``: one fewer in flight, active now. Unknown ids are ignored."""
        conn = self._conns.get(conn_id)
        if conn is None:
            return
        if now > self._now:  # its activity, as in on_request
            self._now = now
        conn.last = self._now
        self._seq += 1
        conn.seq = self._seq
        if conn.in_flight > 0:
            conn.in_flight -= 1
            if conn.in_flight == 0:
                self._busy -= 1
                if not conn.closing:
                    conn.idle[conn_id] = conn
        elif not conn.closing:
            conn.idle.move_to_end(conn_id)

    def on_closed(self, conn_id: str) -> None:
        """The connection is gone (closed by us or by the peer); it stops counting. Idempotent."""
        conn = self._conns.pop(conn_id, None)
        if conn is None:
            return
        if conn.in_flight:
            self._busy -= 1
        if conn.closing:
            self._closing -= 1
            self._listener_closing[conn.listener] -= 1
            if not conn.protected:
                self._broker_closing -= 1
                if conn.tls:
                    self._ssl_closing -= 1
        elif not conn.in_flight:
            conn.idle.pop(conn_id, None)  # absent when sync_activity did not report it idle
        left = self._ip_count[conn.ip] - 1
        if left:
            self._ip_count[conn.ip] = left
        else:
            del self._ip_count[conn.ip]
        self._listener_count[conn.listener] -= 1
        if not conn.protected:
            self._broker_count -= 1
            if conn.tls:
                self._ssl_count -= 1
        if self._over:
            self._recheck(conn)

    def hand_over(self, conn_ids: Iterable[str], other: ConnectionQuotas) -> None:
        """Count these connections in ``other`` from now on, as they were here: busy or idle,
        closing or not, last active when they were, in the same LRU order. Unknown ids are skipped."""
        conns = sorted((c for c in map(self._conns.get, conn_ids) if c is not None), key=lambda c: c.seq)
        for conn in conns:
            self.on_closed(conn.conn_id)
            other._adopt(conn)

    def _adopt(self, conn: _Conn) -> None:
        self._register(conn.conn_id, conn.listener, conn.ip, conn.tls, conn.last)
        mine = self._conns[conn.conn_id]
        if conn.in_flight:
            self._busy += 1
            del mine.idle[conn.conn_id]
            mine.in_flight = conn.in_flight
        if conn.closing:
            self._mark_closing(mine)

    # -- activity known elsewhere (workers: the owner counts, the workers see the requests) --

    def room_needed(self, listener: str, ip: str, tls: bool) -> int:
        """How many connections a new one of this kind would have some cap lose (the largest need
        of any cap that is full), without changing anything: 0 when it is admitted or refused
        (per IP) as it is. Only then does ``on_accept`` read activity (``_select_victims``)."""
        limit, _ = self._limits.per_ip_limit(ip)
        if self._ip_count.get(ip, 0) >= limit:
            return 0
        caps = self._caps_for(listener, tls, listener in self._protected)
        return max((live - limit + 1 for _, live, limit in caps if live >= limit), default=0)

    def excess(self) -> int:
        """The largest excess of any cap over its limit (what ``reclaim_excess`` would close), 0 if none."""
        return max(self._excess().values(), default=0)

    def sync_activity(self, idle: Mapping[str, float]) -> None:
        """The connections' activity is seen elsewhere: the idle ones are exactly those in ``idle``,
        each last active at the time given (any one clock), and every other is to be treated as
        busy (never a candidate to close) until the next sync. The LRU order of the candidates is
        the order of those times. Counts do not change; ids unknown or closing are skipped. Feed no
        ``on_request``/``on_response`` to a policy synced this way: its activity is the caller's."""
        for pool in self._idle.values():
            pool.clear()
        conns = self._conns
        known = sorted((t, conn_id) for conn_id, t in idle.items() if conn_id in conns)
        for t, conn_id in known:
            conn = conns[conn_id]
            if conn.closing or conn.in_flight:
                continue
            conn.last = t
            self._seq += 1
            conn.seq = self._seq
            conn.idle[conn_id] = conn

    # -- slots lent out (workers: a worker admits from its lease, see SlotLeases) --

    def rooms(self, listener: str, ip: str, tls: bool) -> dict[str, int]:
        """How many more connections of this kind each limit it counts against has room for:
        ``limit - live`` for its listener's cap, ``max.connections`` and ``max.ssl.connections``
        (those it counts against; a listener without a cap has INT_MAX), ``limit - count`` for its
        IP's limit. Keyed as ``lease_keys`` names them. Changes nothing."""
        protected = listener in self._protected
        limit, _ = self._limits.per_ip_limit(ip)
        rooms = {
            _listener_lease_key(listener): self._limits.listener_limit(listener) - self._live_listener(listener),
            _ip_lease_key(ip): limit - self._ip_count.get(ip, 0),
        }
        if not protected:
            rooms[MAX_CONNECTIONS] = self._limits.max_connections - self._live_broker()
            if tls:
                rooms[MAX_SSL_CONNECTIONS] = self._limits.max_ssl_connections - self._live_ssl()
        return rooms

    def on_leased(self, conn_id: str, *, listener: str, ip: str, tls: bool, now: float) -> None:
        """Count ``conn_id``, admitted elsewhere from a slot leased out of these quotas (its
        admission was the None ``on_accept`` would have answered: SlotLeases keeps every limit
        with room for every slot leased). Nothing is decided; it counts as an admitted one."""
        if conn_id in self._conns:
            raise ValueError(f"connection {conn_id!r} is already counted")
        self._register(conn_id, listener, ip, tls, self._tick(now))

    def idle_lru(self, per_cell: int) -> list[tuple[str, float]]:
        """Up to ``per_cell`` idle, non-closing connections of each (listener, TLS) cell, least
        recently used first, with their last activity: what an owner syncs with (``sync_activity``)."""
        out: list[tuple[str, float]] = []
        for pool in self._idle.values():
            for n, conn in enumerate(pool.values()):
                if n >= per_cell:
                    break
                out.append((conn.conn_id, conn.last))
        return out

    # -- closing -------------------------------------------------------------

    def idle_expired(self, now: float) -> list[Decision]:
        """Connections idle for more than ``connections.max.idle.ms``, LRU first: one CLOSE each,
        enforced in either mode (see the module docstring); they are closing from now on.
        Cost: O(listeners + expired).
        """
        return self._expire_idle(now, skip=frozenset())

    def _expire_idle(self, now: float, *, skip: AbstractSet[str]) -> list[Decision]:
        now = self._tick(now)
        max_idle_ms = self._limits.connections_max_idle_ms
        if max_idle_ms < 0:
            return []
        idle_s = max_idle_ms / 1000.0
        expired: list[_Conn] = []
        for pool in self._idle.values():
            for conn in pool.values():
                if not now - conn.last > idle_s:
                    break
                if conn.conn_id not in skip:
                    expired.append(conn)
        expired.sort(key=lambda c: c.seq)
        closes: list[Decision] = []
        for conn in expired:
            reason = f"{CONNECTIONS_MAX_IDLE_MS}={max_idle_ms} exceeded (idle {now - conn.last:.3f}s)"
            self._mark_closing(conn)
            closes.append(
                self._decision(
                    Action.CLOSE,
                    CONNECTIONS_MAX_IDLE_MS,
                    reason,
                    max_idle_ms,
                    victims=(conn.conn_id,),
                    mode=Mode.ENFORCE,
                )
            )
        return closes

    def next_idle_deadline(self) -> float | None:
        """When the next idle connection expires (call ``idle_expired`` after it); None if never."""
        max_idle_ms = self._limits.connections_max_idle_ms
        if max_idle_ms < 0:
            return None
        oldest: float | None = None
        for pool in self._idle.values():
            for conn in pool.values():
                if oldest is None or conn.last < oldest:
                    oldest = conn.last
                break
        return None if oldest is None else oldest + max_idle_ms / 1000.0

    def update_limits(self, limits: ConnectionLimits, now: float) -> list[Decision]:
        """Apply new limits (dynamic broker config); returns one CLOSE per connection to close now.

        Raising takes effect at once (the shell should retry waiting
        connections). Lowering closes the excess of each cap, LRU-first among
        idle connections of that class; busy connections stay (see the module
        docstring and ``over_cap``). A lowered ``connections.max.idle.ms``
        expires connections now past it, in either mode; in OBSERVE the caps' closings
        are reports only.
        """
        if not isinstance(limits, ConnectionLimits):
            raise TypeError(f"limits must be ConnectionLimits, got {type(limits).__name__}")
        self._tick(now)
        self._limits = limits
        closes = self._close_excess(observe=self.mode is Mode.OBSERVE)
        self._over = set(self._excess())
        return closes + self._expire_idle(now, skip={c.victims[0] for c in closes})

    @property
    def over_cap(self) -> bool:
        """ENFORCE: some cap is exceeded, by busy connections left over a lowered limit. O(1).

        While it is true the shell should call ``reclaim_excess()`` when a
        connection turns idle; it turns false once the excess is closed or gone.
        Always false in OBSERVE (exceeding caps is expected there).
        """
        return bool(self._over) and self.mode is Mode.ENFORCE

    def reclaim_excess(self) -> list[Decision]:
        """Close idle connections while a cap is exceeded (Kafka's ``closeExcessConnections``): one CLOSE each.

        A cap is exceeded only after it was lowered below the busy connections
        of its class (``over_cap``); call this after ``on_response`` while
        ``over_cap``. Empty in OBSERVE mode.
        """
        if self.mode is Mode.OBSERVE or not self._over:
            return []
        return self._close_excess(observe=False)

    def _excess(self) -> dict[str, int]:
        """By how many live (not closing) connections each exceeded cap is over its limit."""
        needs: dict[str, int] = {}
        for listener, limit in self._limits.listener_max_connections.items():
            live = self._live_listener(listener)
            if live > limit:
                needs[listener_max_connections_key(listener)] = live - limit
        ssl_live = self._live_ssl()
        if ssl_live > self._limits.max_ssl_connections:
            needs[MAX_SSL_CONNECTIONS] = ssl_live - self._limits.max_ssl_connections
        broker_live = self._live_broker()
        if broker_live > self._limits.max_connections:
            needs[MAX_CONNECTIONS] = broker_live - self._limits.max_connections
        return needs

    def _close_excess(self, *, observe: bool) -> list[Decision]:
        needs = self._excess()
        if not needs:
            return []
        victims, _ = self._select_victims(needs)
        closes: list[Decision] = []
        for conn, key in victims:
            if not observe:
                self._mark_closing(conn)
            limit = self._cap_limit(key)
            reason = f"{key}={limit} exceeded: closing the least recently used idle connection"
            closes.append(self._decision(Action.CLOSE, key, reason, limit, victims=(conn.conn_id,)))
        return closes

    # -- internals -----------------------------------------------------------

    def _tick(self, now: float) -> float:
        if now > self._now:
            self._now = now
        return self._now

    def _register(self, conn_id: str, listener: str, ip: str, tls: bool, now: float) -> None:
        protected = listener in self._protected
        self._seq += 1
        cell = (listener, tls)
        idle = self._idle.get(cell)
        if idle is None:
            idle = self._idle[cell] = OrderedDict()
        conn = _Conn(conn_id, listener, ip, tls, protected, now, self._seq, idle)
        self._conns[conn_id] = conn
        idle[conn_id] = conn
        self._ip_count[ip] = self._ip_count.get(ip, 0) + 1
        self._listener_count[listener] = self._listener_count.get(listener, 0) + 1
        self._listener_closing.setdefault(listener, 0)
        if not protected:
            self._broker_count += 1
            if tls:
                self._ssl_count += 1
        self._recheck(conn)

    def _mark_closing(self, conn: _Conn) -> None:
        if conn.closing:
            raise AssertionError(f"connection {conn.conn_id!r} is already closing")
        conn.closing = True
        self._closing += 1
        if not conn.in_flight:
            conn.idle.pop(conn.conn_id, None)  # absent when sync_activity did not report it idle
        self._listener_closing[conn.listener] += 1
        if not conn.protected:
            self._broker_closing += 1
            if conn.tls:
                self._ssl_closing += 1
        if self._over:
            self._recheck(conn)

    def _recheck(self, conn: _Conn) -> None:
        """Keep ``_over`` current for the caps ``conn`` counts against, after their counts changed."""
        listener_limit = self._limits.listener_max_connections.get(conn.listener)
        if listener_limit is not None:
            live = self._live_listener(conn.listener)
            self._flag(listener_max_connections_key(conn.listener), live > listener_limit)
        if not conn.protected:
            if conn.tls:
                self._flag(MAX_SSL_CONNECTIONS, self._live_ssl() > self._limits.max_ssl_connections)
            self._flag(MAX_CONNECTIONS, self._live_broker() > self._limits.max_connections)

    def _flag(self, key: str, over: bool) -> None:
        if over:
            self._over.add(key)
        else:
            self._over.discard(key)

    def _caps_for(self, listener: str, tls: bool, protected: bool) -> list[tuple[str, int, int]]:
        """(key, live count, limit) of each cap a connection of this kind counts against, most specific first."""
        caps: list[tuple[str, int, int]] = []
        listener_limit = self._limits.listener_max_connections.get(listener)
        if listener_limit is not None:
            caps.append((listener_max_connections_key(listener), self._live_listener(listener), listener_limit))
        if not protected:
            if tls:
                caps.append((MAX_SSL_CONNECTIONS, self._live_ssl(), self._limits.max_ssl_connections))
            caps.append((MAX_CONNECTIONS, self._live_broker(), self._limits.max_connections))
        return caps

    # Live counts: what the caps compare with their limits (closing connections have given up their slot).
    def _live_listener(self, listener: str) -> int:
        return self._listener_count.get(listener, 0) - self._listener_closing.get(listener, 0)

    def _live_ssl(self) -> int:
        return self._ssl_count - self._ssl_closing

    def _live_broker(self) -> int:
        return self._broker_count - self._broker_closing

    def _cap_limit(self, key: str) -> int:
        if key == MAX_CONNECTIONS:
            return self._limits.max_connections
        if key == MAX_SSL_CONNECTIONS:
            return self._limits.max_ssl_connections
        for listener, limit in self._limits.listener_max_connections.items():
            if listener_max_connections_key(listener) == key:
                return limit
        return INT_MAX

    def _cell_caps(self, listener: str, tls: bool) -> list[str]:
        keys: list[str] = []
        if listener in self._limits.listener_max_connections:
            keys.append(listener_max_connections_key(listener))
        if listener not in self._protected:
            if tls:
                keys.append(MAX_SSL_CONNECTIONS)
            keys.append(MAX_CONNECTIONS)
        return keys

    def _select_victims(self, needs: Mapping[str, int]) -> tuple[list[tuple[_Conn, str]], dict[str, int]]:
        """Pick idle, non-closing connections so that each cap ``k`` loses ``needs[k]``.

        Greedy: each pick is the least recently used connection among those
        that relieve the most caps still in need; it relieves every cap it
        counts against. A cap stays unmet only when its class has too few idle
        connections. Returns the picks (with the cap each was taken for) and
        the unmet needs; changes nothing.
        """
        remaining = {k: n for k, n in needs.items() if n > 0}
        cursors: list[_Cursor] = []
        for (listener, tls), pool in self._idle.items():
            if not pool:
                continue
            keys = [k for k in self._cell_caps(listener, tls) if k in remaining]
            if keys:
                cursors.append(_Cursor(iter(pool.values()), keys))
        victims: list[tuple[_Conn, str]] = []
        while remaining:
            best: _Cursor | None = None
            best_rank = (0, 0)
            for cursor in cursors:
                if cursor.head is None:
                    continue
                cover = sum(1 for k in cursor.keys if k in remaining)
                if not cover:
                    continue
                rank = (-cover, cursor.head.seq)
                if best is None or rank < best_rank:
                    best, best_rank = cursor, rank
            if best is None or best.head is None:
                break
            taken_for = next(k for k in best.keys if k in remaining)
            victims.append((best.head, taken_for))
            for k in best.keys:
                if k in remaining:
                    remaining[k] -= 1
                    if remaining[k] == 0:
                        del remaining[k]
            best.head = next(best.it, None)
        return victims, remaining


def _scope(key: str, listener: str) -> str:
    if key == MAX_SSL_CONNECTIONS:
        return "TLS"
    if key == MAX_CONNECTIONS:
        return "non-protected"
    return listener


# ---------------------------------------------------------------------------
# Per upstream broker

BOOTSTRAP = "bootstrap"  # the pool of sidecar mode's one port, and of bootstrap-port connections to no known broker

BrokerKey = int | str  # a broker's node id, or BOOTSTRAP


def broker_address(host: str, port: int) -> str:
    """How a bootstrap server and an advertised broker address are compared (host names ignore case)."""
    return f"{host.lower()}:{port}"


def bootstrap_broker(
    servers: Sequence[tuple[str, int]],
    node_at: Callable[[str, int], int | None],
    backing_off: Callable[[str, int], bool],
) -> BrokerKey:
    """The broker a cluster-mode bootstrap-port connection counts against, decided at accept.

    The shell would connect it to the first bootstrap server it does not back off from (the
    first server when it backs off from all: that one fails first), so that server's broker is the
    one it reaches: the node that advertises that ``host:port`` (``node_at``). The shell then
    connects it to that node alone, as a node-port connection, so it counts where it really lands,
    and admission is decided against that pool. BOOTSTRAP (a pool of its own, reached through
    every bootstrap server in turn) when no broker is known yet, or the server is no advertised
    broker (a load balancer, a name other than the one the broker advertises).
    """
    first = next((server for server in servers if not backing_off(*server)), servers[0] if servers else None)
    node = None if first is None else node_at(*first)
    return BOOTSTRAP if node is None else node


class BrokerQuotas:
    """One :class:`ConnectionQuotas` per upstream broker, as each Kafka broker counts its own connections.

    In cluster mode a connection counts only against the caps, per-IP counts and LRU pool of the
    broker it reaches: a node port's node id, or for the bootstrap port the broker
    :func:`bootstrap_broker` names at accept (the shell then connects it to that broker alone).
    Bootstrap-port connections accepted before any broker is known, or whose server is no
    advertised broker, count in a pool of their own (key ``BOOTSTRAP``). Sidecar mode has only that
    one pool, so it counts as before.

    A BOOTSTRAP-pool connection whose broker becomes known (``on_reached``: the address it
    connected to; ``on_broker_known``: the broker at an address) moves to that broker's pool only
    while the broker has no connection counted: the ones that move are some of a pool held to the
    same limits, so the move passes no cap (nor per-IP limit) that pool had not passed, and
    nothing admitted against the broker's pool was decided without them. Otherwise it stays where
    it was admitted until it closes. This is what keeps the connections of a proxy's first clients
    (admitted before any broker is known) in the count of the broker they reached.

    A pool is made on first use and dropped when its last connection closes, so there are at most
    as many as node ports plus one. Every call routes by ``conn_id`` to its pool; the per-request
    cost is one dict lookup more.
    """

    def __init__(
        self,
        limits: ConnectionLimits | None = None,
        *,
        mode: Mode = Mode.ENFORCE,
        protected_listeners: Iterable[str] = (),
    ) -> None:
        self._limits = limits if limits is not None else ConnectionLimits()
        self._mode = mode
        self._protected = frozenset(protected_listeners)
        self._pools: dict[BrokerKey, ConnectionQuotas] = {}
        self._pool_of: dict[str, ConnectionQuotas] = {}
        self._key_of: dict[str, BrokerKey] = {}
        self._reached: dict[str, str] = {}  # BOOTSTRAP-pool connection -> the broker_address it reached

    @property
    def limits(self) -> ConnectionLimits:
        return self._limits

    @property
    def mode(self) -> Mode:
        return self._mode

    @mode.setter
    def mode(self, mode: Mode) -> None:
        self._mode = mode
        for pool in self._pools.values():
            pool.mode = mode

    def pool(self, broker: BrokerKey) -> ConnectionQuotas | None:
        """Broker ``broker``'s quotas (None while it has no connection)."""
        return self._pools.get(broker)

    def broker_of(self, conn_id: str) -> BrokerKey | None:
        return self._key_of.get(conn_id)

    def __contains__(self, conn_id: object) -> bool:
        return conn_id in self._pool_of

    def on_accept(
        self, conn_id: str, *, listener: str, ip: str, tls: bool, now: float, broker: BrokerKey = BOOTSTRAP
    ) -> Decision | None:
        """``ConnectionQuotas.on_accept`` against broker ``broker``'s own counts and caps."""
        if conn_id in self._pool_of:
            raise ValueError(f"connection {conn_id!r} is already counted")
        pool = self._pools.get(broker)
        if pool is None:
            pool = self._new_pool()
        decision = pool.on_accept(conn_id, listener=listener, ip=ip, tls=tls, now=now)
        if conn_id in pool:
            self._pools[broker] = pool
            self._pool_of[conn_id] = pool
            self._key_of[conn_id] = broker
        return decision

    def on_reached(self, conn_id: str, address: str, broker: int | None = None) -> bool:
        """BOOTSTRAP-pool connection ``conn_id`` connected to ``address`` (a ``broker_address``),
        which is broker ``broker`` when known: it moves there if that broker has no connection
        counted (True), or waits for ``on_broker_known``. Other connections are ignored."""
        if self._key_of.get(conn_id) != BOOTSTRAP:
            return False
        if broker is not None and self._move([conn_id], broker):
            return True
        self._reached[conn_id] = address
        return False

    def on_broker_known(self, broker: int, address: str) -> int:
        """Broker ``broker`` is at ``address`` (a ``broker_address``): the BOOTSTRAP-pool connections
        that reached it move to its pool if it has no connection counted. Returns how many moved
        (each frees a slot in the BOOTSTRAP pool)."""
        moving = [conn_id for conn_id, reached in self._reached.items() if reached == address]
        return len(moving) if moving and self._move(moving, broker) else 0

    def _new_pool(self) -> ConnectionQuotas:
        return ConnectionQuotas(self._limits, mode=self._mode, protected_listeners=self._protected)

    def _move(self, conn_ids: list[str], broker: int) -> bool:
        if broker in self._pools:
            return False
        source = self._pools[BOOTSTRAP]
        pool = self._pools[broker] = self._new_pool()
        source.hand_over(conn_ids, pool)
        for conn_id in conn_ids:
            self._pool_of[conn_id] = pool
            self._key_of[conn_id] = broker
            self._reached.pop(conn_id, None)
        if not source.counts().total:
            del self._pools[BOOTSTRAP]
        return True

    def follow_move(self, conn_ids: Iterable[str], broker: BrokerKey) -> None:
        """Count these connections in broker ``broker``'s pool from now on, as another BrokerQuotas
        decided (``on_reached``/``on_broker_known`` at the owner of the counts, with workers): busy or
        idle, last active when they were. Unknown ids, and ids already there, are skipped."""
        by_source: dict[BrokerKey, list[str]] = {}
        for conn_id in conn_ids:
            key = self._key_of.get(conn_id)
            if key is not None and key != broker:
                by_source.setdefault(key, []).append(conn_id)
        if not by_source:
            return
        target = self._pools.get(broker)
        if target is None:
            target = self._pools[broker] = self._new_pool()
        for key, ids in by_source.items():
            source = self._pools[key]
            source.hand_over(ids, target)
            for conn_id in ids:
                self._pool_of[conn_id] = target
                self._key_of[conn_id] = broker
                self._reached.pop(conn_id, None)
            if not source.counts().total:
                del self._pools[key]

    def room_needed(self, listener: str, ip: str, tls: bool, broker: BrokerKey = BOOTSTRAP) -> int:
        """``ConnectionQuotas.room_needed`` against broker ``broker``'s counts."""
        pool = self._pools.get(broker)
        return (pool if pool is not None else self._new_pool()).room_needed(listener, ip, tls)

    def excess(self) -> dict[BrokerKey, int]:
        """Each broker whose pool has a cap over its limit, with the largest excess (in OBSERVE too,
        where caps are passed: what ``update_limits`` would report)."""
        return {b: n for b, pool in self._pools.items() if (n := pool.excess())}

    def sync_activity(self, idle: Mapping[str, float], brokers: Iterable[BrokerKey] | None = None) -> None:
        """``ConnectionQuotas.sync_activity`` for the pools of ``brokers`` (every pool when None):
        each pool's idle connections are exactly the ids of ``idle`` counted in it."""
        keys = list(self._pools) if brokers is None else [b for b in brokers if b in self._pools]
        by_pool: dict[BrokerKey, dict[str, float]] = {key: {} for key in keys}
        for conn_id, t in idle.items():
            key = self._key_of.get(conn_id)
            if key is not None and key in by_pool:
                by_pool[key][conn_id] = t
        for key, reported in by_pool.items():
            self._pools[key].sync_activity(reported)

    def rooms(self, listener: str, ip: str, tls: bool, broker: BrokerKey = BOOTSTRAP) -> dict[str, int]:
        """``ConnectionQuotas.rooms`` against broker ``broker``'s counts."""
        pool = self._pools.get(broker)
        return (pool if pool is not None else self._new_pool()).rooms(listener, ip, tls)

    def on_leased(
        self, conn_id: str, *, listener: str, ip: str, tls: bool, now: float, broker: BrokerKey = BOOTSTRAP
    ) -> None:
        """``ConnectionQuotas.on_leased`` in broker ``broker``'s pool."""
        if conn_id in self._pool_of:
            raise ValueError(f"connection {conn_id!r} is already counted")
        pool = self._pools.get(broker)
        if pool is None:
            pool = self._pools[broker] = self._new_pool()
        pool.on_leased(conn_id, listener=listener, ip=ip, tls=tls, now=now)
        self._pool_of[conn_id] = pool
        self._key_of[conn_id] = broker

    def idle_lru(self, per_cell: int, brokers: Iterable[BrokerKey] | None = None) -> list[tuple[str, float]]:
        """``ConnectionQuotas.idle_lru`` of the pools of ``brokers`` (every pool when None)."""
        keys = list(self._pools) if brokers is None else [b for b in brokers if b in self._pools]
        out: list[tuple[str, float]] = []
        for key in keys:
            out.extend(self._pools[key].idle_lru(per_cell))
        return out

    def on_request(self, conn_id: str, now: float) -> None:
        pool = self._pool_of.get(conn_id)
        if pool is not None:
            pool.on_request(conn_id, now)

    def on_response(self, conn_id: str, now: float) -> None:
        pool = self._pool_of.get(conn_id)
        if pool is not None:
            pool.on_response(conn_id, now)

    def on_closed(self, conn_id: str) -> None:
        pool = self._pool_of.pop(conn_id, None)
        if pool is None:
            return
        broker = self._key_of.pop(conn_id)
        self._reached.pop(conn_id, None)
        pool.on_closed(conn_id)
        if not pool.counts().total:
            del self._pools[broker]

    def in_flight(self, conn_id: str) -> int:
        pool = self._pool_of.get(conn_id)
        return 0 if pool is None else pool.in_flight(conn_id)

    def is_closing(self, conn_id: str) -> bool:
        pool = self._pool_of.get(conn_id)
        return pool is not None and pool.is_closing(conn_id)

    def open_counts(self, conn_id: str) -> OpenCounts:
        """The counts of the pool ``conn_id`` was admitted to, and its broker's node id."""
        counts = self._pool_of[conn_id].open_counts(conn_id)
        broker = self._key_of[conn_id]
        return replace(counts, node_id=broker) if isinstance(broker, int) else counts

    def counts_by_broker(self) -> dict[BrokerKey, ConnectionCounts]:
        """Each broker's pool's counts (BOOTSTRAP: the connections to no known broker), for metrics."""
        return {broker: pool.counts() for broker, pool in self._pools.items()}

    def counts(self) -> ConnectionCounts:
        """All pools together, for metrics."""
        pools = list(self._pools.values())
        each = [p.counts() for p in pools]
        listeners: dict[str, int] = {}
        for c in each:
            for name, n in c.listeners.items():
                listeners[name] = listeners.get(name, 0) + n
        return ConnectionCounts(
            total=sum(c.total for c in each),
            broker=sum(c.broker for c in each),
            ssl=sum(c.ssl for c in each),
            closing=sum(c.closing for c in each),
            busy=sum(c.busy for c in each),
            listeners=MappingProxyType(listeners),
        )

    def idle_expired(self, now: float) -> list[Decision]:
        closes: list[Decision] = []
        for pool in self._pools.values():
            closes.extend(pool.idle_expired(now))
        return closes

    def next_idle_deadline(self) -> float | None:
        deadlines = [d for p in self._pools.values() if (d := p.next_idle_deadline()) is not None]
        return min(deadlines, default=None)

    def update_limits(self, limits: ConnectionLimits, now: float) -> list[Decision]:
        """New limits for every broker's pool (and the pools made later)."""
        if not isinstance(limits, ConnectionLimits):
            raise TypeError(f"limits must be ConnectionLimits, got {type(limits).__name__}")
        self._limits = limits
        closes: list[Decision] = []
        for pool in self._pools.values():
            closes.extend(pool.update_limits(limits, now))
        return closes

    @property
    def over_cap(self) -> bool:
        # Asked per response (ConnectionGate.on_response): a plain loop reading each pool's set of
        # exceeded caps, where a generator and a property per pool cost three calls more.
        for pool in self._pools.values():
            if pool._over and pool.mode is Mode.ENFORCE:  # pool.over_cap
                return True
        return False

    def reclaim_excess(self) -> list[Decision]:
        closes: list[Decision] = []
        for pool in self._pools.values():
            if pool.over_cap:
                closes.extend(pool.reclaim_excess())
        return closes


# ---------------------------------------------------------------------------
# Slots leased to workers

LeaseCell = tuple[str, bool, str]  # (listener, tls, ip): the connections a lease's slots admit


def _listener_lease_key(listener: str) -> str:
    return f"listener {listener}"


def _ip_lease_key(ip: str) -> str:
    return f"ip {ip}"


def lease_keys(cell: LeaseCell, protected: AbstractSet[str]) -> tuple[str, ...]:
    """The limits a connection of ``cell`` counts against, named as ``ConnectionQuotas.rooms`` names them."""
    listener, tls, ip = cell
    if listener in protected:
        return (_listener_lease_key(listener), _ip_lease_key(ip))
    if tls:
        return (_listener_lease_key(listener), _ip_lease_key(ip), MAX_CONNECTIONS, MAX_SSL_CONNECTIONS)
    return (_listener_lease_key(listener), _ip_lease_key(ip), MAX_CONNECTIONS)


class SlotLeases:
    """Admission slots of one ConnectionQuotas lent to holders (workers), so that a holder admits a
    connection of a cell (listener, TLS, IP) without asking, as long as it holds a slot of that cell.

    The lender keeps one invariant: for every limit, ``live + slots leased that count against it <=
    limit`` (per IP: ``count + slots of that IP <= limit``). A slot is granted only while every limit
    of its cell has room for it beside all slots out (``grant``), and the lender admits a connection
    itself only when that leaves room for all of them (``fits``); otherwise it first takes every slot
    back (its holders drop them and say how many: ``give_back``) and decides with none out. So every
    admission from a slot, counted by the lender when it is reported (``ConnectionQuotas.on_leased``,
    ``used``), finds each of its limits with room: it is the None ``on_accept`` answers there, in the
    order the lender learns of it. Closes only add room. Lowered limits (a reload) can leave slots
    out over a limit: the lender takes them back and counts those used meanwhile as admitted before
    the reload (their excess is closed as any lowered cap's). Only room is leased: a full cap's WAIT
    and EVICT, and a per-IP REFUSE, are always decided by the lender.
    """

    def __init__(self, protected_listeners: Iterable[str] = ()) -> None:
        self._protected = frozenset(protected_listeners)
        self._held: dict[int, dict[LeaseCell, int]] = {}
        self._reserved: dict[str, int] = {}  # limit key -> slots out that count against it

    def held(self, holder: int, cell: LeaseCell) -> int:
        return self._held.get(holder, {}).get(cell, 0)

    def holders(self) -> list[int]:
        """The holders with a slot out."""
        return list(self._held)

    def __bool__(self) -> bool:
        return bool(self._held)

    def fits(self, rooms: Mapping[str, int]) -> bool:
        """Admitting one connection with these ``rooms`` (``ConnectionQuotas.rooms``) leaves every
        limit room for all slots out."""
        reserved = self._reserved
        return all(room - reserved.get(key, 0) >= 1 for key, room in rooms.items())

    def grant(self, holder: int, cell: LeaseCell, rooms: Mapping[str, int], want: int, share: int = 1) -> int:
        """Lend ``holder`` up to ``want`` slots of ``cell`` (``rooms``: that cell's), and at most
        ``1 / share`` of the room every limit of the cell has beside the slots out (so holders
        leave each other room near a limit); returns how many (maybe 0)."""
        reserved = self._reserved
        free = min(room - reserved.get(key, 0) for key, room in rooms.items())
        n = min(want, free // share)
        if n > 0:
            self._add(holder, cell, n)
        return max(n, 0)

    def used(self, holder: int, cell: LeaseCell) -> None:
        """``holder`` admitted a connection from a slot of ``cell`` (count it: ``on_leased``)."""
        self._add(holder, cell, -1)

    def give_back(self, holder: int, cell: LeaseCell, n: int) -> None:
        """``holder`` dropped ``n`` unused slots of ``cell`` (after every admission it reported)."""
        self._add(holder, cell, -n)

    def drop(self, holder: int) -> int:
        """``holder`` is gone: its slots return; how many there were."""
        cells = self._held.get(holder, {})
        total = 0
        for cell, n in list(cells.items()):
            self._add(holder, cell, -n)
            total += n
        return total

    def _add(self, holder: int, cell: LeaseCell, n: int) -> None:
        cells = self._held.setdefault(holder, {})
        left = cells.get(cell, 0) + n
        if left < 0:
            raise ValueError(f"holder {holder} holds {left - n} slots of {cell}, not {-n}")
        if left:
            cells[cell] = left
        else:
            cells.pop(cell, None)
            if not cells:
                del self._held[holder]
        reserved = self._reserved
        for key in lease_keys(cell, self._protected):
            total = reserved.get(key, 0) + n
            if total:
                reserved[key] = total
            else:
                del reserved[key]


def send_stall_timeout(connections_max_idle_ms: int) -> float:
    """Seconds a send may wait for its peer to take a byte: Kafka's idle expiry counts socket
    activity, not requests in flight, so a peer that takes nothing for ``connections.max.idle.ms``
    is idle (a frozen client would otherwise hold its connection, and what it was sent, for ever).
    In both modes: it is the proxy's hygiene, not a limit observe mode only reports. Negative: never."""
    return connections_max_idle_ms / 1000 if connections_max_idle_ms >= 0 else float("inf")


def decide_send_stall(seconds: float, peer: str = "client") -> Decision:
    """A send waited ``seconds`` (``send_stall_timeout``) for ``peer`` to take a byte: close it."""
    idle_ms = round(seconds * 1000)
    return Decision(
        Policy.CONNECTIONS,
        Action.CLOSE,
        Mode.ENFORCE,
        CONNECTIONS_MAX_IDLE_MS,
        f"{CONNECTIONS_MAX_IDLE_MS}={idle_ms} exceeded (the {peer} took no byte for {seconds:g}s)",
        limit=idle_ms,
    )
