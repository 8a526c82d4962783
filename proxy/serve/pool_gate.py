"""The trio side of the KIP-72 memory pool: a request is granted its bytes at once
in the common case (no await); a connection that needs memory the pool cannot
grant waits on an Event (no busy loop, no reading from its socket: TCP
backpressure) until a release grants it, in the pool's FIFO order."""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterator

import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from policies.decision import Admission
from policies.memory_pool import MemoryPool
from policies.mode import Mode
from proxy.evidence.decisions import DecisionRecorder, Where
from proxy.evidence.metrics import Metrics
from proxy.evidence.observation_window import ObservationWindow

log = logging.getLogger("kafka_admission_proxy.memory")


class PoolGate:
    def __init__(
        self, pool: MemoryPool, metrics: Metrics, recorder: DecisionRecorder, window: ObservationWindow | None
    ) -> None:
        self.pool = pool
        self._recorder = recorder
        self._window = window
        self._woken: dict[int, trio.Event] = {}
        metrics.registry.register(_PoolCollector(pool))

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

    def _wake(self, granted: list[int]) -> None:
        for ticket in granted:
            event = self._woken.pop(ticket, None)
            if event is not None:
                event.set()


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
