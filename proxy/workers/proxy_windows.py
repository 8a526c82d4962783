"""The whole proxy's observation windows with ``workers: N`` (docs/workers.md, "Evidence"):
what only the owner of a shared limit knows is observed there and written by the supervisor
under the proxy's own audit instance, as one process writes it. Today that is the
``connections`` section: the connections open at once across every worker (a peak of a sum,
which no sum of the workers' peaks gives), counted by ``ConnectionOwner`` as it admits and
closes them; each connection's ``open`` event is written there too, with the counts the owner's
limits compared (proxy/workers/owner_connections.py). Each worker writes the rest under
``<instance>-w<index>``, its events naming the proxy (``proxy``), and every process rolls its
windows on one grid of edges."""

from __future__ import annotations

import time
from collections.abc import Callable

import trio

from proxy.config.model import Config
from proxy.evidence.audit import AuditSink
from proxy.evidence.metrics import Metrics
from proxy.evidence.observation_window import ObservationWindow, window_edge

# The sections the supervisor writes; a worker writes every other one (proxy/serve/server.py).
PROXY_SECTIONS = frozenset({"connections"})
_ROWS_PER_SLICE = 500


async def roll_on_grid(
    window: ObservationWindow,
    seconds: float,
    finished: Callable[[float | None], list[dict[str, object]]],
    audit: AuditSink,
) -> None:
    """Every window edge (multiples of ``seconds`` of Unix time), the finished window's rows
    (``finished(edge)``) become audit events, in slices so a window of many keys does not hold
    up the event loop. Every process of one proxy rolls on the same edges."""
    edge = window_edge(time.time(), seconds)
    while True:
        # the next edge; after a stall (a suspended process), the last one passed
        edge = max(edge + seconds, window_edge(time.time(), seconds))
        await trio.sleep(max(edge - time.time(), 0.0))
        rows = finished(edge)
        for start in range(0, len(rows), _ROWS_PER_SLICE):
            for row in rows[start : start + _ROWS_PER_SLICE]:
                audit.record(row)
            await trio.lowlevel.checkpoint()


class ProxyWindows:
    """The supervisor's audit instance (``audit.instance_id``, the proxy's own) and its windows."""

    def __init__(self, config: Config, metrics: Metrics) -> None:
        self.seconds = config.audit.window.seconds
        self.audit = AuditSink(config.audit, metrics, config.upstream)
        self.window = ObservationWindow(window_edge(time.time(), self.seconds), sections=PROXY_SECTIONS)

    def finished(self, edge: float | None = None) -> list[dict[str, object]]:
        return self.window.roll(time.time() if edge is None else edge)

    async def run(self) -> None:
        await roll_on_grid(self.window, self.seconds, self.finished, self.audit)

    def close(self) -> None:
        """The last, partial window, then the sink's files (or producer) finished."""
        for row in self.finished():
            self.audit.record(row)
        self.audit.close()
