"""The whole proxy's pool windows with ``workers: N`` (proxy/workers/proxy_windows.py): the rows
each worker tells at an edge are summed per window and written under the proxy's instance,
once every worker has had a period to tell them, and all of them at exit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proxy.config.model import parse_config
from proxy.evidence.metrics import Metrics
from proxy.workers.proxy_windows import ProxyWindows


def pool_row(start: float, high_water_mark: int, waits: int, seconds: float = 10.0) -> dict[str, Any]:
    return {
        "type": "window",
        "section": "pool",
        "window_start": start,
        "window_seconds": seconds,
        "capacity_bytes": -1,
        "high_water_mark_bytes": high_water_mark,
        "waits": waits,
    }


def pool_rows(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    return [row for row in rows if row["section"] == "pool"]


def test_the_workers_pool_rows_of_a_window_are_summed_into_one_row_written_a_period_after_it_ends(
    tmp_path: Path,
) -> None:
    config = parse_config(
        {
            "upstream": {"bootstrap_servers": ["127.0.0.1:9092"]},
            "listeners": [{"name": "l", "bind": "127.0.0.1:1"}],
            "audit": {"path": str(tmp_path), "instance_id": "px", "window": {"seconds": 10}},
        }
    )
    windows = ProxyWindows(config, Metrics(role="supervisor"))
    try:
        windows.told([pool_row(100.0, 300, 1)])
        windows.told([pool_row(100.0, 500, 2, seconds=4.0)])  # a restarted worker's first window is shorter
        windows.told([pool_row(110.0, 50, 0)])
        assert pool_rows(windows.finished(110.0)) == []  # just ended: a worker may not have told it yet
        assert pool_rows(windows.finished(120.0)) == [pool_row(100.0, 800, 3)]
        assert pool_rows(windows.finished(130.0)) == [pool_row(110.0, 50, 0)]
        windows.told([pool_row(130.0, 70, 0)])
        assert pool_rows(windows.finished()) == [pool_row(130.0, 70, 0)]  # at exit: every window told
    finally:
        windows.audit.close()
