"""The trio side of the connection quotas (policies.connections, Kafka's
ConnectionQuotas and KIP-1015): decides at accept, before any TLS handshake;
closes the connections the policy names (LRU eviction, idle expiry, lowered
limits); and, when a cap is full with nothing idle to close, blocks the
listener's accept loop (connections wait in the kernel backlog, as Kafka's
acceptor does) until a slot frees. It also holds the TLS handshakes' turns
(``max.ssl.handshakes.per.turn``, beyond Kafka): handshakes are computed on the
event loop, so a burst of them would hold up every established connection.
Each connection counts against the limits of the broker it reaches
(policies.connections.BrokerQuotas: a node port's node id; for a bootstrap-port
connection the broker decided at accept, or the BOOTSTRAP pool when none is
known), as each Kafka broker counts its own connections.

Per request it only hands the policy a timestamp. The tasks that wait on the
quotas are woken only when their condition can have changed: accept waiters
when a connection closes or turns idle while they wait, the idle reaper when
the first connection turns idle while it has nothing to time.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Protocol

import trio
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from policies.close_cause import CloseCause, Closing
from policies.connections import BOOTSTRAP, BrokerKey, BrokerQuotas, ConnectionCounts, ConnectionLimits, OpenCounts
from policies.decision import Action, Decision, Policy
from policies.mode import Mode
from policies.properties import MAX_CONNECTIONS_WAIT_MS
from proxy.evidence.decisions import DecisionRecorder, Where
from proxy.evidence.metrics import Metrics

log = logging.getLogger("kafka_admission_proxy.connections")


_BUSY = ("kafka_admission_connections_counted_busy", "Connections with requests in flight")


class Closable(Protocol):
    """What the gate needs of a connection."""

    conn_id: str
    listener: str
    peer_ip: str
    tls: bool
    where: Where
    open_counts: OpenCounts | None  # what the limits counted once it was admitted (for the audit)

    def close_now(self, closing: Closing) -> None: ...


class ConnectionGate:
    def __init__(
        self,
        quotas: BrokerQuotas,
        metrics: Metrics,
        recorder: DecisionRecorder,
        wait_ms: int,
        ssl_handshakes_per_turn: int,
        *,
        counts_collector: bool = True,
    ) -> None:
        self.quotas = quotas
        self._metrics = metrics
        self._recorder = recorder
        self.wait_seconds = wait_ms / 1000
        # A slot per handshake step, given back after every other runnable task had its
        # turn (TlsTransport.handshake); waiting for the peer holds none.
        self.handshake_turns = trio.CapacityLimiter(ssl_handshakes_per_turn)
        self._open: dict[str, Closable] = {}
        self._accept_waiters = 0
        self._slot_freed = trio.Event()  # set (and replaced) when a waiting accept may now succeed
        self._reaper_rearm: trio.Event | None = None  # set when the idle reaper must look again
        self._reaper_idle = True  # the reaper has no deadline: wake it when a connection turns idle
        # Per request the quotas only take a timestamp: the connection calls them directly.
        self.on_request = quotas.on_request
        self.touched = quotas.on_response  # activity with nothing left in flight (acks=0 Produce)
        if counts_collector:  # with workers the owner's quotas count (proxy/workers/owner_connections.py)
            metrics.registry.register(CountsCollector(quotas))
        else:  # but only each worker sees its requests in flight: summed over the workers at a flush
            metrics.watch_gauge(*_BUSY, lambda: busy_by_broker(quotas), label="broker")

    # -- at accept ------------------------------------------------------------------------

    async def admit(self, conn: Closable, broker: BrokerKey = BOOTSTRAP) -> bool:
        """True to serve ``conn`` (it is counted from now on, against broker ``broker``'s
        limits: the node id of the broker it reaches, or BOOTSTRAP); False when it was refused."""
        quotas, listener = self.quotas, conn.listener
        blocked_since: float | None = None
        deadline = trio.current_time() + self.wait_seconds
        while True:
            now = trio.current_time()
            decision = quotas.on_accept(
                conn.conn_id, listener=listener, ip=conn.peer_ip, tls=conn.tls, now=now, broker=broker
            )
            if decision is None or decision.action is not Action.WAIT or not decision.enforced:
                break
            if blocked_since is None:
                blocked_since = trio.current_time()
                self._recorder.record(decision, conn.where)
            self._accept_waiters += 1
            try:
                with trio.move_on_at(deadline):
                    await self._slot_freed.wait()
                    continue
            finally:
                self._accept_waiters -= 1
            self._blocked(listener, blocked_since)
            waited = Decision(
                Policy.CONNECTIONS,
                Action.REFUSE,
                Mode.ENFORCE,
                MAX_CONNECTIONS_WAIT_MS,
                f"waited {self.wait_seconds:g}s for a slot ({decision.reason})",
                limit=round(self.wait_seconds * 1000),
            )
            self._recorder.record(waited, conn.where)
            return False
        if blocked_since is not None:
            self._blocked(listener, blocked_since)
        if decision is not None:
            self._recorder.record(decision, conn.where)
            if decision.enforced and decision.action is Action.REFUSE:
                return False
        self._open[conn.conn_id] = conn
        conn.open_counts = self.quotas.open_counts(conn.conn_id)
        self._rearm_reaper()  # a new connection is idle until its first request
        if decision is not None and decision.enforced and decision.action is Action.EVICT:
            for victim in decision.victims:
                self._close(victim, decision)
        return True

    def reached(self, conn_id: str, address: str, broker: int | None) -> None:
        """A connection counted in the BOOTSTRAP pool connected to ``address`` (broker ``broker``
        when known): see BrokerQuotas.on_reached."""
        if self.quotas.on_reached(conn_id, address, broker):
            self._wake_accepts()

    def broker_known(self, broker: int, address: str) -> None:
        """BrokerDirectory learned broker ``broker`` at ``address``: see BrokerQuotas.on_broker_known."""
        if self.quotas.on_broker_known(broker, address):
            self._wake_accepts()

    # -- per request: timestamps only ---------------------------------------------------------

    def on_response(self, conn_id: str, now: float) -> None:
        quotas = self.quotas
        quotas.on_response(conn_id, now)
        if (self._accept_waiters or self._reaper_idle or quotas.over_cap) and not quotas.in_flight(conn_id):
            # It turned idle: it can be evicted for a waiting accept, the reaper must time
            # it, and a cap lowered below the busy connections can be met now.
            self._wake_accepts()
            self._rearm_reaper()
            for decision in quotas.reclaim_excess():
                self._carry_out(decision)

    def on_closed(self, conn: Closable) -> None:
        self.quotas.on_closed(conn.conn_id)
        self._open.pop(conn.conn_id, None)
        self._wake_accepts()

    # -- reload and idle expiry ---------------------------------------------------------------

    def reconfigure(self, limits: ConnectionLimits, mode: Mode, wait_ms: int, ssl_handshakes_per_turn: int) -> None:
        """A reload: raising takes effect at once; lowering closes the excess, LRU-first."""
        self.quotas.mode = mode
        self.wait_seconds = wait_ms / 1000
        self.handshake_turns.total_tokens = ssl_handshakes_per_turn
        for decision in self.quotas.update_limits(limits, trio.current_time()):
            self._carry_out(decision)
        self._wake_accepts()
        self._rearm_reaper(force=True)  # connections.max.idle.ms may have changed

    async def reap_idle(self) -> None:
        """Close connections idle for more than connections.max.idle.ms, for ever. Sleeps
        until the oldest idle connection's deadline: later activity only moves it later."""
        while True:
            deadline = self.quotas.next_idle_deadline()
            self._reaper_idle = deadline is None
            self._reaper_rearm = trio.Event()
            with trio.move_on_at(deadline if deadline is not None else float("inf")):
                await self._reaper_rearm.wait()
            for decision in self.quotas.idle_expired(trio.current_time()):
                self._carry_out(decision)

    def _rearm_reaper(self, *, force: bool = False) -> None:
        if (self._reaper_idle or force) and self._reaper_rearm is not None:
            self._reaper_rearm.set()

    # -- carrying decisions out -----------------------------------------------------------------

    def _carry_out(self, decision: Decision) -> None:
        victim = self._open.get(decision.victims[0]) if decision.victims else None
        self._recorder.record(decision, victim.where if victim is not None else Where())
        if decision.enforced:
            for conn_id in decision.victims:
                self._close(conn_id, decision)

    def _close(self, conn_id: str, decision: Decision) -> None:
        conn = self._open.get(conn_id)
        if conn is None:
            return
        if decision.action is Action.EVICT:
            reason = f"evicted (LRU idle) to admit a connection: {decision.reason}"
            conn.close_now(Closing(CloseCause.EVICTED, reason, decision.limit_key))
        else:
            conn.close_now(Closing(CloseCause.CLOSED_BY_LIMIT, decision.reason, decision.limit_key))

    def _blocked(self, listener: str, since: float) -> None:
        self._metrics.acceptor_blocked.labels(listener).inc(trio.current_time() - since)

    def _wake_accepts(self) -> None:
        if self._accept_waiters:
            self._slot_freed.set()
            self._slot_freed = trio.Event()


def busy_by_broker(quotas: BrokerQuotas) -> dict[str, float]:
    """The connections with requests in flight, by ``broker`` label (``bootstrap`` always there)."""
    busy = {str(broker): float(counts.busy) for broker, counts in quotas.counts_by_broker().items()}
    busy.setdefault(str(BOOTSTRAP), 0.0)
    return busy


class CountsCollector(Collector):
    """Connection counts as the policy sees them (KIP-1015's SSL and total counts), per broker as
    each broker counts them: ``broker`` is the node id of the broker counted against (node-port
    and bootstrap-port connections alike) or ``bootstrap`` (connections to no known broker);
    sidecar mode has ``bootstrap`` alone. ``busy=False`` leaves out the busy count: with workers
    the owner's quotas count the connections but do not see their requests."""

    def __init__(self, quotas: BrokerQuotas, *, busy: bool = True) -> None:
        self._quotas = quotas
        self._busy = busy

    def collect(self) -> Iterator[GaugeMetricFamily]:
        by_broker = self._quotas.counts_by_broker()
        if BOOTSTRAP not in by_broker:
            by_broker[BOOTSTRAP] = ConnectionCounts(total=0, broker=0, ssl=0, closing=0, busy=0, listeners={})
        families = (
            ("kafka_admission_connections_counted", "Connections counted by the quotas", "total"),
            ("kafka_admission_connections_counted_tls", "TLS connections counted against max.ssl.connections", "ssl"),
            (*_BUSY, "busy"),
        )
        for name, help_text, field in families if self._busy else families[:2]:
            family = GaugeMetricFamily(name, help_text, labels=["broker"])
            for broker, counts in by_broker.items():
                family.add_metric([str(broker)], getattr(counts, field))
            yield family
