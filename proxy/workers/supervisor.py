"""The supervisor of ``workers: N`` (docs/workers.md): it starts N worker processes on
the same ports, owns the limits they share (``Owner``), serves the admin port once,
restarts a worker that dies (releasing what it held), drains them all on SIGTERM, and
reloads them all to one config generation on SIGHUP or a changed file, counting one
outcome per reload. It serves no client connection itself."""

from __future__ import annotations

import logging
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import trio
from prometheus_client import Counter

from proxy.config.certificates import certificate_files, export_certificate_expiry
from proxy.config.model import Config, ConfigError, Listener, load_config
from proxy.evidence.metrics import Metrics
from proxy.serve.admin import AdminServer
from proxy.serve.file_watch import FileWatcher
from proxy.serve.server import READY_PROBE_TIMEOUT_S, announce_readiness, reload_plan, tls_contexts
from proxy.workers.link import Link, LinkClosed, RemoteError
from proxy.workers.metrics import MetricsFiles, WholeProxyMetrics, flush_workers
from proxy.workers.owner import Owner
from proxy.workers.owner_connections import ConnectionOwner
from proxy.workers.port_claims import PortClaims
from proxy.workers.proxy_windows import WINDOW_ROWS, ProxyWindows
from proxy.workers.shared_backoff import BACKOFF, pass_on_backoff
from proxy.workers.shared_brokers import SharedBrokers

log = logging.getLogger("kafka_admission_proxy.supervisor")

# A worker that dies within this long of its start is restarted after a growing pause
# (a crash loop must not spin), one that ran longer at once.
_QUICK_DEATH_S = 10.0
_RESTART_DELAY_MAX_S = 30.0
# After the drain timeout, how long workers get to close before they are killed.
_EXIT_GRACE_S = 5.0
# 1: the kernel moves connections waiting in a dead worker's accept queue to another
# worker's (Linux 5.14+, per network namespace); 0, the default, resets them.
TCP_MIGRATE_REQ = Path("/proc/sys/net/ipv4/tcp_migrate_req")
# A worker's answer to a reload (TLS contexts are built) or a readiness question.
_ASK_TIMEOUT_S = READY_PROBE_TIMEOUT_S + 2.0


class Supervisor:
    def __init__(
        self, config: Config, config_path: str, workers: int, drain_timeout: float, worker_args: list[str]
    ) -> None:
        self.config = config  # the generation every worker runs (or is told to run)
        self.generation = 1
        self.config_path = config_path
        self.workers = workers
        self.drain_timeout = drain_timeout
        self._worker_args = worker_args  # logging options, passed on
        # Before any metric is made: from here on this process and its workers write their
        # metrics to these files, and /metrics serves their merge.
        self.metric_files = MetricsFiles.open()
        self.metric_files.enter()
        self.metrics = Metrics(role="supervisor")
        self.owner = Owner(config)
        self.restarts = Counter(
            "kafka_admission_worker_restarts",
            "Worker processes restarted after they died, by worker index",
            ("worker",),
            registry=self.metrics.registry,
        )
        self.released = Counter(
            "kafka_admission_worker_released",
            "What dead workers held and the supervisor gave back (connections, pool bytes, group joins)",
            ("what",),
            registry=self.metrics.registry,
        )
        # The whole proxy's evidence, under its own audit instance: what the owner counts across
        # the workers (the connections open at once), which no worker's windows can say.
        self.windows: ProxyWindows | None = None
        if config.audit.path is not None or config.audit.topic is not None:
            self.windows = ProxyWindows(config, self.metrics)
            for service in self.owner.services:
                if isinstance(service, ConnectionOwner):
                    service.window = self.windows.window
                    service.audit = self.windows.audit  # the open events: their counts are the owner's
        self.exit_code = 0
        self.admin_port: int | None = None
        self._links: dict[int, Link] = {}  # the workers that are serving
        # What the workers learned: each opens every node port, once no other process serves it.
        self.ports = PortClaims()  # held until every worker is gone (proxy/workers/port_claims.py)
        self.brokers = SharedBrokers(self.ports, self._node_ports)
        self._processes: dict[int, trio.Process] = {}
        self._all_ready = trio.Event()  # every worker served once: the proxy has started
        self._stop = trio.Event()
        self._reloading = trio.Lock()
        self._watcher: FileWatcher | None = None
        self._nursery: trio.Nursery | None = None

    # -- the whole life ---------------------------------------------------------------

    async def serve(self) -> int:
        """Run until SIGTERM or SIGINT has drained every worker (0), or until a worker fails
        to start (its exit status: a port that cannot be bound is the operator's to fix)."""
        _warn_without_migration()
        with self.ports:
            for listener in self.config.listeners:  # before any worker joins a port with SO_REUSEPORT
                self.ports.claim(f"listener {listener.name}", *listener.bind_address)
            self.brokers.claim_static_ports(self._passthrough_node_ports())
            await self._serve()
        return self.exit_code

    async def _serve(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals, self.metric_files:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self.owner.run)
                if self.windows is not None:
                    nursery.start_soon(self.windows.run)
                async with trio.open_nursery() as workers:
                    for index in range(self.workers):
                        workers.start_soon(self._keep_worker, index)
                    nursery.start_soon(self._serve_once_started)
                    async for signum in signals:
                        log.info("received %s", signal.Signals(signum).name)
                        if signum == signal.SIGHUP:
                            await self.reload_file()
                            continue
                        self.shutdown(workers.cancel_scope)
                        break
                nursery.cancel_scope.cancel()
        if self.windows is not None:  # after the workers: their last closes are counted
            self.windows.close()

    async def _serve_once_started(self) -> None:
        """Admin last, as with one process: once it answers, every worker's listeners are bound."""
        await self._all_ready.wait()
        assert self._nursery is not None
        host, port = self.config.admin.bind_address
        self.admin_port = await self._nursery.start(self._admin_server().serve, host, port)
        log.info(
            "proxy started",
            extra={
                "listeners": ",".join(f"{lst.name}={lst.bind}" for lst in self.config.listeners),
                "admin": f"{host}:{self.admin_port}",
                "workers": self.workers,
            },
        )
        export_certificate_expiry(self.config.tls_files(), self.metrics.certificate_expiry)
        self._watcher = FileWatcher(self._watched_files(), self._files_changed)
        await self._nursery.start(self._watcher.run)
        await announce_readiness(self.readiness_problems)

    def _admin_server(self) -> AdminServer:
        """/metrics, /healthz, /readyz for the whole proxy. /metrics: every process's metric
        files (the workers' traffic and connections, the supervisor's restarts and reloads)
        merged, and the owner's collectors (the shared counts)."""
        whole = WholeProxyMetrics(self.metric_files, self.metrics, self.owner.collectors())
        return AdminServer(
            self.metrics,
            self.readiness_problems,
            exposition=lambda: whole.exposition(lambda: flush_workers(list(self._links.values()))),
        )

    def shutdown(self, workers: trio.CancelScope) -> None:
        """SIGTERM to every worker (each drains as one process does); wait for them, at most
        the drain timeout and a grace, then kill what is left."""
        log.info("shutting down: draining every worker")
        self._stop.set()
        for process in self._processes.values():
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        workers.deadline = trio.current_time() + self.drain_timeout + _EXIT_GRACE_S

    # -- one worker -------------------------------------------------------------------

    async def _keep_worker(self, index: int) -> None:
        delay = 0.0
        while not self._stop.is_set():
            started = trio.current_time()
            status = await self._run_worker(index)
            if self._stop.is_set():
                return
            if not self._all_ready.is_set():  # it never served: the proxy cannot start
                log.error("worker %d exited with status %s before it served; stopping", index, status)
                self.exit_code = status if status > 0 else 1
                assert self._nursery is not None
                self._nursery.cancel_scope.cancel()
                return
            released = self.owner.worker_gone(index)
            self.restarts.labels(str(index)).inc()
            for what, amount in released.items():
                self.released.labels(what).inc(amount)
            delay = (
                min(max(delay * 2, 0.5), _RESTART_DELAY_MAX_S) if trio.current_time() - started < _QUICK_DEATH_S else 0
            )
            log.warning(
                "worker %d exited with status %s; restarting it%s",
                index,
                status,
                f" in {delay:g}s" if delay else "",
                extra={"released": ", ".join(f"{what}={n}" for what, n in sorted(released.items())) or "nothing"},
            )
            with trio.move_on_after(delay):
                await self._stop.wait()

    async def _run_worker(self, index: int) -> int:
        """Start worker ``index`` and return its exit status once it is gone (the process has
        exited and its end of the link is read to the last message)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        link = Link(trio.SocketStream(trio.socket.from_stdlib_socket(ours)))
        # Its first message: the generation to serve (the one the others run, not the file's), and
        # the brokers known, whose node ports it opens before it accepts a bootstrap-port client.
        link.tell(
            "worker.start",
            self.generation,
            self.config,
            list(self.brokers.known.values()),
            self.brokers.served_elsewhere,
        )
        link.handlers["worker.ready"] = lambda generation: self._worker_ready(index, link, generation)
        link.handlers["worker.brokers"] = lambda brokers: self.brokers.learned(self._others(index), brokers)
        link.handlers[BACKOFF] = lambda block: pass_on_backoff(block, self._others(index))
        if self.windows is not None:
            link.handlers[WINDOW_ROWS] = self.windows.told
        self.owner.attach(index, link)
        command = [
            sys.executable,
            "-m",
            "proxy.workers",
            *("--config", self.config_path, "--index", str(index), "--workers", str(self.workers)),
            *("--link-fd", str(theirs.fileno()), "--drain-timeout", str(self.drain_timeout)),
            *self._worker_args,
        ]
        try:
            process = await trio.lowlevel.open_process(command, pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        self._processes[index] = process
        if self._stop.is_set():  # a restart that raced the shutdown
            process.send_signal(signal.SIGTERM)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._serve_link, index, link, process)
                await process.wait()
                with trio.move_on_after(1.0):
                    await link.closed.wait()
                nursery.cancel_scope.cancel()
        finally:
            self._links.pop(index, None)
            self._processes.pop(index, None)
            if process.returncode is None:  # cancelled: the drain took too long, or the start failed
                process.kill()
        assert process.returncode is not None
        # Its live gauges (connections open) end with it; its counters are folded into the kept files.
        await trio.to_thread.run_sync(self.metric_files.process_gone, process.pid)
        return process.returncode

    @staticmethod
    async def _serve_link(index: int, link: Link, process: trio.Process) -> None:
        """A handler that fails on a worker's tell costs that worker (killed, its share released,
        restarted), not the supervisor and every other worker with it."""
        try:
            await link.run()
        except Exception:
            log.exception("worker %d: handling its message failed; killing it", index)
            if process.returncode is None:
                process.kill()

    def _node_ports(self, node_id: int) -> list[tuple[str, str, int]]:
        """(listener, host, port) of the port each listener opens for broker ``node_id``."""
        if self.config.mode != "cluster":
            return []
        return [_node_port(lst, node_id) for lst in self.config.listeners if not lst.passthrough]

    def _passthrough_node_ports(self) -> dict[int, list[tuple[str, str, int]]]:
        """Cluster mode: the node ports passthrough listeners open at their start, by node id."""
        ports: dict[int, list[tuple[str, str, int]]] = {}
        if self.config.mode == "cluster":
            for lst in self.config.listeners:
                if lst.passthrough:
                    for node_id in lst.passthrough_brokers:
                        ports.setdefault(node_id, []).append(_node_port(lst, node_id))
        return ports

    def _others(self, index: int) -> dict[int, Link]:
        """The serving workers but ``index``: those that hear what it learned."""
        return {other: each for other, each in self._links.items() if other != index}

    def _worker_ready(self, index: int, link: Link, generation: int) -> None:
        self._links[index] = link
        log.info("worker %d serving", index, extra={"pid": self._processes[index].pid, "generation": generation})
        if self.brokers.known:  # and those learned since its start, which no spread told it
            link.tell("worker.brokers", list(self.brokers.known.values()), self.brokers.served_elsewhere)
        if generation != self.generation:  # it started from a generation a reload has replaced since
            assert self._nursery is not None
            self._nursery.start_soon(self._catch_up, index)
        if len(self._links) == self.workers:
            self._all_ready.set()

    async def _catch_up(self, index: int) -> None:
        async with self._reloading:  # the generation it is told is the one the others run
            answers = await self._ask_every_worker("worker.reload", self.generation, self.config, only=index)
        for answer in answers.values():
            if isinstance(answer, Exception):
                log.error("worker %d did not apply generation %d: %s", index, self.generation, answer)

    async def _ask_every_worker(self, kind: str, *args: Any, only: int | None = None) -> dict[int, Any]:
        """Every serving worker's answer (or the exception: LinkClosed, RemoteError, TooSlowError),
        or worker ``only``'s."""
        answers: dict[int, Any] = {}

        async def ask(index: int, link: Link) -> None:
            try:
                with trio.fail_after(_ASK_TIMEOUT_S):
                    answers[index] = await link.ask(kind, *args)
            except (LinkClosed, RemoteError, trio.TooSlowError) as exc:
                answers[index] = exc

        async with trio.open_nursery() as nursery:
            for index, link in list(self._links.items()):
                if only is None or index == only:
                    nursery.start_soon(ask, index, link)
        return answers

    # -- admin ------------------------------------------------------------------------

    async def readiness_problems(self) -> list[str]:
        """What the serving workers find missing (their listeners, the upstream). A worker being
        restarted does not make the proxy unready: the others accept its share meanwhile."""
        problems = [] if self._links else ["no worker is serving"]
        for index, answer in sorted((await self._ask_every_worker("worker.readiness")).items()):
            if isinstance(answer, Exception):
                problems.append(f"worker {index} did not answer: {answer or type(answer).__name__}")
                continue
            problems += [problem for problem in answer if problem not in problems]
        return problems

    # -- reload -----------------------------------------------------------------------

    def _watched_files(self) -> list[str]:
        return [self.config_path, *certificate_files(self.config.tls_files())]

    async def _files_changed(self, paths: frozenset[str]) -> None:
        await self.reload_file()

    async def reload_file(self) -> None:
        """Load and check the file here (an invalid one changes nothing), let the owner
        apply it, then every worker the same generation; one outcome is counted."""
        metrics = self.metrics
        async with self._reloading:
            if self._watcher is not None:
                self._watcher.mark_read()
            try:
                new = load_config(self.config_path)
            except ConfigError as exc:
                log.error("config reload refused, keeping the running config: %s", exc)
                metrics.count_reload("invalid")
                return
            try:
                config, refused = reload_plan(self.config, new)
                tls_contexts(config)  # TLS files that cannot serve fail here, not in a worker
                self.owner.reconfigure(config)
                self.generation += 1
                self.config = config
                answers = await self._ask_every_worker("worker.reload", self.generation, config)
            except Exception:  # a bug must not take the running proxy down with it
                log.exception("config reload failed; the running config stays")
                metrics.count_reload("error")
                return
            failed = {index: answer for index, answer in answers.items() if isinstance(answer, Exception)}
            if failed:
                for index, answer in sorted(failed.items()):
                    log.error(
                        "config reload: worker %d did not apply generation %d: %s", index, self.generation, answer
                    )
                metrics.count_reload("error")
            else:
                metrics.count_reload("restart_required" if refused else "success")
                log.info("config reloaded: generation %d applied by every worker", self.generation)
            export_certificate_expiry(self.config.tls_files(), metrics.certificate_expiry)
            if self._watcher is not None:
                self._watcher.set_paths(self._watched_files())


def _warn_without_migration() -> None:
    try:
        migrate = TCP_MIGRATE_REQ.read_text().strip()
    except OSError:
        return  # before Linux 5.14: nothing to set
    if migrate == "0":
        log.warning(
            "net.ipv4.tcp_migrate_req is 0: connections waiting to be accepted by a worker that dies are reset;"
            " set it to 1 to move them to another worker (docs/workers.md)"
        )


def _node_port(listener: Listener, node_id: int) -> tuple[str, str, int]:
    """(listener, host, port) of the port ``listener`` opens for broker ``node_id``."""
    return (listener.name, listener.bind_address[0], listener.node_port_base + node_id)
