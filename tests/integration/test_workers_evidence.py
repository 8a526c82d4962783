"""``workers: N`` writes the evidence of one proxy (issue 29): the connections open at once
are the whole proxy's, counted by the owner and written by the supervisor under the proxy's
own instance, never N workers' shares as N proxies; so is the pool's in-flight high-water
mark (the workers' summed); each worker's events name the proxy (``proxy``) and its windows
start on the same edges as the supervisor's."""

from __future__ import annotations

import re
import signal
from collections import defaultdict
from pathlib import Path
from typing import Any

from tests.audit_files import assert_valid, audit_files, read_events
from tests.clients import create_topic, unique
from tests.conftest import wait_until
from tests.integration.test_graceful_shutdown import topic_id
from tests.integration.test_workers import close_all, connections_on_every_worker
from tests.raw_kafka import fetch_frame
from tests.workers_util import start_workers

_INSTANCE = re.compile(r"^(.+)-\d{8}T\d{6}Z-\d{6,}\.jsonl")


def open_at_once(events: list[dict[str, Any]]) -> dict[tuple[str, float], int]:
    """Connections open at once per (instance, window), over every listener: what the report
    takes a proxy's connection peak from."""
    peaks: dict[tuple[str, float], int] = defaultdict(int)
    for e in events:
        if e["type"] == "window" and e["section"] == "connections":
            peaks[(e["instance"], e["window_start"])] += e["max_open"]
    return dict(peaks)


def start_with_audit(start_proxy: Any, tansu: Any, audit: Path) -> Any:
    """Two workers, audit files of instance ``px`` in ``audit``, windows of a second."""
    return start_workers(
        start_proxy, tansu.bootstrap, 2, audit={"path": str(audit), "instance_id": "px", "window": {"seconds": 1}}
    )


def drained_events(proxy: Any, audit: Path) -> list[dict[str, Any]]:
    """SIGTERM: the proxy drains and exits 0; then its finished audit events, checked against the schema."""
    proxy.signal(signal.SIGTERM)
    assert proxy.wait(timeout=15) == 0
    events = read_events(audit, finished_only=True)
    assert_valid(events)
    return events


def test_the_connection_peak_of_two_workers_is_the_whole_proxys_written_under_its_own_instance(
    tansu: Any, start_proxy: Any, tmp_path: Path
) -> None:
    audit = tmp_path / "audit"
    proxy = start_with_audit(start_proxy, tansu, audit)
    by_worker = connections_on_every_worker(proxy, 2, 10)  # both workers hold some of the 10
    try:
        # A window that ends with all 10 open says 10 for the proxy (each later one too: they stay open).
        wait_until(lambda: 10 in open_at_once(read_events(audit)).values(), timeout=15)
    finally:
        close_all(by_worker)
    events = drained_events(proxy, audit)
    peaks = open_at_once(events)
    assert {instance for instance, _ in peaks} == {"px"}, "a worker wrote connections windows of its own"
    assert max(peaks.values()) == 10
    assert {_INSTANCE.match(path.name)[1] for path in audit_files(audit)} == {"px", "px-w0", "px-w1"}  # type: ignore[index]
    # The supervisor's events are the proxy's; each worker's name it beside their own instance.
    for e in events:
        assert e.get("proxy") == (None if e["instance"] == "px" else "px"), e
    # The workers' windows (traffic) begin on the supervisor's edges: one window of one proxy.
    starts = defaultdict(set)
    for e in events:
        if e["type"] == "window":
            starts[e["instance"]].add(e["window_start"])
    assert set(starts) == {"px", "px-w0", "px-w1"}
    for instance, begun in starts.items():
        assert all(start == int(start) for start in begun), (instance, sorted(begun))
    assert starts["px-w0"] | starts["px-w1"] <= starts["px"]


def pool_rows(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "window" and e["section"] == "pool"]


def test_the_pool_high_water_mark_of_two_workers_is_the_whole_proxys_written_under_its_own_instance(
    tansu: Any, start_proxy: Any, tmp_path: Path
) -> None:
    """Fetches parked at the broker on both workers at once hold their request bytes in both:
    the proxy's pool window says the bytes of all of them (each worker tells its own window's
    figure at the edge, the supervisor writes the sum), and no worker writes a pool row, whose
    most would be one worker's share."""
    audit = tmp_path / "audit"
    proxy = start_with_audit(start_proxy, tansu, audit)
    topic = unique("empty")
    create_topic(proxy.bootstrap, topic)
    by_worker = connections_on_every_worker(proxy, 2, 8)
    conns = [conn for conns in by_worker.values() for conn in conns]
    parked = 0
    try:
        frames = [fetch_frame(50 + i, topic_id(conn, topic), max_wait_ms=4000) for i, conn in enumerate(conns)]
        for conn, frame in zip(conns, frames, strict=True):  # no other request is in flight meanwhile
            conn.send(frame)
            parked += len(frame) - 4  # the request's size, its length prefix aside
        wait_until(lambda: parked in [e["high_water_mark_bytes"] for e in pool_rows(read_events(audit))], timeout=15)
    finally:
        close_all(by_worker)
    events = drained_events(proxy, audit)
    rows = pool_rows(events)
    assert {e["instance"] for e in rows} == {"px"}, "a worker wrote pool windows of its own"
    assert max(e["high_water_mark_bytes"] for e in rows) == parked
    assert len({e["window_start"] for e in rows}) == len(rows)  # one row per window: the workers' summed
