"""A process that writes metrics as a proxy worker does (tests/integration/test_worker_metrics.py):
``Metrics(role="worker")`` under ``PROMETHEUS_MULTIPROC_DIR`` set by its parent, traffic added to
plain TrafficStats as the request path adds it, and the flush the supervisor asks for over a
real link (a Unix socket inherited as file descriptor ``argv[1]``)."""

from __future__ import annotations

import os
import socket
import sys

import trio

from proxy.evidence.metrics import Metrics
from proxy.workers.link import Link
from proxy.workers.metrics import serve_flush

METADATA = 3


def add_requests(metrics: Metrics, count: int, latency: float) -> None:
    """``count`` Metadata requests of 100 bytes answered with 1,000, each ``latency`` long."""
    stats = metrics.traffic_of("plain")
    for _ in range(count):
        stats.requests[METADATA] = stats.requests.get(METADATA, 0) + 1
        stats.request_bytes += 100
        stats.response_bytes += 1000
        stats.observe_latency(latency)


async def main(fd: int) -> None:
    assert os.environ.get("PROMETHEUS_MULTIPROC_DIR"), "the parent names the metrics directory"
    metrics = Metrics(role="worker")
    link = Link(trio.SocketStream(trio.socket.from_stdlib_socket(socket.socket(fileno=fd))))
    serve_flush(link, metrics)
    link.handlers["test.requests"] = lambda count, latency: add_requests(metrics, count, latency)
    link.handlers["test.connections"] = lambda count: metrics.connections_active.labels("plain", "false").inc(count)
    link.handlers["test.pid"] = os.getpid
    await link.run()


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]))
