"""A configured listener: its bootstrap port and, in cluster mode, one port per
broker node (``node_port_base + node_id``), each forwarding to its broker. A
``tls: passthrough`` listener relays bytes instead (proxy/serve/passthrough.py): its
node ports are those of ``passthrough_brokers``, opened at start, since the proxy
reads no metadata on it.

The listener's nursery owns its connections: stopping accepting cancels the
accept loops, and the listener's ``run`` returns once its last connection is gone.
"""

from __future__ import annotations

import errno
import itertools
import logging
import socket
from collections.abc import Awaitable, Callable

import trio

from policies.connections import BOOTSTRAP, BrokerKey, bootstrap_broker, broker_address
from proxy.config.model import Listener
from proxy.errors import BindError
from proxy.links.brokers import BrokerDirectory
from proxy.links.identity import ClientCertificate
from proxy.links.tls import TlsTermination
from proxy.links.upstream import UpstreamLink, UpstreamUnavailable
from proxy.serve.connection import ClientConnection, Port
from proxy.serve.passthrough import PassthroughConnection, PassthroughRoute
from proxy.serve.runtime import Runtime

log = logging.getLogger("kafka_admission_proxy.listener")

# accept() errors that mean "out of file descriptors or memory for now": pause, don't die.
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}


class ListenerRuntime:
    def __init__(
        self,
        config: Listener,
        runtime: Runtime,
        *,
        directory: BrokerDirectory,
        bootstrap: list[tuple[str, int]],
        rewrites: bool,
        tls: TlsTermination | None,
        worker: int | None = None,
    ) -> None:
        self.config = config
        # With workers: every worker binds the same ports (SO_REUSEPORT: the kernel spreads the
        # connections), and its connection ids say which worker holds them.
        self._reuse_port = worker is not None
        self._id_prefix = "" if worker is None else f"w{worker}:"
        self.name = config.name
        self._runtime = runtime
        self._directory = directory
        self._bootstrap = bootstrap
        self._rewrites = rewrites
        self.tls = tls
        self._stats = runtime.metrics.traffic_of(config.name)
        self._tls_label = "passthrough" if config.passthrough else "true" if tls is not None else "false"
        self.connections: set[ClientConnection | PassthroughConnection] = set()
        self._ids = itertools.count(1)  # this listener's connection ids
        self._node_ports: set[int] = set()
        self._node_routes: dict[int, Port] = {}  # a node port's route, also taken by bootstrap-port connections to it
        self._acceptors: trio.Nursery | None = None
        self._connections: trio.Nursery | None = None
        self._one_closed: trio.Event | None = None  # made only while someone waits for the drain
        self.bound = False

    def _port(self, upstream_name: str, connect: Callable[[ClientCertificate], Awaitable[UpstreamLink]]) -> Port:
        return Port(self.name, self.tls, upstream_name, connect, self._stats)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Bind the bootstrap port (then node ports as brokers are learned) and serve
        until accepting stops and the last connection is gone."""
        host, port = self.config.bind_address
        bootstrap: Port | PassthroughRoute
        if self.config.passthrough:
            brokers = self.config.passthrough_addresses()
            bootstrap = self._passthrough_route(tuple(brokers.values()))
        else:
            names = ",".join(f"{h}:{p}" for h, p in self._bootstrap)
            bootstrap = self._port(
                names, lambda client: self._runtime.connector.connect_any(self._bootstrap, client=client)
            )
        async with trio.open_nursery() as connections:
            self._connections = connections
            async with trio.open_nursery() as acceptors:
                self._acceptors = acceptors
                await acceptors.start(self._serve_port, host, port, bootstrap)
                self.bound = True
                if self.config.passthrough:
                    if self._rewrites:  # cluster mode: a port per broker, as the brokers advertise
                        for node_id, address in brokers.items():
                            await self._open_port(node_id, self._passthrough_route((address,)))
                elif self._rewrites:
                    self._directory.on_new_node(self.open_node_port)
                    for node_id in self._directory.node_ids:
                        await self.open_node_port(node_id)
                task_status.started()
            self.bound = False

    def _passthrough_route(self, brokers: tuple[tuple[str, int], ...]) -> PassthroughRoute:
        return PassthroughRoute(self.name, ",".join(f"{h}:{p}" for h, p in brokers), brokers, self._stats)

    async def open_node_port(self, node_id: int) -> None:
        if self.config.passthrough:
            return  # its node ports are its passthrough_brokers, not the brokers metadata names
        await self._open_port(node_id, self._node_route(node_id))

    def _node_route(self, node_id: int) -> Port:
        route = self._node_routes.get(node_id)
        if route is None:
            route = self._port(f"node {node_id}", lambda client: self._connect_node(node_id, client))
            self._node_routes[node_id] = route
        return route

    def _bootstrap_broker(self) -> BrokerKey:
        """The broker a bootstrap-port connection accepted now counts against (see bootstrap_broker)."""
        return bootstrap_broker(self._bootstrap, self._directory.node_at, self._runtime.connector.backing_off)

    def _bootstrap_route(self, conn_id: str) -> Port:
        """A route for one bootstrap-port connection counted in the BOOTSTRAP pool: through the
        first bootstrap server that answers, telling the gate which one (so it counts against that
        broker once it is known, if it can: BrokerQuotas.on_reached)."""

        async def connect(client: ClientCertificate) -> UpstreamLink:
            runtime = self._runtime
            link = await runtime.connector.connect_any(self._bootstrap, client=client)
            host, _, port = link.address.rpartition(":")
            runtime.gate.reached(conn_id, broker_address(host, int(port)), self._directory.node_at(host, int(port)))
            return link

        return self._port(",".join(f"{h}:{p}" for h, p in self._bootstrap), connect)

    async def _open_port(self, node_id: int, route: Port | PassthroughRoute) -> None:
        if node_id in self._node_ports or self._acceptors is None:
            return
        if self._directory.served_elsewhere(self.name, node_id):
            return  # another process serves it (with workers, the supervisor checked and logged it)
        self._node_ports.add(node_id)
        host, _ = self.config.bind_address
        port = self.config.node_port_base + node_id
        try:
            await self._acceptors.start(self._serve_port, host, port, route, node_id)
        except OSError as exc:
            log.error(
                "cannot open the port for broker node %d: %s",
                node_id,
                exc,
                extra={"listener": self.name, "port": port},
            )

    async def _connect_node(self, node_id: int, client: ClientCertificate) -> UpstreamLink:
        connector = self._runtime.connector
        address = self._directory.address_of(node_id)
        if address is None:
            raise UpstreamUnavailable(f"broker node {node_id} is unknown")
        if self._directory.is_via_bootstrap(node_id):
            return await connector.connect_any(self._bootstrap, client=client)
        try:
            return await connector.connect(*address, client=client)
        except UpstreamUnavailable:
            if address in self._bootstrap or not self._directory.reach_via_bootstrap(node_id):
                raise  # a broker at a bootstrap server's own address is down, not misadvertised
            return await connector.connect_any(self._bootstrap, client=client)

    async def _serve_port(
        self,
        host: str,
        port: int,
        route: Port | PassthroughRoute,
        broker: BrokerKey = BOOTSTRAP,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        if not 0 < port <= 65535:
            out_of_range = OSError(errno.EINVAL, "port out of range (node_port_base + node id)")
            raise BindError(f"listener {self.name}", host, port, out_of_range)
        try:
            listeners = await (_open_shared_listeners if self._reuse_port else trio.open_tcp_listeners)(port, host=host)
        except OSError as exc:
            raise BindError(f"listener {self.name}", host, port, exc) from None
        log.info("listening", extra={"listener": self.name, "bind": f"{host}:{port}", "upstream": route.upstream_name})
        task_status.started()
        try:
            async with trio.open_nursery() as accepting:
                for listener in listeners:
                    accepting.start_soon(self._accept_loop, listener, route, broker)
        finally:
            for listener in listeners:
                await trio.aclose_forcefully(listener)

    async def _accept_loop(
        self, listener: trio.SocketListener, route: Port | PassthroughRoute, broker: BrokerKey
    ) -> None:
        """Accept, decide, serve. A decision to wait blocks this loop, so further
        connections wait in the kernel backlog (Kafka's acceptor does the same).
        Connections count against ``broker``'s limits (a node port's node id), as that
        broker counts its own. In cluster mode a bootstrap-port connection's broker is decided
        here, before admission: the one its first usable bootstrap server is, and it then
        connects to that broker alone, as a node-port connection (so it counts where it lands).
        Only when that is no known broker does it count in the BOOTSTRAP pool and connect to the
        first bootstrap server that answers (moving to that broker's count when it can, see
        BrokerQuotas). Passthrough ports relay to their first broker that accepts, with no backoff
        to predict from: their bootstrap port keeps the BOOTSTRAP pool."""
        assert self._connections is not None
        runtime = self._runtime
        predict = self._rewrites and broker == BOOTSTRAP and isinstance(route, Port)
        accepted = runtime.metrics.connections_accepted.labels(self.name, self._tls_label)
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:
                    log.error("accept failed: %s; pausing", exc, extra={"listener": self.name})
                    await trio.sleep(0.1)
                    continue
                raise
            connection: ClientConnection | PassthroughConnection
            counted = broker
            if isinstance(route, PassthroughRoute):
                connection = PassthroughConnection(
                    route, runtime, stream, f"{self._id_prefix}{self.name}-p{next(self._ids)}"
                )
            else:
                conn_id, port = f"{self._id_prefix}{self.name}-{next(self._ids)}", route
                if predict:
                    counted = self._bootstrap_broker()
                    port = self._node_route(counted) if isinstance(counted, int) else self._bootstrap_route(conn_id)
                connection = ClientConnection(port, runtime, stream, conn_id)
            accepted.inc()
            # Which process serves which client: how the tests of workers see the kernel's spread.
            log.debug("connection accepted", extra={"conn_id": connection.conn_id, "peer": connection.peer})
            if not await runtime.gate.admit(connection, counted):
                await trio.aclose_forcefully(stream)
                continue
            self._connections.start_soon(self._handle, connection)

    async def _handle(self, connection: ClientConnection | PassthroughConnection) -> None:
        metrics = self._runtime.metrics
        self.connections.add(connection)
        metrics.connections_active.labels(self.name, self._tls_label).inc()
        try:
            await connection.run()
        finally:
            self._runtime.gate.on_closed(connection)
            self.connections.discard(connection)
            if self._one_closed is not None:
                self._one_closed.set()
            metrics.connections_active.labels(self.name, self._tls_label).dec()
            metrics.connections_closed.labels(self.name, self._tls_label).inc()

    def stop_accepting(self) -> None:
        """No new connections (and no node ports) from now on."""
        if self._acceptors is not None:
            self._acceptors.cancel_scope.cancel()
            self._acceptors = None

    async def wait_closed(self) -> None:
        """Return once this listener has no open connection."""
        while self.connections:
            self._one_closed = trio.Event()
            await self._one_closed.wait()
        self._one_closed = None

    def stop_reading(self) -> None:
        for connection in list(self.connections):
            connection.stop_reading()


async def _open_shared_listeners(port: int, *, host: str) -> list[trio.SocketListener]:
    """``trio.open_tcp_listeners`` with SO_REUSEPORT set before the bind, so each worker
    process binds the same port and the kernel spreads new connections over them."""
    listeners = []
    try:
        for family, kind, proto, _, address in await trio.socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        ):
            sock = trio.socket.socket(family, kind, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                await sock.bind(address)
                sock.listen(socket.SOMAXCONN)
            except BaseException:
                sock.close()
                raise
            listeners.append(trio.SocketListener(sock))
    except BaseException:
        for listener in listeners:
            listener.socket.close()
        raise
    return listeners
