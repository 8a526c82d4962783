"""The owner's side of the one KIP-72 budget across workers (issue 29): the shared service
that leases ``queued.max.request.bytes`` to the workers (policies/pool_leases.py decides;
docs/workers.md, "The pool: leases").

Messages (prefixed ``pool.``): a worker asks ``pool.ask(hold, want)`` and is answered with the
bytes granted (with whether it waited and the recall's state), at once while budget remains,
or when bytes come back (an ask that waits is a task here, holding up no other message); it
tells ``pool.give_back(size)``. The owner tells every worker ``pool.recall(True, epoch)`` when
an ask must wait and ``pool.recall(False, epoch)`` when none waits any more; the epoch orders
the news, which also reaches a worker in the answers to its asks. With the pool off
(``queued.max.request.bytes <= 0``) nothing is leased and the workers never ask.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Iterator

import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from policies.pool_leases import LeaseBook, LeaseGrant
from proxy.config.model import Config
from proxy.workers.link import Handler, Link

ASK, GIVE_BACK, RECALL = "pool.ask", "pool.give_back", "pool.recall"


class PoolOwner:
    """The lease book and the links to the workers it leases to."""

    def __init__(self, config: Config) -> None:
        policies = config.policies
        capacity = policies.queued_max_request_bytes
        self._capacity = capacity
        self.book = LeaseBook(capacity, policies.socket_request_max_bytes) if capacity > 0 else None
        self._links: dict[int, Link] = {}
        self._answers: dict[tuple[int, int], trio.MemorySendChannel[int]] = {}  # asks waiting for bytes
        self._ask_ids = itertools.count(1)
        self._recalling = False
        self._recall_epoch = 0  # counts the recall's changes: a worker applies only news newer than it has

    # -- the shared-service interface ----------------------------------------------

    def handlers(self, worker: int) -> dict[str, Handler]:
        if self.book is None:
            return {}
        return {ASK: functools.partial(self._ask, worker), GIVE_BACK: functools.partial(self._give_back, worker)}

    def attach(self, worker: int, link: Link) -> None:
        self._links[worker] = link
        if self._recalling:
            link.tell(RECALL, True, self._recall_epoch)

    def worker_gone(self, worker: int) -> dict[str, int]:
        """Its lease comes back (waiting asks of other workers are granted); its asks are dropped."""
        self._links.pop(worker, None)
        if self.book is None:
            return {"pool_bytes": 0}
        for key in [key for key in self._answers if key[0] == worker]:
            self._answers.pop(key).close()
        released, grants = self.book.worker_gone(worker, time.monotonic())
        self._answer(grants)
        return {"pool_bytes": released}

    def reconfigure(self, config: Config) -> None:
        """socket.request.max.bytes for the grants to come; the budget is sized at start."""
        if self.book is not None:
            self.book.reconfigure(config.policies.socket_request_max_bytes)

    def collectors(self) -> list[Collector]:
        return [LeaseCollector(self._capacity, self.book)]

    # -- handlers ----------------------------------------------------------------------

    async def _ask(self, worker: int, hold: int, want: int) -> tuple[int, bool, bool, int]:
        """The bytes granted, whether the ask waited (the budget was all leased), and the recall
        as this answer leaves (whether the owner recalls, and its epoch): a recall told before
        the worker could hear it is not lost."""
        assert self.book is not None
        ask = next(self._ask_ids)
        granted = self.book.ask(worker, ask, hold, want, time.monotonic())
        if granted is not None:
            return granted, False, self._recalling, self._recall_epoch
        send, receive = trio.open_memory_channel[int](1)
        self._answers[(worker, ask)] = send
        self._recall()
        try:
            granted = await receive.receive()
        except trio.EndOfChannel:  # the worker is gone: nobody reads this answer
            granted = 0
        return granted, True, self._recalling, self._recall_epoch

    def _give_back(self, worker: int, size: int) -> None:
        assert self.book is not None
        self._answer(self.book.give_back(worker, size, time.monotonic()))

    def _answer(self, grants: list[LeaseGrant]) -> None:
        for grant in grants:
            self._answers.pop((grant.worker, grant.ask)).send_nowait(grant.size)
        self._recall()

    def _recall(self) -> None:
        """Tell every worker when the book starts or stops recalling unused leases."""
        assert self.book is not None
        if self.book.recalling != self._recalling:
            self._recalling = self.book.recalling
            self._recall_epoch += 1
            for link in self._links.values():
                link.tell(RECALL, self._recalling, self._recall_epoch)


class LeaseCollector(Collector):
    """The budget as the owner sees it, read at scrape time (from any thread: plain reads); with
    the pool off, only its capacity (``queued.max.request.bytes``, <= 0)."""

    def __init__(self, capacity: int, book: LeaseBook | None) -> None:
        self._capacity = capacity
        self._book = book

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield GaugeMetricFamily(
            "kafka_admission_memory_pool_capacity_bytes", "queued.max.request.bytes", value=self._capacity
        )
        book = self._book
        if book is None:
            return
        yield GaugeMetricFamily(
            "kafka_admission_memory_pool_leased_bytes",
            "Bytes of queued.max.request.bytes leased to the workers, in use or not (at most the budget "
            "plus socket.request.max.bytes - 1)",
            value=book.leased,
        )
        yield GaugeMetricFamily(
            "kafka_admission_memory_pool_leased_high_water_mark_bytes",
            "Most bytes ever leased to the workers at once",
            value=book.peak_leased,
        )
        yield GaugeMetricFamily(
            "kafka_admission_memory_pool_lease_asks_waiting",
            "Workers' asks for pool bytes waiting at the owner (the budget is all leased)",
            value=book.waiting,
        )
        yield CounterMetricFamily(
            "kafka_admission_memory_pool_depleted_seconds",
            "Time an ask for pool bytes waited at the owner: the budget was all leased and a worker "
            "needed more (Kafka's MemoryPoolDepletedTimeTotal, across workers)",
            value=book.depleted_seconds(time.monotonic()),
        )
