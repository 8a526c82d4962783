"""Cluster mode with workers: a broker one worker learns from a response is known to every worker
before any client hears of it, as one process knows it (proxy/links/brokers.py).

Each worker predicts at accept which broker a bootstrap-port connection counts against
(policies.connections.bootstrap_broker) from what it knows. A worker that did not know a broker yet
counted a client's next connection in the BOOTSTRAP pool, where it stayed (that broker's pool counted
another's connection already, so the move rule kept it out), and the broker's caps then admitted
one connection too many: max.connections 2 let 3 in. So the worker that learns a broker asks the
supervisor (``worker.brokers``), which tells every other worker and answers once each learned it
(or ``SPREAD_TIMEOUT_S`` passed: a stopped worker holds no response up for long); only then does
the response go on. Each worker asks once per broker (and again when it moves).
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterable, Mapping
from typing import Any

import trio

from proxy.links.brokers import BrokerDirectory
from proxy.protocol.rewrite import BrokerAddress
from proxy.workers.link import Link, LinkClosed, RemoteError

# How long a response naming a new broker waits for the other workers to learn it (each does at once).
SPREAD_TIMEOUT_S = 1.0


class SharedBrokers:
    """The supervisor's side: what the workers learned (a restarted worker is told it all), and
    the spreading of what one learned to the others."""

    def __init__(self) -> None:
        self.known: dict[int, BrokerAddress] = {}
        self._spreading: dict[int, trio.Event] = {}  # node -> set once every worker was told (and learned) it

    def learned(self, others: Mapping[int, Link], brokers: list[BrokerAddress]) -> Coroutine[Any, Any, None] | None:
        """A worker learned ``brokers`` from a response; answered once every worker of ``others``
        (the serving ones but the asker) learned them, those another worker's ask is spreading too."""
        pending = [event for b in brokers if (event := self._spreading.get(b.node_id)) is not None]
        new = [b for b in brokers if self.known.get(b.node_id) != b]
        if not new and not pending:
            return None
        done = trio.Event()
        for broker in new:  # before any other ask is handled: it waits for this spread
            self.known[broker.node_id] = broker
            self._spreading[broker.node_id] = done
        return self._spread(others, new, done, pending)

    async def _spread(
        self, others: Mapping[int, Link], new: list[BrokerAddress], done: trio.Event, pending: list[trio.Event]
    ) -> None:
        if new:
            try:
                with trio.move_on_after(SPREAD_TIMEOUT_S):
                    async with trio.open_nursery() as nursery:
                        for link in list(others.values()):
                            nursery.start_soon(_tell_learned, link, new)
            finally:
                done.set()
                for broker in new:
                    if self._spreading.get(broker.node_id) is done:
                        del self._spreading[broker.node_id]
        with trio.move_on_after(SPREAD_TIMEOUT_S):
            for event in pending:
                await event.wait()


async def _tell_learned(link: Link, brokers: list[BrokerAddress]) -> None:
    try:
        await link.ask("worker.brokers", brokers)
    except (LinkClosed, RemoteError):
        pass  # a worker that died learns them all when it serves again


def share_brokers(directory: BrokerDirectory, link: Link) -> None:
    """A worker's side: what it learns from a response is passed on before the response goes on;
    what the supervisor tells it (another worker's, or all it missed) is learned and not passed back."""

    async def learned(brokers: Iterable[BrokerAddress]) -> None:
        try:
            await link.ask("worker.brokers", list(brokers))
        except (LinkClosed, RemoteError):
            pass  # the supervisor is gone: this worker ends

    link.handlers["worker.brokers"] = lambda brokers: directory.learn(brokers, told=True)
    directory.on_learned(learned)
