"""The trio side of the KIP-72 memory pool: a connection that needs memory the
pool cannot grant waits on an Event (no busy loop, no reading from its socket:
TCP backpressure) until a release grants it, in the pool's FIFO order."""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterator

import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from policies.memory_pool import Grant, MemoryPool
from policies.mode import Mode

from .audit import AuditSink
from .metrics import Metrics

log = logging.getLogger("kafka_admission_proxy.memory")


class PoolGate:
    def __init__(self, pool: MemoryPool, metrics: Metrics, audit: AuditSink) -> None:
        self.pool = pool
        self._metrics = metrics
        self._audit = audit
        self._woken: dict[int, trio.Event] = {}
        metrics.registry.register(_PoolCollector(pool))

    @property
    def enabled(self) -> bool:
        return self.pool.enabled

    async def reserve(self, conn_id: Hashable, size: int, listener: str, peer: str) -> int:
        """A ticket for ``size`` bytes, once the pool grants them."""
        decision = self.pool.reserve(conn_id, size, trio.current_time())
        mode = self.pool.mode.value
        if isinstance(decision, Grant):
            if decision.would_wait:
                self._decided(listener, peer, size, mode, "pool_depleted")
            return decision.ticket
        self._decided(listener, peer, size, mode, decision.reason.value)
        event = self._woken[decision.ticket] = trio.Event()
        try:
            await event.wait()
        except BaseException:
            # Cancelled (the connection is ending): its cancel() drops the queued wait.
            self._woken.pop(decision.ticket, None)
            raise
        return decision.ticket

    def release(self, ticket: int) -> None:
        self._wake(self.pool.release(ticket, trio.current_time()))

    def cancel(self, conn_id: Hashable) -> None:
        """The connection is gone: its bytes return, its waits are dropped."""
        self._wake(self.pool.cancel(conn_id, trio.current_time()))

    def _wake(self, granted: list[Grant]) -> None:
        for grant in granted:
            event = self._woken.pop(grant.ticket, None)
            if event is not None:
                event.set()

    def _decided(self, listener: str, peer: str, size: int, mode: str, reason: str) -> None:
        self._metrics.memory_pool_waits.labels(reason, mode).inc()
        self._audit.emit(
            "memory_pool_wait",
            listener=listener,
            peer=peer,
            size=size,
            mode=mode,
            reason=reason,
            used=self.pool.used,
            capacity=self.pool.capacity,
        )


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


def build_pool(capacity: int, max_request: int, per_connection: int, mode: str) -> MemoryPool:
    return MemoryPool(capacity, max_request, per_connection, Mode(mode))
