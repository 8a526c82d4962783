"""The whole proxy's observation windows with ``workers: N`` (docs/workers.md, "Evidence"):
what is one figure of the whole proxy is written by the supervisor under the proxy's own
audit instance, as one process writes it. The ``connections`` section: the connections open
at once across every worker (a peak of a sum, which no sum of the workers' peaks gives),
counted by ``ConnectionOwner`` as it admits and closes them; each connection's ``open`` event
is written there too, with the counts the owner's limits compared
(proxy/workers/owner_connections.py). The ``pool`` section: each worker tells its own window's
row at each edge (``tell_rows``), and the supervisor writes their sum, an upper bound of the
proxy's bytes in flight at once (a sum of peaks), where the most of them was a floor. Each
worker writes the rest under ``<instance>-w<index>``, its events naming the proxy (``proxy``),
and every process rolls its windows on one grid of edges."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import trio

from proxy.config.model import Config
from proxy.evidence.audit import AuditSink
from proxy.evidence.metrics import Metrics
from proxy.evidence.observation_window import ObservationWindow, window_edge
from proxy.workers.link import Link

# The sections the supervisor observes itself; a worker observes every other one (proxy/serve/server.py).
PROXY_SECTIONS = frozenset({"connections"})
# Those a worker observes and tells the supervisor at each edge, which writes the proxy's sum.
TOLD_SECTIONS = frozenset({"pool"})
WINDOW_ROWS = "window.rows"
_ROWS_PER_SLICE = 500


def tell_rows(link: Link, rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """A worker's finished window: the rows of TOLD_SECTIONS go to the supervisor; the rest,
    returned, are the worker's to record."""
    told = [row for row in rows if row["section"] in TOLD_SECTIONS]
    if told:
        link.tell(WINDOW_ROWS, told)
    return [row for row in rows if row["section"] not in TOLD_SECTIONS]


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
        self._pools: dict[float, dict[str, Any]] = {}  # window start -> the workers' pool rows, summed

    def told(self, rows: list[dict[str, Any]]) -> None:
        """A worker's rows of a finished window (``tell_rows``): added to the other workers' of the
        same window (every process's windows start on the same edges)."""
        for row in rows:
            pool = self._pools.setdefault(row["window_start"], {**row, "high_water_mark_bytes": 0, "waits": 0})
            pool["high_water_mark_bytes"] += row["high_water_mark_bytes"]
            pool["waits"] += row["waits"]
            for field in ("capacity_bytes", "window_seconds"):  # a restarted worker's first window is shorter
                pool[field] = max(pool[field], row[field])

    def finished(self, edge: float | None = None) -> list[dict[str, object]]:
        """The supervisor's window, and the workers' summed rows of the windows that ended a period
        before ``edge`` (their last worker has told them by then), or of every window at the end."""
        rows = self.window.roll(time.time() if edge is None else edge)
        for start in sorted(self._pools):
            if edge is None or start + 2 * self.seconds <= edge:
                rows.append(self._pools.pop(start))
        return rows

    async def run(self) -> None:
        await roll_on_grid(self.window, self.seconds, self.finished, self.audit)

    def close(self) -> None:
        """The last, partial window, then the sink's files (or producer) finished."""
        for row in self.finished():
            self.audit.record(row)
        self.audit.close()
