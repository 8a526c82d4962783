"""The trio side of the connection quotas (policies.connections): decides at
accept, before any TLS handshake; closes the connections the policy names
(LRU eviction, idle expiry, lowered limits); and, when a cap is full with
nothing idle to close, blocks the listener's accept loop (connections wait in
the kernel backlog, as Kafka's acceptor does) until a slot frees."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

import trio
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from policies.connections import Admit, Close, ConnectionLimits, ConnectionQuotas, EvictThenAdmit, Refuse, Wait

from .audit import AuditSink
from .metrics import Metrics

if TYPE_CHECKING:
    from .connection import ClientConnection

log = logging.getLogger("kafka_admission_proxy.connections")

# One label per decision, whichever mode made it (observe reports ENFORCE's decision).
_VERBS: dict[type, str] = {Refuse: "refuse", Wait: "wait", EvictThenAdmit: "evict"}


class ConnectionGate:
    def __init__(self, quotas: ConnectionQuotas, metrics: Metrics, audit: AuditSink, wait_ms: int) -> None:
        self.quotas = quotas
        self._metrics = metrics
        self._audit = audit
        self.wait_seconds = wait_ms / 1000
        self._open: dict[str, ClientConnection] = {}
        self._slot_freed = trio.Event()  # set (and replaced) whenever a wait might now succeed
        self._idle_changed = trio.Event()
        metrics.registry.register(_CountsCollector(quotas))

    @property
    def mode(self) -> str:
        return self.quotas.mode.value

    async def admit(self, conn: ClientConnection) -> bool:
        """At accept: True to serve ``conn``; False when it was refused (it is not counted)."""
        listener = conn.listener.config.name
        blocked_since: float | None = None
        deadline = trio.current_time() + self.wait_seconds
        while True:
            decision = self.quotas.on_accept(
                conn.conn_id, listener=listener, ip=conn.peer_ip, tls=conn.tls, now=trio.current_time()
            )
            if not isinstance(decision, Wait):
                break
            if blocked_since is None:
                blocked_since = trio.current_time()
                self._decided(conn, "wait", decision.limit_key, decision.reason)
            with trio.move_on_at(deadline):
                await self._slot_freed.wait()
                continue
            self._blocked(listener, blocked_since)
            self._decided(conn, "refuse", "max.connections.wait.ms", f"waited {self.wait_seconds:g}s for a slot")
            return False
        if blocked_since is not None:
            self._blocked(listener, blocked_since)
        if isinstance(decision, Refuse):
            self._decided(conn, "refuse", decision.limit_key, decision.reason)
            return False
        self._open[conn.conn_id] = conn
        self._idle_changed.set()
        if isinstance(decision, EvictThenAdmit):
            self._decided(conn, "evict", decision.limit_key, decision.reason)
            for victim in decision.evict:
                self._close(victim, decision.limit_key, f"evicted (LRU idle) to admit a connection: {decision.reason}")
        elif isinstance(decision, Admit) and decision.observed is not None:
            self._decided(conn, _VERBS[type(decision.observed)], decision.limit_key or "", decision.reason)
        return True

    def on_request(self, conn: ClientConnection) -> None:
        self.quotas.on_request(conn.conn_id, trio.current_time())

    def on_response(self, conn: ClientConnection) -> None:
        self.quotas.on_response(conn.conn_id, trio.current_time())
        if not conn.busy:
            self._wake()  # an idle connection can be evicted for a waiting one
            self._idle_changed.set()  # and it now has an idle deadline the reaper must see
            for close in self.quotas.reclaim_excess():
                self._carry_out(close)

    def on_closed(self, conn: ClientConnection) -> None:
        self.quotas.on_closed(conn.conn_id)
        self._open.pop(conn.conn_id, None)
        self._wake()

    def update_limits(self, limits: ConnectionLimits) -> None:
        """A reload: raising takes effect at once; lowering closes the excess, LRU-first."""
        for close in self.quotas.update_limits(limits, trio.current_time()):
            self._carry_out(close)
        self._wake()
        self._idle_changed.set()

    async def reap_idle(self) -> None:
        """Close connections idle for more than connections.max.idle.ms, for ever."""
        while True:
            deadline = self.quotas.next_idle_deadline()
            if deadline is None:
                await self._idle_changed.wait()
            else:
                with trio.move_on_at(deadline):
                    await self._idle_changed.wait()
            self._idle_changed = trio.Event()
            for close in self.quotas.idle_expired(trio.current_time()):
                self._carry_out(close)

    def _carry_out(self, close: Close) -> None:
        if close.observed:
            self._metrics.connections_evicted.labels(self._listener_of(close.conn_id), close.limit_key, "observe").inc()
            self._audit.emit(
                "connection_close", conn=close.conn_id, limit=close.limit_key, reason=close.reason, mode="observe"
            )
            return
        self._close(close.conn_id, close.limit_key, close.reason)

    def _close(self, conn_id: str, limit_key: str, reason: str) -> None:
        conn = self._open.get(conn_id)
        listener = self._listener_of(conn_id)
        self._metrics.connections_evicted.labels(listener, limit_key, "enforce").inc()
        self._audit.emit(
            "connection_close",
            conn=conn_id,
            listener=listener,
            limit=limit_key,
            reason=reason,
            peer=conn.peer if conn else None,
            mode="enforce",
        )
        if conn is not None:
            conn.close_now(limit_key, reason)

    def _listener_of(self, conn_id: str) -> str:
        conn = self._open.get(conn_id)
        return conn.listener.config.name if conn is not None else "unknown"

    def _decided(self, conn: ClientConnection, decision: str, limit_key: str, reason: str) -> None:
        listener = conn.listener.config.name
        self._metrics.connections_rejected.labels(listener, decision, limit_key, self.mode).inc()
        self._audit.emit(
            "connection_admission",
            listener=listener,
            peer=conn.peer,
            tls=conn.tls,
            decision=decision,
            limit=limit_key,
            reason=reason,
            mode=self.mode,
        )
        if decision in ("refuse", "evict", "wait"):
            log.warning(
                "%s connection: %s",
                decision,
                reason,
                extra={"peer": conn.peer, "listener": listener, "cause": limit_key},
            )

    def _blocked(self, listener: str, since: float) -> None:
        self._metrics.acceptor_blocked.labels(listener).inc(trio.current_time() - since)

    def _wake(self) -> None:
        self._slot_freed.set()
        self._slot_freed = trio.Event()


class _CountsCollector(Collector):
    """Connection counts as the policy sees them (KIP-1015's SSL and total counts)."""

    def __init__(self, quotas: ConnectionQuotas) -> None:
        self._quotas = quotas

    def collect(self) -> Iterator[GaugeMetricFamily]:
        counts = self._quotas.counts()
        yield GaugeMetricFamily(
            "kafka_admission_connections_counted", "Connections counted by the quotas", value=counts.total
        )
        yield GaugeMetricFamily(
            "kafka_admission_connections_counted_tls",
            "TLS connections counted against max.ssl.connections",
            value=counts.ssl,
        )
        yield GaugeMetricFamily(
            "kafka_admission_connections_counted_busy", "Connections with requests in flight", value=counts.busy
        )
