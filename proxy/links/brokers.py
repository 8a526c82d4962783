"""Which broker each node id is, as learned from the responses that name brokers
(Metadata, FindCoordinator, DescribeCluster, NodeEndpoints). Learning a node
opens its port on every listener before any client hears of it; with workers, every
worker knows it before any client hears of it (``on_learned``)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable

from policies.connections import broker_address
from proxy.evidence.metrics import Metrics
from proxy.protocol.rewrite import BrokerAddress

log = logging.getLogger("kafka_admission_proxy.brokers")

OpenNodePort = Callable[[int], Awaitable[None]]
Placed = Callable[[int, str], None]
# Awaited with the brokers a response named that were not passed on yet; returns the node ports
# (listener name, node id) another process serves, which no listener opens (workers: a port in use).
Learned = Callable[[list[BrokerAddress]], Awaitable[list[tuple[str, int]]]]


class BrokerDirectory:
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._nodes: dict[int, tuple[str, int]] = {}
        self._at: dict[str, set[int]] = {}  # broker_address advertised -> the nodes advertising it
        self._via_bootstrap: set[int] = set()  # sole brokers whose advertised address is unreachable
        self._openers: list[OpenNodePort] = []
        self._placed: list[Placed] = []
        self._learned: list[Learned] = []
        self._shared: dict[int, BrokerAddress] = {}  # passed to every ``on_learned`` and awaited
        self._served_elsewhere: set[tuple[str, int]] = set()  # (listener, node id): ports not to open

    def on_new_node(self, open_node_port: OpenNodePort) -> None:
        self._openers.append(open_node_port)

    def on_placed(self, placed: Placed) -> None:
        """Call ``placed(node_id, broker_address)`` whenever a node is learned at an address only it
        advertises, before anything else runs (no await in between): BrokerQuotas.on_broker_known."""
        self._placed.append(placed)

    def on_learned(self, learned: Learned) -> None:
        """Await ``learned(brokers)`` with the nodes of a response not passed to it yet (new or moved,
        or known only from ``learn(told=True)``) before the response goes on. With workers the
        supervisor passes them on and answers once every worker knows them: a client that hears of
        a broker then opens no bootstrap-port connection that a worker counts as to no known broker
        (BrokerQuotas' BOOTSTRAP pool, which that broker's caps do not count)."""
        self._learned.append(learned)

    def served_elsewhere(self, listener: str, node_id: int) -> bool:
        """Another process serves this listener's port for ``node_id``: the supervisor found it in
        use before any worker bound it (each binds with SO_REUSEPORT, which would join it)."""
        return (listener, node_id) in self._served_elsewhere

    def address_of(self, node_id: int) -> tuple[str, int] | None:
        return self._nodes.get(node_id)

    def reach_via_bootstrap(self, node_id: int) -> bool:
        """A single-broker cluster whose advertised address the proxy cannot reach (a broker
        advertising ``localhost`` from a container, say) is the bootstrap server itself:
        use it. With several brokers there is no telling which bootstrap server is which."""
        if list(self._nodes) != [node_id]:
            return False
        if node_id not in self._via_bootstrap:
            self._via_bootstrap.add(node_id)
            host, port = self._nodes[node_id]
            log.warning(
                "broker node %d advertises %s:%d, which does not answer; reaching it through the bootstrap "
                "servers (it is the only broker)",
                node_id,
                host,
                port,
            )
        return True

    def is_via_bootstrap(self, node_id: int) -> bool:
        return node_id in self._via_bootstrap

    def node_at(self, host: str, port: int) -> int | None:
        """The node that advertises ``host:port`` (None: none does, or several do)."""
        return self._only_node_at(broker_address(host, port))

    def _only_node_at(self, key: str) -> int | None:
        nodes = self._at.get(key)
        return next(iter(nodes)) if nodes is not None and len(nodes) == 1 else None

    @property
    def node_ids(self) -> list[int]:
        return sorted(self._nodes)

    async def learn(
        self, brokers: Iterable[BrokerAddress], *, told: bool = False, elsewhere: Iterable[tuple[str, int]] = ()
    ) -> None:
        """Learn the brokers a response names, or (``told``) that another worker learned: those are
        being passed to every worker already, so not to ``on_learned``. Those passed on are passed
        before their ports open: with workers, the supervisor checks no other process serves them
        (``elsewhere``: the ports it found served, as it tells them)."""
        brokers = list(brokers)
        self._served_elsewhere.update(elsewhere)
        if not told and self._learned:
            shared = self._shared
            unshared = list({b.node_id: b for b in brokers if shared.get(b.node_id) != b}.values())
            if unshared:
                for learned in self._learned:
                    self._served_elsewhere.update(await learned(unshared))
                for broker in unshared:
                    shared[broker.node_id] = broker
        for broker in brokers:
            address = (broker.host, broker.port)
            known = self._nodes.get(broker.node_id)
            if known == address:
                continue
            self._nodes[broker.node_id] = address
            # Who advertises which address, kept up per broker (a cluster's first Metadata names
            # every broker, each new: rebuilding the index for each was O(brokers^2)).
            if known is not None:  # moved: no longer at its old address
                old = broker_address(*known)
                self._at[old].discard(broker.node_id)
                if not self._at[old]:
                    del self._at[old]
            key = broker_address(*address)
            self._at.setdefault(key, set()).add(broker.node_id)
            if self._only_node_at(key) == broker.node_id:
                for placed in self._placed:
                    placed(broker.node_id, key)
            self._via_bootstrap.discard(broker.node_id)
            self._metrics.brokers_known.set(len(self._nodes))
            where = {"node_id": broker.node_id, "upstream": f"{broker.host}:{broker.port}"}
            if known is None:
                log.info("learned broker", extra=where)
                for open_node_port in self._openers:
                    await open_node_port(broker.node_id)
            else:
                log.info("broker moved", extra=where)
