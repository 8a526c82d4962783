"""A worker's connection gate when the limits are shared (issue 29): the owner
(proxy/workers/owner_connections.py) counts and decides every open; this gate
asks it (``conn.open``), records what it decided (one audit event, one metric,
as one process does) and tells it each close. The connection's ``open`` event is the owner's to
write (proxy/evidence/lifecycle.py): it alone knows the counts the limits compared. What happens per request stays
here, in a local :class:`policies.connections.BrokerQuotas` whose caps are off
(it decides no cap): activity, LRU order, and idle expiry
(``connections.max.idle.ms`` is per connection). The owner reads that activity
only when a cap is full or over its limit (``conn.idle``), and names the
connections to close (``conn.close``): this gate closes each at once if it is
still idle, or as soon as its requests are answered (a connection with a request
in flight is never closed to make room).

Most opens ask nothing: the owner lends this worker slots of room under every limit of a cell
(listener, TLS, client IP) of a broker's pool (``conn.lease``), and an open of a cell it holds a slot
of is admitted here and told (``conn.opened``). The owner takes a pool's slots back (``conn.recall``)
before it decides an open they would leave without room, or moves connections into that pool: the
slots are dropped and their number told (``conn.returned``), after every admission from them.
"""

from __future__ import annotations

import time
from dataclasses import replace

import trio

from policies.api_keys import INT_MAX
from policies.connections import BOOTSTRAP, BrokerKey, BrokerQuotas, ConnectionLimits, LeaseCell
from policies.decision import Action, Decision
from policies.mode import Mode
from proxy.evidence.decisions import DecisionRecorder, Where
from proxy.evidence.metrics import Metrics
from proxy.serve.connection_gate import Closable, ConnectionGate
from proxy.workers.link import Link
from proxy.workers.owner_connections import OpenAnswer


def worker_limits(limits: ConnectionLimits) -> ConnectionLimits:
    """A worker's local limits: no cap (the owner's), the idle expiry (the worker's own)."""
    return replace(
        limits,
        max_connections=INT_MAX,
        max_connections_per_ip=INT_MAX,
        max_connections_per_ip_overrides={},
        max_ssl_connections=INT_MAX,
        listener_max_connections={},
    )


class SharedConnectionGate(ConnectionGate):
    def __init__(
        self,
        link: Link,
        limits: ConnectionLimits,
        mode: Mode,
        protected_listeners: list[str],
        metrics: Metrics,
        recorder: DecisionRecorder,
        wait_ms: int,
        ssl_handshakes_per_turn: int,
    ) -> None:
        local = BrokerQuotas(worker_limits(limits), mode=mode, protected_listeners=protected_listeners)
        super().__init__(local, metrics, recorder, wait_ms, ssl_handshakes_per_turn, counts_collector=False)
        self._link = link
        self._watch = False  # the owner wants to hear when a connection turns idle
        self._deferred: dict[str, Decision] = {}  # named to close while busy: closed once idle
        self._slots: dict[tuple[BrokerKey, LeaseCell], int] = {}  # slots lent by the owner, per pool and cell
        self._asking: dict[str, Closable] = {}  # opens asked of the owner, not answered yet
        link.handlers.update(
            {
                "conn.idle": self._idle,
                "conn.close": self._close_named,
                "conn.moved": self.quotas.follow_move,
                "conn.watch": self._set_watch,
                "conn.lease": self._lent,
                "conn.recall": self._recall,
                "conn.waiting": self._waiting,
            }
        )

    # -- at accept ------------------------------------------------------------------------

    async def admit(self, conn: Closable, broker: BrokerKey = BOOTSTRAP) -> bool:
        if self._slots:
            key = (broker, (conn.listener, conn.tls, conn.peer_ip))
            left = self._slots.get(key, 0)
            if left:  # a slot of the owner's: every limit had room for it (None, as the owner answers)
                if left == 1:
                    del self._slots[key]
                else:
                    self._slots[key] = left - 1
                peer, ip = conn.where.client_address, conn.peer_ip
                self._link.tell("conn.opened", conn.conn_id, conn.listener, peer, ip, conn.tls, time.time(), broker)
                self._counted(conn, broker)
                return True
        self._asking[conn.conn_id] = conn
        try:
            answer: OpenAnswer = await self._link.ask(
                "conn.open", conn.conn_id, conn.listener, conn.where.client_address, conn.peer_ip, conn.tls, broker
            )
        finally:
            del self._asking[conn.conn_id]
        self._watch = answer.watch
        if answer.waited is not None:  # recorded when it began (conn.waiting)
            self._metrics.acceptor_blocked.labels(conn.listener).inc(answer.blocked)
        if answer.decision is not None:
            self._recorder.record(answer.decision, conn.where)
        if not answer.admitted:
            return False
        self._counted(conn, broker)
        return True

    def _counted(self, conn: Closable, broker: BrokerKey) -> None:
        """Admitted: counted here for its activity (the caps, and the counts its open event carries,
        are the owner's)."""
        self.quotas.on_accept(
            conn.conn_id, listener=conn.listener, ip=conn.peer_ip, tls=conn.tls, now=trio.current_time(), broker=broker
        )
        self._open[conn.conn_id] = conn
        self._rearm_reaper()  # a new connection is idle until its first request

    def reached(self, conn_id: str, address: str, broker: int | None) -> None:
        self._link.tell("conn.reached", conn_id, address, broker)

    def broker_known(self, broker: int, address: str) -> None:
        self._link.tell("conn.broker_known", broker, address)

    # -- per request --------------------------------------------------------------------------

    def on_response(self, conn_id: str, now: float) -> None:
        quotas = self.quotas
        quotas.on_response(conn_id, now)
        if (self._reaper_idle or self._watch or self._deferred) and not quotas.in_flight(conn_id):
            self._rearm_reaper()
            named = self._deferred.pop(conn_id, None)
            if named is not None:
                self._close(conn_id, named)
            elif self._watch:
                self._link.tell("conn.turned_idle")

    def on_closed(self, conn: Closable) -> None:
        self.quotas.on_closed(conn.conn_id)
        self._deferred.pop(conn.conn_id, None)
        if self._open.pop(conn.conn_id, None) is not None:
            self._link.tell("conn.closed", conn.conn_id)

    # -- reload ---------------------------------------------------------------------------------

    def reconfigure(self, limits: ConnectionLimits, mode: Mode, wait_ms: int, ssl_handshakes_per_turn: int) -> None:
        """The owner applied the caps already; here the idle expiry, and the ask to close the excess
        of a lowered cap now that this worker's activity can be read."""
        super().reconfigure(worker_limits(limits), mode, wait_ms, ssl_handshakes_per_turn)
        self._link.tell("conn.reclaim")

    # -- the owner's messages ---------------------------------------------------------------------

    def _idle(self, brokers: list[BrokerKey], per_cell: int) -> list[tuple[str, float]]:
        """Up to ``per_cell`` LRU idle connections of each cell of these brokers' pools, with their
        last activity on ``time.monotonic()`` (trio's clock has an offset of its own per process)."""
        offset = time.monotonic() - trio.current_time()
        return [(conn_id, last + offset) for conn_id, last in self.quotas.idle_lru(per_cell, brokers)]

    def _close_named(self, conn_ids: list[str], decision: Decision) -> None:
        """The owner named these connections to close (an eviction, or the excess of a lowered
        cap): their slots are given over already."""
        if decision.action is not Action.EVICT:  # the admitting worker recorded the eviction
            victim = self._open.get(conn_ids[0])
            self._recorder.record(decision, victim.where if victim is not None else Where())
        if not decision.enforced:
            return
        for conn_id in conn_ids:
            if conn_id not in self._open:
                continue
            if self.quotas.in_flight(conn_id):
                self._deferred[conn_id] = decision
            else:
                self._close(conn_id, decision)

    def _waiting(self, conn_id: str, decision: Decision) -> None:
        """The owner made this open wait for a slot: recorded now, as one process records it."""
        conn = self._asking.get(conn_id)
        self._recorder.record(decision, conn.where if conn is not None else Where())

    def _set_watch(self, watch: bool) -> None:
        self._watch = watch

    def _lent(self, broker: BrokerKey, cell: LeaseCell, n: int) -> None:
        key = (broker, cell)
        self._slots[key] = self._slots.get(key, 0) + n

    def _recall(self, broker: BrokerKey) -> None:
        """The owner takes its slots of broker ``broker``'s pool back: dropped, and how many told
        (after every ``conn.opened``)."""
        returned = [(cell, n) for (b, cell), n in self._slots.items() if b == broker]
        for cell, _ in returned:
            del self._slots[(broker, cell)]
        self._link.tell("conn.returned", broker, returned)
