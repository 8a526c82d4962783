"""The trio side of the KIP-72 memory pool: a request is granted its bytes at once
in the common case (no await); a connection that needs memory the pool cannot
grant waits on an Event (no busy loop, no reading from its socket: TCP
backpressure) until a release grants it, in the pool's FIFO order.

With ``workers: N`` a worker's pool is its lease of the one budget
(:class:`LeasedPoolGate`, policies/pool_leases.py): one task asks the owner for
bytes when a request does not fit, and what the worker holds unused goes back."""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterator

import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from policies.decision import Admission, Decision
from policies.memory_pool import MemoryPool
from policies.mode import Mode
from policies.pool_leases import LeasedMemoryPool
from policies.properties import QUEUED_MAX_REQUEST_BYTES
from proxy.evidence.decisions import DecisionRecorder, Where
from proxy.evidence.metrics import Metrics
from proxy.evidence.observation_window import ObservationWindow
from proxy.workers.link import Link, LinkClosed

log = logging.getLogger("kafka_admission_proxy.memory")


class PoolGate:
    def __init__(
        self, pool: MemoryPool, metrics: Metrics, recorder: DecisionRecorder, window: ObservationWindow | None
    ) -> None:
        self.pool = pool
        self._recorder = recorder
        self._window = window
        self._woken: dict[int, trio.Event] = {}
        self._export(metrics)

    def reserve(self, conn_id: Hashable, size: int, now: float, where: Where) -> Admission:
        """The pool's admission of ``size`` bytes (a decision other than None is recorded); when it
        ``waits``, wait with ``wait_for`` (the pool grants in FIFO order as memory is released)."""
        admission = self.pool.reserve(conn_id, size, now)
        decision = admission.decision
        if decision is None:
            return admission
        self._recorder.record(decision, where, size=size)
        if self._window is not None:
            self._window.on_pool(self.pool.used, waited=True)
        if admission.waits:
            self._woken[admission.ticket] = trio.Event()  # type: ignore[index]
        return admission

    async def wait_for(self, ticket: int) -> None:
        event = self._woken.get(ticket)
        if event is None:
            return  # granted since
        try:
            await event.wait()
        finally:
            # Cancelled (the connection is ending): its cancel() drops the queued wait.
            self._woken.pop(ticket, None)

    def release(self, ticket: int | None, now: float) -> None:
        if ticket is not None:
            granted = self.pool.release(ticket, now)
            if granted:  # per request: no call when nobody waited
                self._wake(granted)

    def reconfigure(self, max_request: int, mode: Mode) -> None:
        """A reload: socket.request.max.bytes and the mode (observe lets waiters go)."""
        self._wake(self.pool.reconfigure(max_request, mode, trio.current_time()))

    def cancel(self, conn_id: Hashable) -> None:
        """The connection is gone: its bytes return, its waits are dropped."""
        self._wake(self.pool.cancel(conn_id, trio.current_time()))

    def _export(self, metrics: Metrics) -> None:
        """The pool state /metrics shows, read when scraped."""
        metrics.registry.register(_PoolCollector(self.pool))

    def _wake(self, granted: list[int]) -> None:
        for ticket in granted:
            event = self._woken.pop(ticket, None)
            if event is not None:
                event.set()


class LeasedPoolGate(PoolGate):
    """A worker's pool with ``workers: N``: grants from its lease; one task (``run``) asks the
    owner over ``link`` when a request does not fit; unused bytes are given back as the policy
    says, at once while the owner recalls (so a request waiting in another worker gets them).

    A request that waits only for its worker's lease to grow, while the budget has bytes left,
    is not a pool decision: its WAIT is recorded only once the budget is found all leased (the
    owner made the ask wait, or recalls), as one process records a wait only when the pool is
    exhausted."""

    pool: LeasedMemoryPool

    def __init__(
        self,
        pool: LeasedMemoryPool,
        metrics: Metrics,
        recorder: DecisionRecorder,
        window: ObservationWindow | None,
        link: Link,
    ) -> None:
        super().__init__(pool, metrics, recorder, window)
        self._link = link
        self._wanted = trio.Event()  # the lease may be short: the asking task looks
        self._unrecorded: dict[int, tuple[Decision, Where, int]] = {}  # WAITs for the lease alone, so far
        self._recall_epoch = 0  # of the owner's latest news of its recall
        link.handlers["pool.recall"] = self._recall

    def reserve(self, conn_id: Hashable, size: int, now: float, where: Where) -> Admission:
        pool = self.pool
        admission = pool.reserve(conn_id, size, now)
        decision = admission.decision
        if decision is None:
            return admission
        ticket: int = admission.ticket  # type: ignore[assignment]
        if admission.waits:
            self._woken[ticket] = trio.Event()
        if pool.recalled or decision.limit_key != QUEUED_MAX_REQUEST_BYTES:
            self._record(decision, where, size)  # the budget is all leased, or the connection's share holds it
        else:
            self._unrecorded[ticket] = (decision, where, size)
        self._wanted.set()
        return admission

    def release(self, ticket: int | None, now: float) -> None:
        if ticket is not None:
            pool = self.pool
            granted = pool.release(ticket, now)
            if granted:
                self._wake(granted)
            back = pool.give_back()
            if back:
                self._link.tell("pool.give_back", back)
            if pool.waiting and pool.wanted():  # a waiter its share held back may now need the owner
                self._wanted.set()

    def reconfigure(self, max_request: int, mode: Mode) -> None:
        super().reconfigure(max_request, mode)
        self._settle()

    def cancel(self, conn_id: Hashable) -> None:
        super().cancel(conn_id)
        self._settle()

    def close(self) -> None:
        """The worker is exiting, its requests ended: it gives all its lease back, as while the
        owner recalls, so the owner's book has it from the worker, not from the release at its death."""
        self._wake(self.pool.recall(True, trio.current_time()))
        self._settle()

    async def run(self) -> None:
        """Ask the owner for the lease the worker must hold, one ask at a time, while it is short.
        Ends when the owner is gone (the worker then ends too)."""
        pool, link = self.pool, self._link
        try:
            while True:
                await self._wanted.wait()
                self._wanted = trio.Event()
                while hold := pool.wanted():
                    got, waited, recalling, epoch = await link.ask("pool.ask", hold, pool.lease_size)
                    if waited:  # the budget was all leased: those requests waited for it
                        self._record_unrecorded()
                    self._wake(pool.grow(got, trio.current_time()))
                    self._forget_granted()
                    self._recall(recalling, epoch)  # a recall told before this worker could hear it
                    self._settle()
                self._forget_granted()  # also those a release let go before any ask
        except LinkClosed:
            log.warning("the owner of the pool's budget is gone: no more pool bytes")

    def _export(self, metrics: Metrics) -> None:
        """A worker's part of the pool (the budget, the leases and the depleted time are the
        owner's: proxy/workers/owner_pool.py), written to the metric files at each flush: used,
        lease and waiting add up across the workers."""
        pool = self.pool
        metrics.watch_gauge(
            "kafka_admission_memory_pool_used_bytes", "Bytes of requests read and not yet answered", lambda: pool.used
        )
        metrics.watch_gauge(
            "kafka_admission_memory_pool_lease_bytes",
            "Bytes of queued.max.request.bytes the workers hold from the owner, in use or not",
            lambda: pool.lease,
        )
        metrics.watch_gauge(
            "kafka_admission_memory_pool_high_water_mark_bytes",
            "Most bytes ever in use in one worker",
            lambda: pool.high_water_mark,
            combine="livemax",
        )
        metrics.watch_gauge(
            "kafka_admission_memory_pool_waiting_requests", "Requests waiting for memory", lambda: pool.waiting
        )

    def _record(self, decision: Decision, where: Where, size: int) -> None:
        self._recorder.record(decision, where, size=size)
        if self._window is not None:
            self._window.on_pool(self.pool.used, waited=True)

    def _forget_granted(self) -> None:
        """Requests granted without the budget running out are no decision; those still waiting
        keep theirs. Observe mode grants at once, past the lease: there the lease covers the oldest
        requests, and the newest ones it does not cover (the debt) keep theirs, as one process
        records a would-be wait for each request the budget had no room for."""
        if self._unrecorded:
            woken, debt = self._woken, self.pool.used - self.pool.lease
            kept: dict[int, tuple[Decision, Where, int]] = {}
            for ticket, about in reversed(self._unrecorded.items()):
                if ticket in woken:
                    kept[ticket] = about
                elif debt > 0:
                    kept[ticket] = about
                    debt -= about[2]
            self._unrecorded = dict(reversed(kept.items()))

    def _record_unrecorded(self) -> None:
        for decision, where, size in self._unrecorded.values():
            self._record(decision, where, size)
        self._unrecorded.clear()

    def _recall(self, recalled: bool, epoch: int) -> None:
        """The owner starts or ends a recall of unused leases (a tell from it, or in an answer):
        news older than what the worker has heard is ignored."""
        if epoch <= self._recall_epoch:
            return
        self._recall_epoch = epoch
        if recalled:
            self._record_unrecorded()  # they wait for a budget all leased
        self._wake(self.pool.recall(recalled, trio.current_time()))
        self._settle()

    def _settle(self) -> None:
        """After a change: give back what the policy says, and wake the asking task if short."""
        back = self.pool.give_back()
        if back:
            self._link.tell("pool.give_back", back)
        if self.pool.wanted():
            self._wanted.set()


class _PoolCollector(Collector):
    """Pool state read at scrape time: nothing on the request path."""

    def __init__(self, pool: MemoryPool) -> None:
        self._pool = pool

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        pool = self._pool
        yield GaugeMetricFamily(
            "kafka_admission_memory_pool_capacity_bytes", "queued.max.request.bytes", value=pool.capacity
        )
        yield GaugeMetricFamily(
            "kafka_admission_memory_pool_used_bytes", "Bytes of requests read and not yet answered", value=pool.used
        )
        yield GaugeMetricFamily(
            "kafka_admission_memory_pool_available_bytes",
            "capacity - used (negative after a non-strict grant)",
            value=pool.capacity - pool.used,
        )
        yield GaugeMetricFamily(
            "kafka_admission_memory_pool_high_water_mark_bytes", "Most bytes ever in use", value=pool.high_water_mark
        )
        yield GaugeMetricFamily(
            "kafka_admission_memory_pool_waiting_requests", "Requests waiting for memory", value=pool.waiting
        )
        try:
            now = trio.current_time()
        except RuntimeError:  # scraped outside trio (tests): no spell in progress is counted
            now = 0.0
        yield CounterMetricFamily(
            "kafka_admission_memory_pool_depleted_seconds",
            "Time the pool had nothing left (Kafka's MemoryPoolDepletedTimeTotal)",
            value=pool.depleted_seconds(now),
        )
