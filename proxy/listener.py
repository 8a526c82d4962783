"""A configured listener: its bootstrap port and, in cluster mode, one port per
broker node (``node_port_base + node_id``), each forwarding to its broker."""

from __future__ import annotations

import errno
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from . import wire
from .audit import AuditSink
from .brokers import BrokerDirectory
from .config import Listener, Policies
from .connection import ClientConnection
from .connection_gate import ConnectionGate
from .errors import BindError
from .memory import PoolGate
from .metrics import Metrics
from .request_admission import RequestAdmission
from .rewrite import ADDRESS_APIS
from .tls import server_context
from .upstream import UpstreamConnector, UpstreamLink, UpstreamUnavailable

log = logging.getLogger("kafka_admission_proxy.listener")

# accept() errors that mean "out of file descriptors or memory for now": pause, don't die.
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}


@dataclass(frozen=True, slots=True)
class Route:
    """Where connections accepted on one port go."""

    upstream_name: str
    connect: Callable[[], Awaitable[UpstreamLink]]


class ListenerRuntime:
    def __init__(
        self,
        config: Listener,
        *,
        policies: Policies,
        metrics: Metrics,
        audit: AuditSink,
        connector: UpstreamConnector,
        directory: BrokerDirectory,
        admission: RequestAdmission,
        pool: PoolGate,
        gate: ConnectionGate,
        bootstrap: list[tuple[str, int]],
        rewrites: bool,
    ) -> None:
        self.config = config
        self.policies = policies
        self.metrics = metrics
        self.audit = audit
        self.connector = connector
        self.directory = directory
        self.rewrites = rewrites
        self.admission = admission
        self.pool = pool
        self.gate = gate
        # Every API whose body the proxy decodes: clients are offered only versions the codec knows.
        self.decoded_api_keys = admission.decoded_api_keys | (ADDRESS_APIS if rewrites else frozenset())
        self.ssl_context = server_context(config.tls) if config.tls is not None else None
        self.connections: set[ClientConnection] = set()
        self._bootstrap = bootstrap
        self._accept_scopes: list[trio.CancelScope] = []
        self._node_ports: set[int] = set()
        self._accept_nursery: trio.Nursery | None = None
        self._connection_nursery: trio.Nursery | None = None
        self.bound = False
        self._all_closed: trio.Event | None = None
        self._tls_label = "true" if self.ssl_context is not None else "false"
        self._request_counters: dict[int, Callable[[], None]] = {}

    def request_counter(self, api_key: int) -> None:
        """Count one request of ``api_key`` (label children looked up once per API, not per request)."""
        inc = self._request_counters.get(api_key)
        if inc is None:
            inc = self._request_counters[api_key] = self.metrics.requests.labels(
                self.config.name, wire.api_name(api_key)
            ).inc
        inc()

    def address_of(self, node_id: int) -> tuple[str, int]:
        return self.config.advertised_host, self.config.node_port_base + node_id

    async def start(self, accept_nursery: trio.Nursery, connection_nursery: trio.Nursery) -> None:
        """Bind the bootstrap port; node ports follow as brokers are learned."""
        self._accept_nursery = accept_nursery
        self._connection_nursery = connection_nursery
        host, port = self.config.bind_address
        names = ",".join(f"{h}:{p}" for h, p in self._bootstrap)
        route = Route(names, lambda: self.connector.connect_any(self._bootstrap))
        await accept_nursery.start(self._serve_port, host, port, route)
        self.bound = True
        if self.rewrites:
            self.directory.on_new_node(self.open_node_port)
            for node_id in self.directory.node_ids:
                await self.open_node_port(node_id)

    async def open_node_port(self, node_id: int) -> None:
        if node_id in self._node_ports or self._accept_nursery is None:
            return
        self._node_ports.add(node_id)
        host, _ = self.config.bind_address
        port = self.config.node_port_base + node_id
        route = Route(f"node {node_id}", lambda: self._connect_node(node_id))
        try:
            await self._accept_nursery.start(self._serve_port, host, port, route)
        except OSError as exc:
            log.error(
                "cannot open the port for broker node %d: %s",
                node_id,
                exc,
                extra={"listener": self.config.name, "port": port},
            )

    async def _connect_node(self, node_id: int) -> UpstreamLink:
        address = self.directory.address_of(node_id)
        if address is None:
            raise UpstreamUnavailable(f"broker node {node_id} is unknown")
        if self.directory.is_via_bootstrap(node_id):
            return await self.connector.connect_any(self._bootstrap)
        try:
            return await self.connector.connect(*address)
        except UpstreamUnavailable:
            if not self.directory.reach_via_bootstrap(node_id):
                raise
            return await self.connector.connect_any(self._bootstrap)

    async def _serve_port(
        self, host: str, port: int, route: Route, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        if not 0 < port <= 65535:
            raise OSError(f"port {port} is out of range (node_port_base + node id)")
        try:
            listeners = await trio.open_tcp_listeners(port, host=host)
        except OSError as exc:
            raise BindError(f"listener {self.config.name}", host, port, exc) from exc
        with trio.CancelScope() as scope:
            self._accept_scopes.append(scope)
            log.info(
                "listening",
                extra={"listener": self.config.name, "bind": f"{host}:{port}", "upstream": route.upstream_name},
            )
            task_status.started()
            assert self._connection_nursery is not None
            async with trio.open_nursery() as acceptors:
                for listener in listeners:
                    acceptors.start_soon(self._accept_loop, listener, route)
        for listener in listeners:
            await listener.aclose()

    async def _accept_loop(self, listener: trio.SocketListener, route: Route) -> None:
        """Accept, decide, serve. A decision to wait blocks this loop, so further
        connections wait in the kernel backlog (Kafka's acceptor does the same)."""
        assert self._connection_nursery is not None
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:
                    log.error("accept failed: %s; pausing", exc, extra={"listener": self.config.name})
                    await trio.sleep(0.1)
                    continue
                raise
            connection = ClientConnection(self, route, stream)
            self.metrics.connections_accepted.labels(self.config.name, self._tls_label).inc()
            if not await self.gate.admit(connection):
                await trio.aclose_forcefully(stream)
                continue
            self._connection_nursery.start_soon(self._handle, connection)

    async def _handle(self, connection: ClientConnection) -> None:
        name = self.config.name
        self.connections.add(connection)
        self.metrics.connections_active.labels(name, self._tls_label).inc()
        try:
            await connection.run()
        finally:
            self.gate.on_closed(connection)
            self.connections.discard(connection)
            if not self.connections and self._all_closed is not None:
                self._all_closed.set()
            self.metrics.connections_active.labels(name, self._tls_label).dec()
            self.metrics.connections_closed.labels(name, self._tls_label).inc()

    def stop_accepting(self) -> None:
        self._accept_nursery = None  # and no node ports open from now on
        for scope in self._accept_scopes:
            scope.cancel()
        self.bound = False

    async def wait_closed(self) -> None:
        """Return once this listener has no open connection."""
        if self.connections:
            self._all_closed = trio.Event()
            await self._all_closed.wait()

    def stop_reading(self) -> None:
        for connection in list(self.connections):
            connection.stop_reading()
