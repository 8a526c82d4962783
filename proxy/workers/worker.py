"""One worker process of ``workers: N``: the ordinary ProxyServer on the shared ports
(SO_REUSEPORT), with the supervisor at the other end of a socket pair it inherited.
The supervisor gives it the config generation to run (never the file: every worker
runs the one generation the supervisor loaded), and serves the admin port for all.
SIGTERM drains as one process does; SIGINT and SIGHUP are the supervisor's to act on.
When the supervisor is gone (the link ends), the worker exits: the shared limits
cannot be kept without their owner."""

from __future__ import annotations

import argparse
import logging
import signal
import socket

import trio

from proxy.cli import exit_status, prepare_serving_process
from proxy.evidence.logs import setup_logging
from proxy.serve.driver import IODriver
from proxy.serve.server import ProxyServer
from proxy.workers.link import Link, WorkerLink
from proxy.workers.metrics import flush_periodically, serve_flush

log = logging.getLogger("kafka_admission_proxy.worker")

# How long an exiting worker waits for its last tells to be sent (a supervisor that reads
# nothing holds up no exit: it releases what the worker held when it sees it gone).
LAST_TELLS_S = 2.0


class _WorkerField(logging.Filter):
    """Every log line of a worker names it (``worker=<index>``)."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def filter(self, record: logging.LogRecord) -> bool:
        record.worker = self.index
        return True


async def serve_worker(config_path: str, index: int, workers: int, link_fd: int, drain_timeout: float) -> None:
    supervisor = socket.socket(fileno=link_fd)
    kind, (generation, config, brokers, elsewhere) = Link.first_message(supervisor)  # before anything else
    assert kind == "worker.start", kind
    link = Link(trio.SocketStream(trio.socket.from_stdlib_socket(supervisor)))
    server = ProxyServer(config, config_path, shared=WorkerLink(index, workers, link, generation))
    # A restarted worker knows the brokers the others learned before it binds: each listener opens
    # their node ports as it starts, and a bootstrap-port client counts against its broker at once.
    await server.directory.learn(brokers, told=True, elsewhere=elsewhere)
    link.handlers["worker.reload"] = server.apply_generation
    link.handlers["worker.readiness"] = server.readiness_problems
    serve_flush(link, server.metrics)
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            async with trio.open_nursery() as serving:
                await serving.start(server.run)
                # Read by the server's I/O driver (running now): an answer from the owner wakes only
                # the task that asked (docs/workers.md). Asks made before this wait in the socket.
                nursery.start_soon(_follow_supervisor, link, server.runtime.driver, nursery.cancel_scope)
                nursery.start_soon(flush_periodically, server.metrics)
                link.tell("worker.ready", server.runtime.generation.number)
                async for _ in signals:
                    await server.shutdown(drain_timeout)
                    break
            # The server has ended: every connection's end is told (its close, its pool bytes, its
            # group join), and the lease given back. Those tells reach the owner before the worker
            # exits, so its counts come from the worker, not from the release at its death.
            server.metrics.flush()  # what the drained requests added
            with trio.move_on_after(LAST_TELLS_S):
                await link.sent()
            nursery.cancel_scope.cancel()


async def _follow_supervisor(link: Link, driver: IODriver, scope: trio.CancelScope) -> None:
    await link.run(driver)
    log.error("the supervisor is gone; worker exiting")
    scope.cancel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kafka-admission-proxy worker")
    parser.add_argument("--config", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--link-fd", type=int, required=True)
    parser.add_argument("--drain-timeout", type=float, required=True)
    parser.add_argument("--log-format", default="text")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    setup_logging(args.log_format, args.log_level)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_WorkerField(args.index))
    # A Ctrl-C reaches the whole process group: the supervisor turns it into SIGTERM for each worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    prepare_serving_process()
    return exit_status(
        lambda: trio.run(serve_worker, args.config, args.index, args.workers, args.link_fd, args.drain_timeout) or 0
    )
