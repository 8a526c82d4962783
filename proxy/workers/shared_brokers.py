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

Before any worker opens a new broker's node ports, the supervisor claims each (proxy/workers/port_claims.py):
every worker binds with SO_REUSEPORT, which would join another process of the same user listening on
the port with it too (another proxy whose node_port_base overlaps) and split the clients without an
error. A port in use is logged as one process logs it, and no worker opens it (``served_elsewhere``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any

import trio

from proxy.links.brokers import BrokerDirectory
from proxy.protocol.rewrite import BrokerAddress
from proxy.workers.link import Link, LinkClosed, RemoteError
from proxy.workers.port_claims import PortClaims

log = logging.getLogger("kafka_admission_proxy.listener")

# A node id's ports: (listener name, host, port) of each listener that opens one per broker.
NodePorts = Callable[[int], list[tuple[str, str, int]]]

# How long a response naming a new broker waits for the other workers to learn it (each does at once).
SPREAD_TIMEOUT_S = 1.0


class SharedBrokers:
    """The supervisor's side: what the workers learned (a restarted worker is told it all), and
    the spreading of what one learned to the others."""

    def __init__(self, ports: PortClaims, node_ports: NodePorts = lambda node_id: []) -> None:
        self._ports = ports
        self.known: dict[int, BrokerAddress] = {}
        self.served_elsewhere: list[tuple[str, int]] = []  # (listener, node id): no worker opens it
        self._node_ports = node_ports
        self._spreading: dict[int, trio.Event] = {}  # node -> set once every worker was told (and learned) it

    def learned(
        self, others: Mapping[int, Link], brokers: list[BrokerAddress]
    ) -> Coroutine[Any, Any, list[tuple[str, int]]] | list[tuple[str, int]]:
        """A worker learned ``brokers`` from a response; answered, with the node ports of theirs that
        another process serves, once every worker of ``others`` (the serving ones but the asker)
        learned them, those another worker's ask is spreading too."""
        pending = [event for b in brokers if (event := self._spreading.get(b.node_id)) is not None]
        new = [b for b in brokers if self.known.get(b.node_id) != b]
        if not new and not pending:
            return self._elsewhere(brokers)
        done = trio.Event()
        for broker in new:  # before any other ask is handled: it waits for this spread
            if broker.node_id not in self.known:
                self._claim_ports(broker.node_id, self._node_ports(broker.node_id))
            self.known[broker.node_id] = broker
            self._spreading[broker.node_id] = done
        return self._spread(others, brokers, new, done, pending)

    def _claim_ports(self, node_id: int, ports: list[tuple[str, str, int]]) -> None:
        """Before any worker binds them (each worker opens a node port once it learned its broker)."""
        for listener, host, port in ports:
            try:
                self._ports.claim(f"listener {listener}", host, port)
            except OSError as exc:
                where = {"listener": listener, "port": port}
                log.error("cannot open the port for broker node %d: %s", node_id, exc, extra=where)
                self.served_elsewhere.append((listener, node_id))

    def claim_static_ports(self, ports: dict[int, list[tuple[str, str, int]]]) -> None:
        """At start, before any worker: the node ports listeners open without learning a broker
        (passthrough_brokers in cluster mode), by node id."""
        for node_id, of_node in ports.items():
            self._claim_ports(node_id, of_node)

    def _elsewhere(self, brokers: list[BrokerAddress]) -> list[tuple[str, int]]:
        nodes = {b.node_id for b in brokers}
        return [served for served in self.served_elsewhere if served[1] in nodes]

    async def _spread(
        self,
        others: Mapping[int, Link],
        brokers: list[BrokerAddress],
        new: list[BrokerAddress],
        done: trio.Event,
        pending: list[trio.Event],
    ) -> list[tuple[str, int]]:
        if new:
            try:
                with trio.move_on_after(SPREAD_TIMEOUT_S):
                    async with trio.open_nursery() as nursery:
                        for link in list(others.values()):
                            nursery.start_soon(_tell_learned, link, new, self._elsewhere(new))
            finally:
                done.set()
                for broker in new:
                    if self._spreading.get(broker.node_id) is done:
                        del self._spreading[broker.node_id]
        with trio.move_on_after(SPREAD_TIMEOUT_S):
            for event in pending:
                await event.wait()
        return self._elsewhere(brokers)


async def _tell_learned(link: Link, brokers: list[BrokerAddress], elsewhere: list[tuple[str, int]]) -> None:
    try:
        await link.ask("worker.brokers", brokers, elsewhere)
    except (LinkClosed, RemoteError):
        pass  # a worker that died learns them all when it serves again


def share_brokers(directory: BrokerDirectory, link: Link) -> None:
    """A worker's side: what it learns from a response is passed on before the response goes on;
    what the supervisor tells it (another worker's, or all it missed) is learned and not passed back."""

    async def learned(brokers: Iterable[BrokerAddress]) -> list[tuple[str, int]]:
        try:
            elsewhere: list[tuple[str, int]] = await link.ask("worker.brokers", list(brokers))
        except (LinkClosed, RemoteError):
            return []  # the supervisor is gone: this worker ends
        return elsewhere

    link.handlers["worker.brokers"] = lambda brokers, elsewhere: directory.learn(
        brokers, told=True, elsewhere=elsewhere
    )
    directory.on_learned(learned)
