"""The owner's side of the connection limits with workers (issue 29): one
:class:`policies.connections.BrokerQuotas` counts every worker's connections and
decides every open, in one order, as Kafka's network threads share one
``ConnectionQuotas``. The workers keep what happens per request (activity, LRU
order, idle expiry: proxy/workers/worker_connections.py); the owner learns it
only when a decision needs it: when a cap is full (an eviction, or a wait) and
when a cap is over its limit after a reload, it asks every worker for its least
recently used idle connections (``conn.idle``, times on ``time.monotonic()``,
the one clock all processes share) and syncs its quotas with them
(``sync_activity``) before deciding. Most opens do not ask at all: the owner lends each worker
slots of room under every limit of each broker's pool (``SlotLeases``) and the worker admits from
them, telling the owner each admission (``conn.opened``); the owner takes a pool's slots back
(``conn.recall``) before it decides an open that would leave a slot without room, and before it
moves connections into a node's pool that counts none. When the audit keeps evidence, the owner writes each
connection's ``open`` event as it counts it, with the counts its limits compare (only it knows
them), under the proxy's own instance. The design: docs/workers.md.
"""

from __future__ import annotations

import time
from collections.abc import Coroutine, Iterable, Iterator
from dataclasses import replace
from typing import Any, NamedTuple

import trio
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from policies.connections import BOOTSTRAP, BrokerKey, BrokerQuotas, ConnectionLimits, LeaseCell, SlotLeases
from policies.decision import Action, Decision, Policy
from policies.mode import Mode
from policies.properties import MAX_CONNECTIONS_WAIT_MS
from proxy.config.model import PASSTHROUGH, Config
from proxy.evidence.audit import AuditSink
from proxy.evidence.lifecycle import record_lifecycle
from proxy.evidence.observation_window import ObservationWindow
from proxy.serve.connection_gate import CountsCollector
from proxy.workers.link import Handler, Link, LinkClosed, RemoteError

# How long an activity round waits for the workers' answers (each answers from memory, at once):
# one that did not answer by then (stopped, or stuck) offers no idle connection this round.
ROUND_TIMEOUT_S = 1.0
# The most slots of one cell (listener, TLS, IP) a worker holds: topped up when half are used, so
# a worker opening connections one after another almost never asks. Near a limit fewer are lent,
# and the slots out are taken back before the owner decides an open they would leave without room.
LEASE_SLOTS = 8


class OpenAnswer(NamedTuple):
    """The owner's answer to ``conn.open``: what the asking worker records and does.

    ``decision``: the decision to record (None: admitted with nothing to say; EVICT: admitted, the
    victims' holders were told to close them; an enforced REFUSE: refused, per IP or after waiting
    ``max.connections.wait.ms``). ``waited``: the first WAIT, when the open had to wait for a slot
    (``blocked`` seconds; the worker recorded it when told ``conn.waiting``, as the wait began).
    ``watch``: whether the owner wants to hear when a connection turns idle (``conn.watch`` tells
    the changes; a worker whose gate was not built yet when one was told learns it here). A named
    tuple of plain values: it pickles in a third of the time a dataclass does."""

    admitted: bool
    decision: Decision | None
    waited: Decision | None = None
    blocked: float = 0.0
    watch: bool = False


def owner_limits(limits: ConnectionLimits) -> ConnectionLimits:
    """The owner's limits: every cap; no idle expiry (each worker expires its own connections)."""
    return replace(limits, connections_max_idle_ms=-1)


class ConnectionOwner:
    """The shared service of the connection limits (see proxy/workers/owner.py for the contract)."""

    def __init__(self, config: Config) -> None:
        policies = config.policies
        self.quotas = BrokerQuotas(
            owner_limits(policies.connection_limits()),
            mode=Mode(policies.mode_of(policies.connections_mode)),
            protected_listeners=[lst.name for lst in config.listeners if lst.protected],
        )
        self.wait_seconds = policies.max_connections_wait_ms / 1000
        self._links: dict[int, Link] = {}
        self._gone: dict[int, int] = {}  # worker -> how many times it died (an open decided for a dead one is dropped)
        self._holder: dict[str, int] = {}  # conn_id -> the worker that holds it
        self._deciding = trio.Lock()  # one activity round and decision at a time (FIFO)
        self._in_turn: dict[BrokerKey, int] = {}  # opens queued at the lock or waiting, per broker's pool
        self._waiting = 0  # opens waiting for a slot (WAIT)
        self._room = trio.Event()  # set (and replaced) when a waiting open may now succeed
        self._watch = False  # the workers tell when a connection turns idle (waiters, or a cap over its limit)
        self._reclaiming = False
        self._reclaim_again = False
        self._relimit = False  # limits changed: the next round closes (or, observing, reports) the excess
        # Slots lent to workers, per broker's pool (sidecar mode: the BOOTSTRAP pool alone). A move of
        # BOOTSTRAP-pool connections into a node's pool, made only while that node counts none, waits
        # for that node's slots to come back first (``reached``): it could take their room.
        self._protected = [lst.name for lst in config.listeners if lst.protected]
        self.leases: dict[BrokerKey, SlotLeases] = {}
        self._recalling: dict[BrokerKey, int] = {}  # recalls under way, per pool: none of its slots is lent meanwhile
        self._returned = trio.Event()  # set (and replaced) when a worker gave slots back
        # The proxy's evidence (proxy/workers/proxy_windows.py), when the audit keeps it: each
        # connection counted here is observed in the connections window and its open event written
        # with the counts of that moment, as one process writes it.
        self.window: ObservationWindow | None = None
        self.audit: AuditSink | None = None
        self._observed: dict[str, tuple[str, bool]] = {}  # conn_id -> (listener, TLS), in the window
        self._passthrough = frozenset(lst.name for lst in config.listeners if lst.tls == PASSTHROUGH)
        self.opens = {"slot": 0, "asked": 0}  # opens admitted from a lent slot, and opens asked

    # -- the contract -----------------------------------------------------------------------

    def handlers(self, worker: int) -> dict[str, Handler]:
        return {
            "conn.open": lambda *args: self.open(worker, *args),
            "conn.closed": lambda conn_id: self.closed(worker, conn_id),
            "conn.reached": lambda conn_id, address, broker: self.reached(conn_id, address, broker),
            "conn.broker_known": self.broker_known,
            "conn.turned_idle": self.turned_idle,
            "conn.reclaim": self.reclaim,
            "conn.opened": lambda *args: self.opened(worker, *args),
            "conn.returned": lambda broker, returned: self.returned(worker, broker, returned),
        }

    def attach(self, worker: int, link: Link) -> None:
        self._links[worker] = link
        if self._watch:
            link.tell("conn.watch", True)

    def worker_gone(self, worker: int) -> dict[str, int]:
        """Its connections are closed: each stops counting, and waiting opens are woken."""
        self._gone[worker] = self._gone.get(worker, 0) + 1
        self._links.pop(worker, None)
        for leases in self.leases.values():
            leases.drop(worker)
        self._returned.set()
        self._returned = trio.Event()
        held = [conn_id for conn_id, holder in self._holder.items() if holder == worker]
        for conn_id in held:
            del self._holder[conn_id]
            self.quotas.on_closed(conn_id)
            self._observe_close(conn_id)
        self._wake()
        self._update_watch()
        return {"connections": len(held)}

    def reconfigure(self, config: Config) -> None:
        """New limits at once: raising wakes waiting opens; lowering marks caps over their limit,
        and the excess is closed LRU-first by the activity round each worker's reload asks for
        (``conn.reclaim``): the owner does not know now which connections are idle."""
        policies = config.policies
        quotas = self.quotas
        quotas.mode = Mode(policies.mode_of(policies.connections_mode))
        self.wait_seconds = policies.max_connections_wait_ms / 1000
        # Slots lent under the old limits are taken back; those used meanwhile count as admitted
        # before the reload (each worker's reload asks for the excess round after it gave them back).
        for broker, leases in self.leases.items():
            for holder in leases.holders():
                self._tell(holder, "conn.recall", broker)
        quotas.sync_activity({})  # no activity known: update_limits names no victim
        quotas.update_limits(owner_limits(policies.connection_limits()), time.monotonic())
        self._relimit = True
        self._wake()
        self._update_watch()

    def collectors(self) -> list[Collector]:
        return [CountsCollector(self.quotas, busy=False), OpensCollector(self.opens)]

    # -- opens ---------------------------------------------------------------------------------

    def open(
        self, worker: int, conn_id: str, listener: str, peer: str, ip: str, tls: bool, broker: BrokerKey = BOOTSTRAP
    ) -> OpenAnswer | Coroutine[Any, Any, OpenAnswer]:
        """``BrokerQuotas.on_accept`` for worker ``worker``'s new connection (``peer``: the client's
        address, for its open event). Answered at once when no cap is full (nothing to close: no
        activity needed) and no earlier open of that broker's pool waits; otherwise in turn, after
        an activity round (see the module docstring)."""
        self.opens["asked"] += 1
        quotas = self.quotas
        leases = self.leases.get(broker)
        if (
            not self._in_turn.get(broker)
            and not quotas.room_needed(listener, ip, tls, broker)
            and (not leases or leases.fits(quotas.rooms(listener, ip, tls, broker)))
        ):
            decision = quotas.on_accept(conn_id, listener=listener, ip=ip, tls=tls, now=time.monotonic(), broker=broker)
            return self._answer(worker, conn_id, listener, peer, ip, tls, broker, decision)
        return self._open_in_turn(worker, conn_id, listener, peer, ip, tls, broker)

    async def _open_in_turn(
        self, worker: int, conn_id: str, listener: str, peer: str, ip: str, tls: bool, broker: BrokerKey
    ) -> OpenAnswer:
        quotas = self.quotas
        gone = self._gone.get(worker, 0)
        start = trio.current_time()
        deadline = start + self.wait_seconds
        first_wait: Decision | None = None
        self._in_turn[broker] = self._in_turn.get(broker, 0) + 1
        try:
            while True:
                async with self._deciding:
                    if self.leases.get(broker):
                        with trio.move_on_at(deadline):
                            await self._recall(broker)  # decided with no slot out: exact counts
                        if self.leases.get(broker):  # a worker kept its slots (stopped): no exact count by the deadline
                            refused = self._waited("a worker did not give its lent slots back")
                            return OpenAnswer(False, refused, None, trio.current_time() - start, watch=self._watch)
                    need = quotas.room_needed(listener, ip, tls, broker)
                    idle = await self._activity([broker], need) if need else None
                    if self._gone.get(worker, 0) != gone:
                        return OpenAnswer(False, None, watch=self._watch)  # nobody to answer; nothing counted
                    if idle is not None:
                        quotas.sync_activity(idle, [broker])
                    decision = quotas.on_accept(
                        conn_id, listener=listener, ip=ip, tls=tls, now=time.monotonic(), broker=broker
                    )
                if decision is None or decision.action is not Action.WAIT or not decision.enforced:
                    break
                if first_wait is None:
                    first_wait = decision
                    # Recorded by the worker now, as one process records a wait when it starts (not
                    # when the open is at last admitted or refused): the link keeps it before the answer.
                    self._tell(worker, "conn.waiting", conn_id, decision)
                self._waiting += 1
                self._update_watch()
                try:
                    with trio.move_on_at(deadline):
                        await self._room.wait()
                        continue
                finally:
                    self._waiting -= 1
                    self._update_watch()
                refused = self._waited(decision.reason)
                return OpenAnswer(False, refused, first_wait, trio.current_time() - start, watch=self._watch)
        finally:
            self._in_turn[broker] -= 1
            if not self._in_turn[broker]:
                del self._in_turn[broker]
        blocked = trio.current_time() - start if first_wait is not None else 0.0
        return self._answer(worker, conn_id, listener, peer, ip, tls, broker, decision, first_wait, blocked)

    def _waited(self, why: str) -> Decision:
        return Decision(
            Policy.CONNECTIONS,
            Action.REFUSE,
            Mode.ENFORCE,
            MAX_CONNECTIONS_WAIT_MS,
            f"waited {self.wait_seconds:g}s for a slot ({why})",
            limit=round(self.wait_seconds * 1000),
        )

    def _answer(
        self,
        worker: int,
        conn_id: str,
        listener: str,
        peer: str,
        ip: str,
        tls: bool,
        broker: BrokerKey,
        decision: Decision | None,
        waited: Decision | None = None,
        blocked: float = 0.0,
    ) -> OpenAnswer:
        quotas = self.quotas
        if conn_id not in quotas:
            return OpenAnswer(False, decision, waited, blocked, watch=self._watch)
        self._holder[conn_id] = worker
        self._observe_open(conn_id, listener, peer, tls)
        if decision is not None and decision.enforced and decision.action is Action.EVICT:
            self._tell_holders(decision.victims, decision)
        if decision is None:
            self._lend(worker, broker, (listener, tls, ip))  # told before the answer: the worker has them then
        return OpenAnswer(True, decision, waited, blocked, self._watch)

    def _observe_open(self, conn_id: str, listener: str, peer: str, tls: bool, ts: float | None = None) -> None:
        """A connection counted: in the proxy's window, and its open event with the counts its
        limits compare now, itself included (only the owner knows them across the workers)."""
        if self.window is not None:
            self.window.on_connection_open(listener, tls)
            self._observed[conn_id] = (listener, tls)
        if self.audit is not None:
            record_lifecycle(
                self.audit,
                None,
                "open",
                conn_id=conn_id,
                listener=listener,
                peer=peer,
                tls=tls,
                counts=self.quotas.open_counts(conn_id),
                closed={},
                passthrough=listener in self._passthrough,
                ts=ts,
            )

    def _observe_close(self, conn_id: str) -> None:
        kind = self._observed.pop(conn_id, None)
        if self.window is not None and kind is not None:
            self.window.on_connection_close(*kind)

    # -- slots lent to workers --------------------------------------------------------------------

    def _lend(self, worker: int, broker: BrokerKey, cell: LeaseCell) -> None:
        """Top worker ``worker``'s slots of ``cell`` of broker ``broker``'s pool up to LEASE_SLOTS
        when half are used, as far as every limit of the cell has room beside the slots out; none
        while an open of that pool is decided in turn or its slots are being taken back."""
        leases = self.leases.get(broker)
        if leases is None:
            leases = self.leases[broker] = SlotLeases(self._protected)
        held = leases.held(worker, cell)
        if held > LEASE_SLOTS // 2 or self._recalling.get(broker) or self._in_turn.get(broker):
            return
        listener, tls, ip = cell
        # At most a share of the free room each (half of it among all workers): near a limit the
        # others' opens still fit beside the slots out, instead of calling them back.
        share = 2 * max(1, len(self._links))
        n = leases.grant(worker, cell, self.quotas.rooms(listener, ip, tls, broker), LEASE_SLOTS - held, share)
        if n:
            self._tell(worker, "conn.lease", broker, cell, n)

    def opened(
        self, worker: int, conn_id: str, listener: str, peer: str, ip: str, tls: bool, ts: float, broker: BrokerKey
    ) -> None:
        """Worker ``worker`` admitted ``conn_id`` from a slot of its lease of broker ``broker``'s pool
        at ``ts`` (Unix time): counted from now on, its open event written with the counts after
        counting it (the ones one process records, in the order the owner learns of the admissions)."""
        self.opens["slot"] += 1
        cell = (listener, tls, ip)
        self.leases[broker].used(worker, cell)
        self.quotas.on_leased(conn_id, listener=listener, ip=ip, tls=tls, now=time.monotonic(), broker=broker)
        self._holder[conn_id] = worker
        self._observe_open(conn_id, listener, peer, tls, ts)
        if self.quotas.over_cap:  # admitted before a reload that lowered a cap reached its worker
            self._update_watch()
        else:
            self._lend(worker, broker, cell)

    def returned(self, worker: int, broker: BrokerKey, returned: list[tuple[LeaseCell, int]]) -> None:
        """Worker ``worker`` dropped these unused slots of broker ``broker``'s pool (after telling
        every admission from them)."""
        for cell, n in returned:
            self.leases[broker].give_back(worker, cell, n)
        self._returned.set()
        self._returned = trio.Event()

    async def _recall(self, broker: BrokerKey) -> None:
        """Take every slot of broker ``broker``'s pool back: each holder drops its slots and says
        how many, after telling the admissions it made from them; a worker that dies gives its slots
        back too."""
        self._recalling[broker] = self._recalling.get(broker, 0) + 1
        try:
            leases = self.leases.get(broker)
            for holder in leases.holders() if leases else []:
                self._tell(holder, "conn.recall", broker)
            while self.leases.get(broker):
                await self._returned.wait()
        finally:
            self._recalling[broker] -= 1
            if not self._recalling[broker]:
                del self._recalling[broker]

    def _tell(self, worker: int, kind: str, *args: object) -> None:
        link = self._links.get(worker)
        if link is not None:
            link.tell(kind, *args)

    async def _activity(self, brokers: list[BrokerKey], per_cell: int) -> dict[str, float]:
        """Every worker's ``per_cell`` least recently used idle connections of each cell of these
        brokers' pools, with their last activity (``time.monotonic()``); asked of all at once."""
        idle: dict[str, float] = {}

        async def ask(link: Link) -> None:
            try:
                idle.update(await link.ask("conn.idle", brokers, per_cell))
            except (LinkClosed, RemoteError):
                pass  # a worker that died holds nothing (worker_gone), one that failed offers nothing

        with trio.move_on_after(ROUND_TIMEOUT_S):  # a stopped worker holds no decision up for long
            async with trio.open_nursery() as nursery:
                for link in list(self._links.values()):
                    nursery.start_soon(ask, link)
        return dict(idle)

    # -- closes, moves and activity -------------------------------------------------------------

    def closed(self, worker: int, conn_id: str) -> None:
        if self._holder.get(conn_id) != worker:
            return
        del self._holder[conn_id]
        self.quotas.on_closed(conn_id)
        self._observe_close(conn_id)
        self._wake()
        if self._watch and not self.quotas.over_cap:
            self._update_watch()

    def reached(self, conn_id: str, address: str, broker: int | None) -> Coroutine[Any, Any, None] | None:
        """A BOOTSTRAP-pool connection connected to ``address``: BrokerQuotas.on_reached, the move
        (if any) followed by its holder, whose local LRU lists must name the same pools. A move into
        a node's pool with slots out would take their room: applied once they are back (``_moved_later``)."""
        if broker is not None and self.quotas.broker_of(conn_id) == BOOTSTRAP and self._move_waits(broker):
            return self._moved_later(broker, self.reached, conn_id, address, broker)
        if self.quotas.on_reached(conn_id, address, broker) and broker is not None:
            self._follow_moves([conn_id], broker)
        return None

    def _move_waits(self, broker: int) -> bool:
        """A move into ``broker``'s pool would be made now (it counts no connection), and workers
        hold slots of it: admissions from them may be on their way, and each took room the move would
        take."""
        return bool(self.leases.get(broker)) and broker not in self.quotas.counts_by_broker()

    async def _moved_later(self, broker: int, handle: Any, *args: Any) -> None:
        """``handle(*args)`` once every slot of ``broker``'s pool is back (none is lent meanwhile),
        the admissions made from them counted first: the move rule then sees what one process would
        see with the tell arriving after them (they count: no move; none: the move, exact)."""
        await self._recall(broker)
        handle(*args)

    def broker_known(self, broker: int, address: str) -> Coroutine[Any, Any, None] | None:
        """BrokerQuotas.on_broker_known (every worker learns each broker: the first tell moves); as
        ``reached``, after that node's slots are back when workers hold some."""
        if self._move_waits(broker):
            return self._moved_later(broker, self.broker_known, broker, address)
        quotas = self.quotas
        waiting = [conn_id for conn_id in self._holder if quotas.broker_of(conn_id) == BOOTSTRAP]
        if quotas.on_broker_known(broker, address):
            self._follow_moves([c for c in waiting if quotas.broker_of(c) == broker], broker)
        return None

    def _follow_moves(self, conn_ids: Iterable[str], broker: int) -> None:
        by_holder: dict[int, list[str]] = {}
        for conn_id in conn_ids:
            by_holder.setdefault(self._holder[conn_id], []).append(conn_id)
        for holder, ids in by_holder.items():
            link = self._links.get(holder)
            if link is not None:
                link.tell("conn.moved", ids, broker)
        self._wake()  # each move frees a slot in the BOOTSTRAP pool

    def turned_idle(self) -> Coroutine[Any, Any, None] | None:
        """A worker's connection turned idle while watched: a waiting open may evict it, and a cap
        over its limit may close it."""
        self._wake()
        return self.reclaim() if self.quotas.over_cap else None

    def reclaim(self) -> Coroutine[Any, Any, None] | None:
        """Close the excess of caps over their limit (a reload lowered them), LRU-first among the
        idle connections of every worker: one round at a time, again if asked meanwhile."""
        if self._reclaiming:
            self._reclaim_again = True
            return None
        self._reclaiming = True
        return self._reclaim()

    async def _reclaim(self) -> None:
        quotas = self.quotas
        try:
            while True:
                self._reclaim_again = False
                async with self._deciding:
                    excess = quotas.excess()
                    if excess and (self._relimit or quotas.over_cap):
                        brokers = list(excess)
                        idle = await self._activity(brokers, max(excess.values()))
                        quotas.sync_activity(idle, brokers)
                        # After a reload: update_limits again, now with the activity, as one process
                        # applies a reload (in OBSERVE it reports what ENFORCE would close).
                        relimit, self._relimit = self._relimit, False
                        closes = (
                            quotas.update_limits(quotas.limits, time.monotonic())
                            if relimit
                            else quotas.reclaim_excess()
                        )
                        for decision in closes:
                            self._tell_holders(decision.victims, decision)
                    else:
                        self._relimit = False
                if not self._reclaim_again:
                    break
        finally:
            self._reclaiming = False
            self._update_watch()

    def _tell_holders(self, victims: Iterable[str], decision: Decision) -> None:
        """Each victim's worker closes it (``conn.close``): at once if it is still idle, else
        when its requests are answered. Its slot is free already (it is closing here)."""
        by_holder: dict[int, list[str]] = {}
        for conn_id in victims:
            holder = self._holder.get(conn_id)
            if holder is not None:
                by_holder.setdefault(holder, []).append(conn_id)
        for holder, ids in by_holder.items():
            link = self._links.get(holder)
            if link is not None:
                link.tell("conn.close", ids, decision)

    def _wake(self) -> None:
        if self._waiting:
            self._room.set()
            self._room = trio.Event()

    def _update_watch(self) -> None:
        watch = bool(self._waiting) or self.quotas.over_cap
        if watch != self._watch:
            self._watch = watch
            for link in self._links.values():
                link.tell("conn.watch", watch)


class OpensCollector(Collector):
    """How the workers' connection opens were admitted: from a slot the owner lent (nothing asked),
    or asked of the owner (a worker's first open of a cell, near a limit)."""

    def __init__(self, opens: dict[str, int]) -> None:
        self._opens = opens

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "kafka_admission_worker_connection_opens",
            "Connection opens with workers, by how: admitted from a slot the owner lent the worker, or asked",
            labels=["how"],
        )
        for how, n in self._opens.items():
            family.add_metric([how], n)
        yield family
