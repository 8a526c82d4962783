"""Cluster mode with workers: a broker one worker learns from a response is known to every
worker before the response goes on (proxy/workers/shared_brokers.py), over real links
(Link.pair) between a supervisor's SharedBrokers and each worker's BrokerDirectory."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from policies.connections import BOOTSTRAP, bootstrap_broker
from proxy.evidence.metrics import Metrics
from proxy.links.brokers import BrokerDirectory
from proxy.protocol.rewrite import BrokerAddress
from proxy.workers.link import Link
from proxy.workers.port_claims import PortClaims
from proxy.workers.shared_brokers import SharedBrokers, share_brokers
from tests.conftest import free_listen_port

BROKER = BrokerAddress(111, "127.0.0.1", 9092)  # the one bootstrap server, and the broker it is
SERVERS = [("127.0.0.1", 9092)]


class Workers:
    def __init__(self, n: int, shared: SharedBrokers | None = None) -> None:
        self.shared = shared or SharedBrokers(PortClaims())  # no node ports: nothing claimed
        self.directories = [BrokerDirectory(Metrics()) for _ in range(n)]
        self.asked: list[tuple[int, list[BrokerAddress]]] = []  # what each worker passed on
        self._links: dict[int, Link] = {}
        self._ends: list[Link] = []
        for index, directory in enumerate(self.directories):
            supervisor_end, worker_end = Link.pair()
            share_brokers(directory, worker_end)
            supervisor_end.handlers["worker.brokers"] = lambda brokers, index=index: self._learned(index, brokers)
            self._links[index] = supervisor_end
            self._ends += [supervisor_end, worker_end]

    def _learned(self, index: int, brokers: list[BrokerAddress]) -> object:
        self.asked.append((index, brokers))
        return self.shared.learned({i: link for i, link in self._links.items() if i != index}, brokers)

    def counted_against(self, index: int) -> object:
        """The pool worker ``index`` counts a bootstrap-port connection accepted now in."""
        return bootstrap_broker(SERVERS, self.directories[index].node_at, lambda host, port: False)


@asynccontextmanager
async def running(n: int, shared: SharedBrokers | None = None) -> AsyncIterator[Workers]:
    workers = Workers(n, shared)
    async with trio.open_nursery() as nursery:
        for end in workers._ends:
            nursery.start_soon(end.run)
        yield workers
        nursery.cancel_scope.cancel()


def test_a_broker_one_worker_learns_is_every_workers_before_its_response_goes_on() -> None:
    """The client that hears of the broker opens its next connection at once, to any worker: that
    worker counts it against the broker, as one process does (not in the BOOTSTRAP pool, where the
    broker's max.connections would not count it: max.connections 2 let a third connection in)."""

    async def main() -> None:
        async with running(2) as workers:
            assert workers.counted_against(1) == BOOTSTRAP
            await workers.directories[0].learn([BROKER])  # worker 0 forwards a Metadata response
            assert [workers.counted_against(i) for i in (0, 1)] == [111, 111]
            assert workers.directories[1].node_ids == [111]

    trio.run(main)


def test_two_workers_learning_one_broker_at_once_each_go_on_once_every_worker_knows_it() -> None:
    async def main() -> None:
        async with running(3) as workers:
            seen: list[list[object]] = []

            async def respond(index: int) -> None:
                await workers.directories[index].learn([BROKER])
                seen.append([workers.counted_against(i) for i in range(3)])

            async with trio.open_nursery() as nursery:
                nursery.start_soon(respond, 0)
                nursery.start_soon(respond, 1)
            assert seen == [[111, 111, 111]] * 2
            # Each passed it on once; what the supervisor told is learned, not passed back.
            assert sorted(index for index, _ in workers.asked) == [0, 1]
            await workers.directories[2].learn([BROKER])  # its own response: known, not yet passed on by it
            await workers.directories[0].learn([BROKER])  # passed on already: no ask
            assert sorted(index for index, _ in workers.asked) == [0, 1, 2]
            moved = BrokerAddress(111, "127.0.0.1", 9093)
            await workers.directories[1].learn([moved])
            assert [d.address_of(111) for d in workers.directories] == [("127.0.0.1", 9093)] * 3

    trio.run(main)


def test_a_node_port_another_process_serves_is_opened_by_no_worker_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    """Each worker binds a node port with SO_REUSEPORT, which would join another process listening
    with it too and split its clients: the supervisor claims it first (proxy/workers/port_claims.py),
    before any worker opens it. In use: logged once, as one process logs it, and every worker (the one that learned
    the broker too) is told not to open it; a port of another listener that is free opens."""
    taken = socket.socket()
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # as another proxy's worker binds it
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    free_port = free_listen_port()

    def node_ports(node_id: int) -> list[tuple[str, str, int]]:
        return [("external", "127.0.0.1", port), ("internal", "127.0.0.1", free_port)]

    async def main() -> None:
        async with running(2, SharedBrokers(ports, node_ports)) as workers:
            await workers.directories[0].learn([BROKER])
            for directory in workers.directories:
                assert directory.served_elsewhere("external", 111)
                assert not directory.served_elsewhere("internal", 111)
            await workers.directories[1].learn([BROKER])  # known: not checked again
        assert workers.shared.served_elsewhere == [("external", 111)]

    try:
        with caplog.at_level(logging.ERROR, logger="kafka_admission_proxy.listener"), PortClaims() as ports:
            trio.run(main)
            with socket.socket() as other, pytest.raises(OSError):  # the free port is this proxy's now
                other.bind(("127.0.0.1", free_port))
    finally:
        taken.close()
    assert [r.getMessage() for r in caplog.records] == [
        f"cannot open the port for broker node 111: listener external: cannot listen on 127.0.0.1:{port}: "
        "Address already in use"
    ]
