"""The proxy as a whole: admin HTTP, every listener and its connections, config
reload (a new generation swapped in by one reference), and a graceful shutdown
(stop accepting, answer what is in flight, then close)."""

from __future__ import annotations

import logging
import math
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from policies.connections import BrokerQuotas
from policies.group_size import GroupSizePolicy
from policies.memory_pool import MemoryPool
from policies.mode import Mode
from policies.pool_leases import LeasedMemoryPool, lease_size
from proxy.config.certificates import certificate_files, export_certificate_expiry
from proxy.config.model import Config, ConfigError, load_config
from proxy.evidence.audit import AuditSink
from proxy.evidence.decisions import DecisionRecorder
from proxy.evidence.metrics import Metrics
from proxy.evidence.observation_window import SECTIONS, ObservationWindow, window_edge
from proxy.hooks.generation import Generation
from proxy.hooks.group_hook import GroupSizeCollector
from proxy.links.brokers import BrokerDirectory
from proxy.links.tls import TlsTermination, server_context, upstream_context
from proxy.links.upstream import UpstreamConnector, UpstreamUnavailable
from proxy.serve.admin import AdminServer
from proxy.serve.connection_gate import ConnectionGate
from proxy.serve.file_watch import FileWatcher
from proxy.serve.listener import ListenerRuntime
from proxy.serve.pool_gate import LeasedPoolGate, PoolGate
from proxy.serve.runtime import Runtime
from proxy.workers.proxy_windows import PROXY_SECTIONS, roll_on_grid, tell_rows
from proxy.workers.shared_backoff import share_backoff
from proxy.workers.shared_brokers import share_brokers
from proxy.workers.worker_connections import SharedConnectionGate
from proxy.workers.worker_groups import SharedGroups

if TYPE_CHECKING:
    from proxy.workers.link import WorkerLink

log = logging.getLogger("kafka_admission_proxy.server")

# Longer than the upstream TLS handshake timeout, so a silent peer is named, not just slow.
READY_PROBE_TIMEOUT_S = 8.0
# /readyz asks the broker at most this often: a flood of probes is not a flood of broker connections.
READY_PROBE_CACHE_S = 1.0
_GROUP_EXPIRY_INTERVAL_S = 1.0
_READY_RETRY_MAX_S = 30.0
_ROWS_PER_SLICE = 1000

# What a reload cannot change on a running proxy: sockets are bound, the pool is sized.
_RESTART_SECTIONS = ("mode", "workers", "admin", "audit")
_RESTART_LISTENER_FIELDS = ("name", "bind", "advertised_host", "node_port_base", "protected", "passthrough_brokers")
_RESTART_POLICY_FIELDS = ("queued_max_request_bytes", "queued_max_request_bytes_per_connection")


def _changed(old: object, new: object, prefix: str) -> list[str]:
    """The keys (``section.field``) that differ between two config sections."""
    if old == new:
        return []
    fields = getattr(type(old), "model_fields", None)
    if not fields:
        return [prefix]
    return [f"{prefix}.{name}" for name in fields if getattr(old, name) != getattr(new, name)]


class SharedProbe:
    """One upstream probe at a time, its answer kept for ``ttl`` seconds: callers that come
    while a probe runs wait for its answer instead of opening a broker connection each."""

    def __init__(self, probe: Callable[[], Awaitable[str | None]], ttl: float) -> None:
        self._probe = probe
        self._ttl = ttl
        self._answer: str | None = None
        self._answered_at = -math.inf
        self._running: trio.Event | None = None

    async def __call__(self) -> str | None:
        while True:
            if trio.current_time() - self._answered_at < self._ttl:
                return self._answer
            if self._running is not None:
                await self._running.wait()
                continue  # answered, or its caller was cancelled: then one of us probes again
            running = self._running = trio.Event()
            try:
                self._answer = await self._probe()
                self._answered_at = trio.current_time()
                return self._answer
            finally:
                self._running = None
                running.set()


async def announce_readiness(readiness_problems: Callable[[], Awaitable[list[str]]]) -> None:
    """Say "ready" only when /readyz would: until then, one warning, then retries
    that back off (no line per attempt)."""
    problems = await readiness_problems()
    if problems:
        log.warning("not ready yet: %s", "; ".join(problems))
        delay = 1.0
        while problems:
            await trio.sleep(delay)
            delay = min(delay * 2, _READY_RETRY_MAX_S)
            problems = await readiness_problems()
    log.info("proxy ready")


@dataclass(frozen=True, slots=True)
class ReloadOutcome:
    """``applied``: every change took effect; ``partial``: all but ``refused``, which
    need a restart (each named in the log); ``unchanged``: nothing differed."""

    outcome: str  # applied, partial, unchanged, invalid, error
    refused: tuple[str, ...] = ()


def reload_plan(old: Config, new: Config) -> tuple[Config, tuple[str, ...]]:
    """What a reload from ``old`` to ``new`` runs: ``new``, except the keys that need a
    restart (returned, each named in a warning), which keep their running value."""
    refused: list[str] = []
    kept: dict[str, object] = {}
    for section in _RESTART_SECTIONS:
        changed = _changed(getattr(old, section), getattr(new, section), section)
        refused += changed
        kept[section] = getattr(old, section) if changed else getattr(new, section)
    upstream = [f for f in ("bootstrap_servers",) if getattr(old.upstream, f) != getattr(new.upstream, f)]
    if old.upstream.tls.enabled != new.upstream.tls.enabled:
        upstream.append("tls.enabled")
    refused += [f"upstream.{f}" for f in upstream]
    kept["upstream"] = old.upstream if upstream else new.upstream
    if [lst.name for lst in old.listeners] != [lst.name for lst in new.listeners]:
        refused.append("listeners (names or order)")
        kept["listeners"] = old.listeners
    else:
        listeners = []
        for before, after in zip(old.listeners, new.listeners, strict=True):
            fields = [f for f in _RESTART_LISTENER_FIELDS if getattr(before, f) != getattr(after, f)]
            if (before.tls is None, before.passthrough) != (after.tls is None, after.passthrough):
                fields.append("tls")  # TLS on or off changes the protocol of a bound port
            refused += [f"listeners[{before.name}].{f}" for f in fields]
            listeners.append(after.model_copy(update={f: getattr(before, f) for f in fields}))
        kept["listeners"] = tuple(listeners)
    pool_fields = [f for f in _RESTART_POLICY_FIELDS if getattr(old.policies, f) != getattr(new.policies, f)]
    refused += [f"policies.{type(new.policies).model_fields[f].alias}" for f in pool_fields]
    kept["policies"] = new.policies.model_copy(update={f: getattr(old.policies, f) for f in pool_fields})
    for key in refused:
        log.warning("config reload: %s changed; restart to apply it (the rest applies)", key)
    return old.model_copy(update=kept), tuple(refused)


def tls_contexts(config: Config) -> tuple[list[ssl.SSLContext | None], ssl.SSLContext | None]:
    """The TLS contexts a config serves with, each listener's and the upstream one: building
    them is the check that its files can serve (a reload that cannot changes nothing)."""
    listeners = [server_context(tls) if (tls := lst.termination) is not None else None for lst in config.listeners]
    return listeners, upstream_context(config.upstream.tls)


# A worker's observation windows: the connections section is the supervisor's (docs/workers.md).
WORKER_SECTIONS = SECTIONS - PROXY_SECTIONS


class ProxyServer:
    def __init__(self, config: Config, config_path: str | None = None, shared: WorkerLink | None = None) -> None:
        """``shared``: this process is one of ``workers: N`` (proxy/workers/): the supervisor
        serves the admin port, watches the files and owns the shared limits."""
        self.config = config
        self.config_path = config_path
        self.shared = shared
        self._watcher: FileWatcher | None = None
        policies = config.policies
        self.metrics = metrics = Metrics("single" if shared is None else "worker")
        audit = config.audit
        proxy: str | None = None
        if shared is not None:  # each worker is an audit instance of its own: its files, their seq, its events
            proxy = audit.instance  # ... and each event names the whole proxy too
            audit = audit.model_copy(update={"instance_id": f"{proxy}-w{shared.index}"})
        self.audit = AuditSink(audit, metrics, config.upstream, proxy)
        self.recorder = recorder = DecisionRecorder(metrics, self.audit)
        self.directory = BrokerDirectory(metrics)
        connector = UpstreamConnector(config.upstream.tls, upstream_context(config.upstream.tls), metrics, recorder)
        # The group size policy: this process's own, or with workers the owner's (asked per join).
        self.group_policy: GroupSizePolicy | None = None
        self.groups: GroupSizePolicy | SharedGroups
        if shared is None:
            self.groups = self.group_policy = GroupSizePolicy(
                policies.group_size_config(), Mode(policies.mode_of(policies.group_size_mode))
            )
            metrics.registry.register(GroupSizeCollector(self.group_policy))
        else:
            self.groups = SharedGroups(shared.link)  # the owner exports the group metrics
        # Observation windows are evidence for the report: kept when the audit writes files or a topic.
        # With workers, the connections section is the supervisor's (the whole proxy's counts), and
        # every process rolls on one grid of window edges.
        self.window = (
            (
                ObservationWindow(time.time(), pool_capacity_bytes=policies.queued_max_request_bytes)
                if shared is None
                else ObservationWindow(
                    window_edge(time.time(), config.audit.window.seconds),
                    pool_capacity_bytes=policies.queued_max_request_bytes,
                    sections=WORKER_SECTIONS,
                )
            )
            if self.audit.keeps_evidence
            else None
        )
        capacity, pool_mode = policies.queued_max_request_bytes, Mode(policies.mode_of(policies.memory_pool_mode))
        self._leases: LeasedPoolGate | None = None
        if shared is not None and capacity > 0:
            # One budget across the workers: this worker's part of it is a lease from the owner.
            leases = LeasedPoolGate(
                LeasedMemoryPool(
                    capacity,
                    policies.socket_request_max_bytes,
                    lease_size(capacity, shared.workers),
                    policies.queued_max_request_bytes_per_connection,
                    pool_mode,
                ),
                metrics,
                recorder,
                self.window,
                shared.link,
            )
            pool: PoolGate = leases
            self._leases = leases
        else:
            pool = PoolGate(
                MemoryPool(
                    capacity,
                    policies.socket_request_max_bytes,
                    policies.queued_max_request_bytes_per_connection,
                    pool_mode,
                ),
                metrics,
                recorder,
                self.window,
            )
        connections_mode = Mode(policies.mode_of(policies.connections_mode))
        protected = [lst.name for lst in config.listeners if lst.protected]
        gate: ConnectionGate
        if shared is None:
            gate = ConnectionGate(
                BrokerQuotas(policies.connection_limits(), mode=connections_mode, protected_listeners=protected),
                metrics,
                recorder,
                policies.max_connections_wait_ms,
                policies.max_ssl_handshakes_per_turn,
            )
        else:  # the owner (the supervisor) counts and decides; this worker keeps the activity
            gate = SharedConnectionGate(
                shared.link,
                policies.connection_limits(),
                connections_mode,
                protected,
                metrics,
                recorder,
                policies.max_connections_wait_ms,
                policies.max_ssl_handshakes_per_turn,
            )
        self.runtime = Runtime(
            generation=self._generation(1 if shared is None else shared.generation, config),
            gate=gate,
            pool=pool,
            connector=connector,
            recorder=recorder,
            metrics=metrics,
            audit=self.audit,
            window=self.window,
        )
        if config.mode == "cluster":  # a bootstrap-port connection counts against the broker it reached, once known
            self.directory.on_placed(gate.broker_known)
        if shared is not None:  # every worker knows each broker (opens its node port) before a client hears of it
            share_brokers(self.directory, shared.link)
            share_backoff(connector, shared.link)  # and backs off from a broker another worker found down
        bootstrap = config.upstream.addresses()
        self.listeners = [
            ListenerRuntime(
                listener,
                self.runtime,
                directory=self.directory,
                bootstrap=bootstrap,
                rewrites=config.mode == "cluster",
                tls=TlsTermination(listener.termination) if listener.termination is not None else None,
                worker=None if shared is None else shared.index,
            )
            for listener in config.listeners
        ]
        self.admin_port: int | None = None
        self._upstream_probe = SharedProbe(self._probe_upstream, READY_PROBE_CACHE_S)
        self._cancel = trio.CancelScope()

    def _generation(self, number: int, config: Config) -> Generation:
        return Generation(
            number, config, groups=self.groups, directory=self.directory, recorder=self.recorder, window=self.window
        )

    async def readiness_problems(self) -> list[str]:
        problems = [f"listener {lst.name} is not bound" for lst in self.listeners if not lst.bound]
        upstream = await self._upstream_probe()
        if upstream is not None:
            problems.append(upstream)
        connector = self.runtime.connector
        # Mismatches seen by client traffic (brokers other than the bootstrap one included).
        for mismatch in connector.backoff.known_mismatches():
            line = f"upstream {mismatch.upstream} {mismatch.description}"
            if not any(line in p for p in problems):
                problems.append(line)
        return problems

    async def _probe_upstream(self) -> str | None:
        """What keeps the upstream from being reachable (None: an ApiVersions answer came)."""
        try:
            with trio.fail_after(READY_PROBE_TIMEOUT_S):
                await self.runtime.connector.probe(self.config.upstream.addresses())
        except UpstreamUnavailable as exc:
            return f"no upstream broker reachable: {exc}"
        except trio.TooSlowError:
            return f"no upstream broker answered ApiVersions within {READY_PROBE_TIMEOUT_S:g}s"
        return None

    async def run(self, *, task_status: trio.TaskStatus[ProxyServer] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled, or until ``shutdown`` has drained the connections."""
        with self._cancel:
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(self.runtime.driver.run)  # before any connection parks in it
                    nursery.start_soon(self.runtime.gate.reap_idle)
                    if self.group_policy is not None:  # with workers, the owner expires sessions
                        nursery.start_soon(self._expire_groups, self.group_policy)
                    if self.window is not None:
                        nursery.start_soon(self._roll_windows)
                    if self._leases is not None:
                        nursery.start_soon(self._leases.run)  # asks the owner for pool bytes
                    for listener in self.listeners:
                        await nursery.start(listener.run)
                    if self.shared is not None:  # the supervisor serves the admin port and watches the files
                        log.info("worker started")
                        task_status.started(self)
                        return
                    # Admin last: once it answers, every listener is bound.
                    admin = AdminServer(self.metrics, self.readiness_problems)
                    host, port = self.config.admin.bind_address
                    self.admin_port = await nursery.start(admin.serve, host, port)
                    log.info(
                        "proxy started",
                        extra={
                            "listeners": ",".join(f"{lst.name}={lst.bind}" for lst in self.config.listeners),
                            "admin": f"{host}:{self.admin_port}",
                        },
                    )
                    nursery.start_soon(self._announce_readiness)
                    export_certificate_expiry(self.config.tls_files(), self.metrics.certificate_expiry)
                    if self.config_path is not None:
                        # A ConfigMap or Secret update (the ..data symlink swap), a cert-manager
                        # renewal or an edit: reloaded without a signal.
                        files = [self.config_path, *certificate_files(self.config.tls_files())]
                        self._watcher = FileWatcher(files, self._files_changed)
                        await nursery.start(self._watcher.run)
                    task_status.started(self)
            finally:
                if self._leases is not None:  # every connection has ended: the lease goes back to the owner
                    self._leases.close()
                if self.window is not None:
                    for row in self._finished_window():  # the last, partial window
                        self.audit.record(row)
                self.audit.close()

    async def _files_changed(self, paths: frozenset[str]) -> None:
        self.reload_file()

    async def _announce_readiness(self) -> None:
        await announce_readiness(self.readiness_problems)

    async def _roll_windows(self) -> None:
        """Every audit.window.seconds, the finished observation window becomes audit rows
        (recorded in slices, so a window of many keys does not hold up the requests)."""
        if self.shared is not None:  # on the edges every process of the proxy rolls on
            assert self.window is not None
            await roll_on_grid(self.window, self.config.audit.window.seconds, self._finished_window, self.audit)
            return
        while True:
            await trio.sleep(self.config.audit.window.seconds)
            rows = self._finished_window()
            for start in range(0, len(rows), _ROWS_PER_SLICE):
                for row in rows[start : start + _ROWS_PER_SLICE]:
                    self.audit.record(row)
                await trio.lowlevel.checkpoint()

    def _finished_window(self, edge: float | None = None) -> list[dict[str, object]]:
        assert self.window is not None
        self.window.on_pool(self.runtime.pool.pool.reset_window_high_water_mark(trio.current_time()))
        rows = self.window.roll(time.time() if edge is None else edge)
        return rows if self.shared is None else tell_rows(self.shared.link, rows)  # the pool's is the proxy's

    async def _expire_groups(self, policy: GroupSizePolicy) -> None:
        """Session expiry and idle-group eviction: bounded memory, counts that follow the coordinator."""
        while True:
            await trio.sleep(_GROUP_EXPIRY_INTERVAL_S)
            policy.expire(trio.current_time())

    def reload_file(self) -> ReloadOutcome:
        """SIGHUP, or a watched file changed: re-read the config file and apply it. A file
        that does not load (invalid, or a certificate that cannot serve) changes nothing."""
        metrics = self.metrics
        if self.config_path is None:
            log.warning("config reload ignored: the proxy was not started from a config file")
            return ReloadOutcome("unchanged")
        if self._watcher is not None:
            self._watcher.mark_read()  # after a SIGHUP, the watcher must not reload the same edit again
        try:
            new = load_config(self.config_path)
        except ConfigError as exc:
            log.error("config reload refused, keeping the running config: %s", exc)
            metrics.count_reload("invalid")
            return ReloadOutcome("invalid")
        try:
            outcome = self.reload(new)
        except Exception:  # a bug must not take the running proxy down with it
            log.exception("config reload failed; the running config stays")
            metrics.count_reload("error")
            return ReloadOutcome("error")
        if outcome.refused:  # the rest applied, but the file is not what runs
            metrics.count_reload("restart_required")
        else:
            metrics.count_reload("success")
        export_certificate_expiry(self.config.tls_files(), metrics.certificate_expiry)
        if self._watcher is not None:
            self._watcher.set_paths([self.config_path, *certificate_files(self.config.tls_files())])
        return outcome

    def reload(self, new: Config) -> ReloadOutcome:
        """Apply a changed config: every policy key at once, to existing and new
        connections (a new generation; the connection quotas, the group size policy and
        the pool are reconfigured in place); TLS material is reloaded for new handshakes
        and new broker connections. Keys bound to sockets or sized at start keep their
        running value, each named in a warning: the rest applies."""
        effective, refused = reload_plan(self.config, new)
        self._apply(effective)
        log.info("config reloaded: generation %d applied", self.runtime.generation.number)
        return ReloadOutcome("partial" if refused else "applied", refused)

    def apply_generation(self, number: int, config: Config) -> None:
        """A worker applies the generation its supervisor loaded and planned (``reload_plan``),
        so that every worker runs the same one."""
        self._apply(config, number)
        log.info("config reloaded: generation %d applied", number)

    def _apply(self, config: Config, number: int | None = None) -> None:
        """Everything that can fail first (new TLS contexts are built to check the files),
        then one swap after another that cannot."""
        policies = config.policies
        runtime = self.runtime
        checked, upstream = tls_contexts(config)
        identity = runtime.connector.prepare_identity(config.upstream.tls)
        generation = self._generation(runtime.generation.number + 1 if number is None else number, config)
        if self.group_policy is not None:  # with workers, the owner reconfigured its policy first
            self.group_policy.reconfigure(
                policies.group_size_config(), Mode(policies.mode_of(policies.group_size_mode))
            )
        runtime.pool.reconfigure(policies.socket_request_max_bytes, Mode(policies.mode_of(policies.memory_pool_mode)))
        runtime.gate.reconfigure(
            policies.connection_limits(),
            Mode(policies.mode_of(policies.connections_mode)),
            policies.max_connections_wait_ms,
            policies.max_ssl_handshakes_per_turn,
        )
        for listener, context in zip(self.listeners, checked, strict=True):
            if listener.tls is not None and context is not None:
                listener.tls.context = context  # new handshakes; open connections keep theirs
        runtime.connector.use_tls(config.upstream.tls, upstream, identity)
        runtime.generation = generation
        self.config = config

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
