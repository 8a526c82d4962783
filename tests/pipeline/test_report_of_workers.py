"""A proxy with ``workers: N`` is one proxy in the report (issue 29): its supervisor writes the
connections windows under the proxy's instance, each worker the rest under ``<proxy>-w<i>``
with ``proxy`` naming it, on the same window edges. Read as JSON lines, as the proxy writes
them: the overview counts one proxy, the coverage one window per edge, and max.connections is
recommended from the whole proxy's peak, not a worker's share."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import connection, counted, evidence_of, window

from pipeline.events import find_inputs, read_evidence
from pipeline.impact import hits, parse_candidate, subjects
from pipeline.recommend import recommend, with_headroom
from pipeline.traffic import measure_traffic, open_connections
from policies.properties import MAX_CONNECTIONS, SOCKET_REQUEST_MAX_BYTES

pytestmark = pytest.mark.spark

STARTS = (0.0, 60.0, 120.0)


def workers_proxy(proxy: str, peaks: tuple[int, ...]) -> list[dict[str, Any]]:
    """What ``workers: 2`` writes: the supervisor's connections windows (the owner's counts) and
    pool windows (the workers' figures summed), and each worker's traffic windows, naming the proxy."""
    events = [
        {**window("connections", start, listener="plain", tls=False, max_open=peak), "instance": proxy}
        for start, peak in zip(STARTS, peaks, strict=True)
    ]
    for start in STARTS:
        pool = window("pool", start, capacity_bytes=-1, high_water_mark_bytes=2000 + int(start), waits=0)
        events.append({**pool, "instance": proxy})
    for w in (0, 1):
        worker = {"instance": f"{proxy}-w{w}", "proxy": proxy}
        for start in STARTS:
            api = {"client_id": "app", "api": "fetch", "requests": 5, "max_request_bytes": 100 + w}
            events.append({**window("client_api", start, **api, max_response_bytes=900), **worker})
    return events


def single_proxy(instance: str, peaks: tuple[int, ...]) -> list[dict[str, Any]]:
    """What one process writes (no ``proxy`` field), its windows on edges of its own."""
    events = []
    for start, peak in zip(STARTS, peaks, strict=True):
        events.append({**window("connections", start + 7, listener="plain", tls=False, max_open=peak)})
        api = {"client_id": "app", "api": "fetch", "requests": 5, "max_request_bytes": 100, "max_response_bytes": 900}
        events.append(window("client_api", start + 7, **api))
    return [{**e, "instance": instance} for e in events]


def test_a_proxy_with_two_workers_is_one_proxy_with_one_connection_peak(spark: Any, tmp_path: Path) -> None:
    files = tmp_path / "audit"
    files.mkdir()
    # The whole proxy had 12 open at once; each worker held about half (its windows say nothing of it).
    for name, events in (("px", workers_proxy("px", (12, 9, 4))), ("solo", single_proxy("solo", (7, 7, 7)))):
        lines = [json.dumps({"schema_version": 2, **e}) for e in events]
        (files / f"{name}-20261127T120000Z-000001.jsonl").write_text("\n".join(lines) + "\n")
    evidence = read_evidence(spark, find_inputs([str(files)]), str(tmp_path / "scratch"))
    traffic = measure_traffic(evidence, open_connections(evidence.connections))

    assert traffic.overview.instances == ("px", "solo")
    coverage = traffic.coverage
    assert coverage.windows == {"px": 3, "solo": 3}  # not 3 for each of px, px-w0 and px-w1
    assert coverage.windows_for(MAX_CONNECTIONS) == 6
    assert coverage.windows_for(SOCKET_REQUEST_MAX_BYTES) == 6  # the workers' traffic of one window: one window
    assert traffic.peak_connections is not None
    assert (traffic.peak_connections.value, traffic.peak_connections.where) == (12, "px")
    assert traffic.largest_requests[0]["bytes"] == 101
    assert traffic.pool_peak is not None
    assert (traffic.pool_peak.value, traffic.pool_peak.where) == (2120, "px")  # the proxy's figure, as written

    recs = {r.key: r for r in recommend(traffic, 20.0, min_windows=6)}
    assert recs[MAX_CONNECTIONS].limit == with_headroom(12, 20.0)
    # Six windows measured each: too thin for 7 (counted per worker, the requests' would be 9).
    thin = {r.key: r for r in recommend(traffic, 20.0, min_windows=7)}
    assert thin[MAX_CONNECTIONS].limit is None
    assert thin[SOCKET_REQUEST_MAX_BYTES].limit is None


def test_the_connection_impact_of_two_workers_is_one_processs_for_the_same_opens(spark: Any) -> None:
    """With workers: N the owner writes each open under the proxy's instance with the counts it
    compared, and the worker holding the connection writes its close (with the client id) under
    its own instance: the connection impact names the same proxy, hosts and client ids as the
    events of one process with the same opens."""
    opens = [  # (worker, n, address, counts: max.connections, max.ssl.connections, per IP)
        (0, 1, "10.0.0.1:5001", counted(1, 1, 1)),
        (1, 1, "10.0.0.2:5002", counted(2, 2, 1)),
        (0, 2, "10.0.0.1:5003", counted(3, 3, 2)),
    ]
    one: list[dict[str, Any]] = []
    two: list[dict[str, Any]] = []
    for k, (worker, n, address, counts) in enumerate(opens):
        client = {"client_id": f"app-{k}"}
        alone = f"tls-{k + 1}"
        one.append({**connection("open", k, alone, address, True, **counts), "instance": "px"})
        one.append({**connection("close", 10 + k, alone, address, True, **client), "instance": "px"})
        conn_id = f"w{worker}:tls-{n}"
        two.append({**connection("open", k, conn_id, address, True, **counts), "instance": "px"})
        closed = {"instance": f"px-w{worker}", "proxy": "px"}
        two.append({**connection("close", 10 + k, conn_id, address, True, **client), **closed})

    def impact(events: list[dict[str, Any]]) -> set[tuple[Any, ...]]:
        evidence = evidence_of(spark, events)
        candidates = [parse_candidate(c) for c in ("max.ssl.connections=1", "max.connections.per.ip=1")]
        found = subjects(hits(spark, evidence, open_connections(evidence.connections), candidates))
        return {(r["candidate"], r["evidence"], r["subject_kind"], r["subject"]) for r in found.collect()}

    single = impact(one)
    assert impact(two) == single
    assert ("max.ssl.connections=1", "connection", "client_id", "app-1") in single  # named by its close
    assert ("max.connections.per.ip=1", "connection", "instance", "px") in single
