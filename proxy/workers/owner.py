"""The owner of the limits every worker shares (docs/workers.md): one instance of each
shared service, run by the supervisor. A service decides for all workers (one decider,
one order: exact as one process is), hears each worker over its link, and gives back
what a worker held when it dies. The deciding itself stays in ``policies/``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Protocol

import trio
from prometheus_client.registry import Collector

from proxy.config.model import Config
from proxy.workers.link import Handler, Link
from proxy.workers.owner_connections import ConnectionOwner
from proxy.workers.owner_groups import GroupOwner
from proxy.workers.owner_pool import PoolOwner


class SharedService(Protocol):
    def handlers(self, worker: int) -> dict[str, Handler]:
        """The handlers of this worker's asks and tells (kinds prefixed by the service)."""
        ...

    def attach(self, worker: int, link: Link) -> None:
        """The link to this worker (before its process starts, and again after a restart).
        The worker registers its own handlers while it builds its ProxyServer: a message sent
        to it before it has asked or told anything may find none (a tell is then dropped)."""
        ...

    def worker_gone(self, worker: int) -> dict[str, int]:
        """The worker died: release all it held; what was released, e.g. ``{"connections": 3}``."""
        ...

    def reconfigure(self, config: Config) -> None:
        """A reload: applied here before the workers apply it."""
        ...

    def collectors(self) -> list[Collector]:
        """Prometheus collectors of the state this service owns."""
        ...


# Every shared service, each built as ``Service(config)``: adding one is adding it here.
SERVICES: tuple[Callable[[Config], SharedService], ...] = (ConnectionOwner, GroupOwner, PoolOwner)


class Owner:
    def __init__(self, config: Config) -> None:
        self.services = [make(config) for make in SERVICES]

    def attach(self, worker: int, link: Link) -> None:
        for service in self.services:
            link.handlers.update(service.handlers(worker))
            service.attach(worker, link)

    def worker_gone(self, worker: int) -> dict[str, int]:
        released: Counter[str] = Counter()
        for service in self.services:
            released.update(service.worker_gone(worker))
        return dict(released)

    def reconfigure(self, config: Config) -> None:
        for service in self.services:
            service.reconfigure(config)

    def collectors(self) -> list[Collector]:
        return [collector for service in self.services for collector in service.collectors()]

    async def run(self) -> None:
        """Each service's own background work, if it has any (an ``async def run()``: e.g. group
        session expiry on the owner's clock), for as long as the supervisor runs."""
        async with trio.open_nursery() as nursery:
            for service in self.services:
                run = getattr(service, "run", None)
                if run is not None:
                    nursery.start_soon(run)
