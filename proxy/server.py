"""The proxy as a whole: admin HTTP, every listener, every connection, and a
graceful shutdown (stop accepting, answer what is in flight, then close)."""

from __future__ import annotations

import logging

import trio

from policies.connections import ConnectionQuotas
from policies.mode import Mode

from .admin import AdminServer
from .audit import AuditSink
from .brokers import BrokerDirectory
from .config import Config
from .connection_gate import ConnectionGate
from .group_tracking import GroupTracking
from .listener import ListenerRuntime
from .memory import PoolGate, build_pool
from .metrics import Metrics
from .request_admission import RequestAdmission
from .tls import upstream_context
from .upstream import UpstreamConnector, UpstreamUnavailable

log = logging.getLogger("kafka_admission_proxy.server")

# Longer than the upstream TLS handshake timeout, so a silent peer is named, not just slow.
READY_PROBE_TIMEOUT_S = 8.0


class ProxyServer:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.metrics = Metrics()
        self.audit = AuditSink(config.audit, self.metrics)
        self.directory = BrokerDirectory(self.metrics)
        self.connector = UpstreamConnector(
            config.upstream.tls, upstream_context(config.upstream.tls), self.metrics, self.audit
        )
        bootstrap = config.upstream.addresses()
        self.groups = GroupTracking(config.policies, self.metrics, self.audit)
        admission = RequestAdmission(config.policies, self.metrics, self.audit, self.groups)
        policies = config.policies
        self.pool = PoolGate(
            build_pool(
                policies.queued_max_request_bytes,
                policies.socket_request_max_bytes,
                policies.queued_max_request_bytes_per_connection,
                policies.mode_of(policies.memory_pool_mode),
            ),
            self.metrics,
            self.audit,
        )
        self.gate = ConnectionGate(
            ConnectionQuotas(
                policies.connection_limits(),
                mode=Mode(policies.mode_of(policies.connections_mode)),
                protected_listeners=[lst.name for lst in config.listeners if lst.protected],
            ),
            self.metrics,
            self.audit,
            policies.max_connections_wait_ms,
        )
        self.listeners = [
            ListenerRuntime(
                listener,
                policies=config.policies,
                metrics=self.metrics,
                audit=self.audit,
                connector=self.connector,
                directory=self.directory,
                admission=admission,
                pool=self.pool,
                gate=self.gate,
                bootstrap=bootstrap,
                rewrites=config.mode == "cluster",
            )
            for listener in config.listeners
        ]
        self.admin_port: int | None = None
        self._cancel = trio.CancelScope()

    async def readiness_problems(self) -> list[str]:
        problems = [f"listener {lst.config.name} is not bound" for lst in self.listeners if not lst.bound]
        try:
            with trio.fail_after(READY_PROBE_TIMEOUT_S):
                await self.connector.probe(self.config.upstream.addresses())
        except UpstreamUnavailable as exc:
            problems.append(f"no upstream broker reachable: {exc}")
        except trio.TooSlowError:
            problems.append(f"no upstream broker answered ApiVersions within {READY_PROBE_TIMEOUT_S:g}s")
        # Mismatches seen by client traffic (brokers other than the bootstrap one included).
        for mismatch in self.connector.backoff.known_mismatches():
            line = f"upstream {mismatch.upstream} {mismatch.description}"
            if not any(line in p for p in problems):
                problems.append(line)
        return problems

    async def run(self, *, task_status: trio.TaskStatus[ProxyServer] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled, or until ``shutdown`` has drained the connections."""
        with self._cancel:
            try:
                async with trio.open_nursery() as connections, trio.open_nursery() as accepting:
                    self._accepting = accepting
                    self._connections = connections
                    connections.start_soon(self.gate.reap_idle)
                    connections.start_soon(self.groups.expire_forever)
                    for listener in self.listeners:
                        await listener.start(accepting, connections)
                    # Admin last: once it answers, every listener is bound.
                    admin = AdminServer(self.metrics, self.readiness_problems)
                    host, port = self.config.admin.bind_address
                    self.admin_port = await accepting.start(admin.serve, host, port)
                    task_status.started(self)
            finally:
                self.audit.close()

    def reload(self, new: Config) -> None:
        """Apply a changed config file (SIGHUP): policy settings take effect at once
        (connection limits: raising at once, lowering closes the excess, LRU-first);
        listeners, upstream, admin and the memory pool's size need a restart."""
        old = self.config
        for section in ("mode", "upstream", "listeners", "admin", "audit"):
            if getattr(old, section) != getattr(new, section):
                log.warning("config reload: %s changed; restart to apply it", section)
        pool_keys = ("queued_max_request_bytes", "queued_max_request_bytes_per_connection", "memory_pool_mode")
        if any(getattr(old.policies, k) != getattr(new.policies, k) for k in pool_keys):
            log.warning("config reload: the memory pool settings changed; restart to apply them")
        policies = new.policies
        admission = RequestAdmission(policies, self.metrics, self.audit, self.groups)
        for listener in self.listeners:
            listener.policies = policies
            listener.admission = admission
        self.gate.quotas.mode = Mode(policies.mode_of(policies.connections_mode))
        self.gate.wait_seconds = policies.max_connections_wait_ms / 1000
        self.gate.update_limits(policies.connection_limits())
        self.config = old.model_copy(update={"policies": policies})
        log.info("config reloaded: policies applied")

    async def shutdown(self, drain_timeout: float) -> None:
        """Stop accepting, let requests in flight finish (bounded), then stop."""
        log.info("shutting down: no new connections, draining in-flight requests")
        for listener in self.listeners:
            listener.stop_accepting()
            listener.stop_reading()
        with trio.move_on_after(drain_timeout) as waited:
            for listener in self.listeners:
                await listener.wait_closed()
        if waited.cancelled_caught:
            left = sum(len(lst.connections) for lst in self.listeners)
            log.warning("drain time over; closing %d connections", left)
        self._cancel.cancel()
