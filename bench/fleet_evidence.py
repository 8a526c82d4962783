"""Synthetic fleet evidence: audit events (schema_version 2) of many proxies.

Writes what a fleet of kafka-admission-proxy instances would leave in one audit
directory -- rotated JSON-line files named ``<instance>-<start>.jsonl`` holding
decisions, connection lifecycle events and observation windows, exactly as
``schema/audit-event-v2.schema.json`` describes them -- and returns the ground
truth the report must find in them (largest group, peak TLS connections, longest
identifiers, largest requests...), computed here while generating, independently
of the pipeline. The tests use it small; ``bench/report_bench.py`` at 10 million
events.

Traffic shape: clients of a few services (producers, consumers, both), each
pinned to one or two proxies; log-normal request and response sizes per API;
consumer groups of Zipf-like sizes drifting over time, each coordinated by one
proxy; a TLS listener and a plaintext one; connection churn; pool high-water
marks. Planted, when ``planted`` is on: a 250-character client id (one over
KIP-1233's 249), one group far larger than the rest, a pool burst, and observe
mode decisions for them as a proxy with those limits configured would record.

    .venv/bin/python bench/fleet_evidence.py --events 10000000 --out /tmp/fleet
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

SERVICES = ("orders", "payments", "inventory", "shipping", "search", "billing", "audit-trail", "clickstream")
PRODUCER_APIS = ("produce", "metadata", "init_producer_id", "api_versions")
CONSUMER_APIS = (
    "fetch",
    "metadata",
    "find_coordinator",
    "join_group",
    "sync_group",
    "heartbeat",
    "offset_commit",
    "api_versions",
)
# (median bytes, sigma) of log-normal request and response sizes per API.
SIZES: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {
    "produce": ((16_000, 1.1), (90, 0.3)),
    "fetch": ((120, 0.4), (180_000, 1.4)),
    "metadata": ((60, 0.3), (4_000, 0.8)),
    "find_coordinator": ((50, 0.2), (60, 0.2)),
    "join_group": ((400, 0.5), (600, 1.0)),
    "sync_group": ((300, 0.5), (300, 0.6)),
    "heartbeat": ((80, 0.2), (20, 0.1)),
    "offset_commit": ((200, 0.6), (80, 0.4)),
    "init_producer_id": ((60, 0.2), (40, 0.1)),
    "api_versions": ((40, 0.1), (500, 0.1)),
}
# What the files hold; a benchmark's fleet made under another format is made again (2: connection
# opens carry the counts the proxy's limits took).
FORMAT = 2
MAX_REQUEST = 8 * 1024 * 1024
MAX_RESPONSE = 50 * 1024 * 1024
LONG_CLIENT_ID = "etl-backfill-" + "x" * 237  # 250 characters: one over KIP-1233's 249
BIG_GROUP = "clickstream-fanout"
BIG_GROUP_PEAK = 140
CONFIGURED_GROUP_MAX_SIZE = 100  # the observe-mode limit the planted decisions were taken under
POOL_CAPACITY = 209_715_200


@dataclass(frozen=True)
class FleetSpec:
    """What to generate. ``windows`` observation windows per proxy; events follow from it."""

    instances: int = 4
    clients: int = 120
    groups: int = 30
    windows: int = 20
    window_seconds: float = 60.0
    start: float = 1_794_787_200.0  # 2026-11-16 00:00 UTC
    seed: int = 7
    lines_per_file: int = 20_000
    planted: bool = True
    churn: int = 6  # connections opened (and as many closed) per proxy and window
    malformed_lines: int = 0  # garbage lines spread over the files
    v1_lines: int = 0  # schema_version 1 lines (the proxy's old audit format)
    partial_file: bool = False  # leave one file with a half-written last line


@dataclass
class FleetTruth:
    """What is in the files, computed while writing them (the report must agree)."""

    events: int = 0
    by_type: Counter[str] = field(default_factory=Counter)
    by_section: Counter[str] = field(default_factory=Counter)
    files: list[str] = field(default_factory=list)
    instances: list[str] = field(default_factory=list)
    first_ts: float = math.inf
    last_ts: float = -math.inf
    largest_group: dict[str, tuple[str, int]] = field(default_factory=dict)  # kind -> (group, members)
    peak_tls_per_instance: int = 0
    peak_connections_per_instance: int = 0
    peak_per_ip: int = 0
    largest_request: tuple[str, str, int] = ("", "", 0)  # client id, api, bytes
    largest_response: tuple[str, str, int] = ("", "", 0)
    longest: dict[str, tuple[int, str, str]] = field(default_factory=dict)  # kind -> (length, client id, value)
    pool_high_water_marks: list[int] = field(default_factory=list)
    decisions: Counter[tuple[str, str]] = field(default_factory=Counter)  # (policy, limit_key)
    decision_client_ids: set[str] = field(default_factory=set)
    decision_groups: set[str] = field(default_factory=set)
    malformed: int = 0
    v1: int = 0
    partial_files: list[str] = field(default_factory=list)

    def merge(self, other: FleetTruth) -> None:
        self.events += other.events
        self.by_type.update(other.by_type)
        self.by_section.update(other.by_section)
        self.files += other.files
        self.instances += other.instances
        self.first_ts = min(self.first_ts, other.first_ts)
        self.last_ts = max(self.last_ts, other.last_ts)
        for kind, (group, members) in other.largest_group.items():
            if members > self.largest_group.get(kind, ("", 0))[1]:
                self.largest_group[kind] = (group, members)
        self.peak_tls_per_instance = max(self.peak_tls_per_instance, other.peak_tls_per_instance)
        self.peak_connections_per_instance = max(
            self.peak_connections_per_instance, other.peak_connections_per_instance
        )
        self.peak_per_ip = max(self.peak_per_ip, other.peak_per_ip)
        self.largest_request = max(self.largest_request, other.largest_request, key=lambda t: t[2])
        self.largest_response = max(self.largest_response, other.largest_response, key=lambda t: t[2])
        for kind, entry in other.longest.items():
            if entry[0] > self.longest.get(kind, (0, "", ""))[0]:
                self.longest[kind] = entry
        self.pool_high_water_marks += other.pool_high_water_marks
        self.decisions.update(other.decisions)
        self.decision_client_ids |= other.decision_client_ids
        self.decision_groups |= other.decision_groups
        self.malformed += other.malformed
        self.v1 += other.v1
        self.partial_files += other.partial_files


@dataclass(frozen=True)
class Client:
    client_id: str
    host: str
    producer: bool
    consumer: bool
    instances: tuple[int, ...]
    group: str | None
    transactional_id: str | None


def _clients(spec: FleetSpec) -> list[Client]:
    rng = random.Random(spec.seed)
    clients = []
    for k in range(spec.clients):
        service = SERVICES[k % len(SERVICES)]
        role = rng.random()
        producer, consumer = role < 0.7, role > 0.4
        home = k % spec.instances
        others = (home, (home + 1) % spec.instances) if rng.random() < 0.3 and spec.instances > 1 else (home,)
        group = f"{service}-group-{k % spec.groups}" if consumer else None
        txn = f"{service}-txn-{k}" if producer and rng.random() < 0.2 else None
        client_id = f"{service}-{'producer' if producer else 'consumer'}-{k}"
        if spec.planted and k == 0:
            client_id, producer, consumer, group = LONG_CLIENT_ID, True, False, None
        host = f"10.{(k >> 16) & 255}.{(k >> 8) & 255}.{k & 255}"
        clients.append(Client(client_id, host, producer, consumer, others, group, txn))
    return clients


def _group_kinds(spec: FleetSpec) -> dict[str, str]:
    """Every group id and its protocol (classic or KIP-848 consumer); the planted one is classic."""
    names = {c.group for c in _clients(spec) if c.group is not None}
    kinds = {g: ("consumer" if int(g.rsplit("-", 1)[1]) % 5 == 4 else "classic") for g in names}
    if spec.planted:
        kinds[BIG_GROUP] = "classic"
    return kinds


def _lognormal(rng: random.Random, median: float, sigma: float, cap: int) -> int:
    return max(1, min(cap, int(median * math.exp(rng.gauss(0.0, sigma)))))


class _Writer:
    """Rotated ``<instance>-<start>.jsonl`` files of one proxy."""

    def __init__(self, out: Path, instance: str, lines_per_file: int, truth: FleetTruth) -> None:
        self.out, self.instance, self.lines_per_file, self.truth = out, instance, lines_per_file, truth
        self._file: Any = None
        self._lines = 0

    def write(self, event: dict[str, Any]) -> None:
        if self._file is None or self._lines >= self.lines_per_file:
            self.close()
            path = self.out / f"{self.instance}-{int(event['ts'] * 1000)}.jsonl"
            self._file = path.open("w", encoding="utf-8")
            self.truth.files.append(path.name)
            self._lines = 0
        self._file.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._lines += 1
        t = self.truth
        t.events += 1
        t.by_type[event["type"]] += 1
        if event["type"] == "window":
            t.by_section[event["section"]] += 1
        t.first_ts = min(t.first_ts, event["ts"])
        t.last_ts = max(t.last_ts, event["ts"])

    def raw(self, line: str) -> None:
        assert self._file is not None
        self._file.write(line)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _instance_events(spec: FleetSpec, i: int, out: Path) -> FleetTruth:
    """Everything proxy ``i`` writes; one process per proxy."""
    rng = random.Random(spec.seed * 7919 + i)
    instance = f"proxy-{i:02d}"
    truth = FleetTruth(instances=[instance])
    writer = _Writer(out, instance, spec.lines_per_file, truth)
    clients = [c for c in _clients(spec) if i in c.instances]
    group_kinds = _group_kinds(spec)
    coordinated = sorted(g for g in group_kinds if hash_group(g) % spec.instances == i)
    base_size = {g: max(1, int(30 / (1 + rank) ** 0.7)) for rank, g in enumerate(coordinated)}
    members = dict(base_size)
    base: dict[str, Any] = {"schema_version": 2, "instance": instance}
    conn_seq = 0
    open_conns: dict[
        str, tuple[Client, str, bool, float, str]
    ] = {}  # conn id -> (client, address, tls, opened, listener)
    per_ip: Counter[str] = Counter()
    tls_now = 0  # TLS connections open now

    def open_conn(client: Client, ts: float) -> None:
        nonlocal conn_seq, tls_now
        conn_seq += 1
        conn_id = f"{instance}-c{conn_seq}"
        tls = rng.random() < 0.6
        listener = "external" if tls else "internal"
        address = f"{client.host}:{rng.randint(32768, 60999)}"
        open_conns[conn_id] = (client, address, tls, ts, listener)
        per_ip[client.host] += 1
        truth.peak_per_ip = max(truth.peak_per_ip, per_ip[client.host])
        tls_now += tls
        writer.write(
            {
                **base,
                "type": "connection",
                "ts": ts,
                "event": "open",
                "conn_id": conn_id,
                "listener": listener,
                "client_address": address,
                "tls": tls,
                # what a proxy's connection limits counted as they admitted it, itself included
                "open_connections": len(open_conns),
                "open_ssl_connections": tls_now if tls else None,
                "open_ip_connections": per_ip[client.host],
            }
        )

    def close_conn(conn_id: str, ts: float, reason: str) -> None:
        nonlocal tls_now
        client, address, tls, opened, listener = open_conns.pop(conn_id)
        per_ip[client.host] -= 1
        tls_now -= tls
        writer.write(
            {
                **base,
                "type": "connection",
                "ts": ts,
                "event": "close",
                "conn_id": conn_id,
                "listener": listener,
                "client_address": address,
                "tls": tls,
                "reason": reason,
                "duration_seconds": round(ts - opened, 3),
                "requests": rng.randint(1, 5000),
                "bytes_in": rng.randint(100, 10**8),
                "bytes_out": rng.randint(100, 10**8),
                "client_id": client.client_id,
            }
        )

    def tls_open() -> tuple[int, int]:
        return tls_now, len(open_conns) - tls_now

    start = spec.start + i * 0.37  # proxies' windows are not aligned to the same instant
    for client in clients:
        open_conn(client, start)
    for w in range(spec.windows):
        w_start = start + w * spec.window_seconds
        w_end = w_start + spec.window_seconds
        peak_tls, peak_plain = tls_open()
        opened = Counter[bool]()
        closed = Counter[bool]()
        # connection churn inside the window, in time order: an open, then a close
        for n in range(spec.churn):
            open_conn(rng.choice(clients), w_start + spec.window_seconds * (n + 0.5) / spec.churn)
            opened[open_conns[f"{instance}-c{conn_seq}"][2]] += 1
            t, p = tls_open()
            peak_tls, peak_plain = max(peak_tls, t), max(peak_plain, p)
            if len(open_conns) > len(clients):
                victim = rng.choice(list(open_conns))
                closed[open_conns[victim][2]] += 1
                reason = rng.choice(("client_closed", "client_closed", "idle"))
                close_conn(victim, w_start + spec.window_seconds * (n + 0.75) / spec.churn, reason)
        truth.peak_tls_per_instance = max(truth.peak_tls_per_instance, peak_tls)
        truth.peak_connections_per_instance = max(truth.peak_connections_per_instance, peak_tls + peak_plain)
        window = {**base, "type": "window", "ts": w_end, "window_start": w_start, "window_seconds": spec.window_seconds}
        for tls, listener, peak in ((True, "external", peak_tls), (False, "internal", peak_plain)):
            writer.write(
                {
                    **window,
                    "section": "connections",
                    "listener": listener,
                    "tls": tls,
                    "max_open": peak,
                    "opened": opened[tls],
                    "closed": closed[tls],
                }
            )
        # per client id and API
        for client in clients:
            apis = (PRODUCER_APIS if client.producer else ()) + (CONSUMER_APIS if client.consumer else ())
            for api in dict.fromkeys(apis):
                big_batch = spec.planted and client.client_id == LONG_CLIENT_ID and api == "produce" and w == 1
                if rng.random() < 0.15 and not big_batch:
                    continue
                (rq_med, rq_sig), (rs_med, rs_sig) = SIZES[api]
                requests = max(1, int(200 * math.exp(rng.gauss(0, 1.0))))
                max_rq = 5 * 1024 * 1024 if big_batch else _lognormal(rng, rq_med * 2, rq_sig, MAX_REQUEST)
                max_rs = _lognormal(rng, rs_med * 2, rs_sig, MAX_RESPONSE)
                writer.write(
                    {
                        **window,
                        "section": "client_api",
                        "listener": "external",
                        "client_id": client.client_id,
                        "api": api,
                        "requests": requests,
                        "bytes_in": requests * max(1, max_rq // 3),
                        "bytes_out": requests * max(1, max_rs // 3),
                        "max_request_bytes": max_rq,
                        "max_response_bytes": max_rs,
                    }
                )
                if max_rq > truth.largest_request[2]:
                    truth.largest_request = (client.client_id, api, max_rq)
                if max_rs > truth.largest_response[2]:
                    truth.largest_response = (client.client_id, api, max_rs)
            # longest identifiers per kind, half of the windows
            if rng.random() < 0.5 or (spec.planted and client.client_id == LONG_CLIENT_ID):
                idents = [("client_id", client.client_id)]
                if client.group is not None:
                    idents.append(("group_id", client.group))
                    idents.append(("classic_member_id", f"{client.client_id}-{rng.getrandbits(128):032x}"))
                if client.transactional_id is not None:
                    idents.append(("transactional_id", client.transactional_id))
                for kind, value in idents:
                    writer.write(
                        {
                            **window,
                            "section": "identifier",
                            "client_id": client.client_id,
                            "identifier_kind": kind,
                            "max_length": len(value),
                            "identifier": value[:300],
                        }
                    )
                    if len(value) > truth.longest.get(kind, (0, "", ""))[0]:
                        truth.longest[kind] = (len(value), client.client_id, value)
        # group sizes
        for g in coordinated:
            members[g] = max(1, min(base_size[g] * 2, members[g] + rng.choice((-1, 0, 0, 1))))
            size = members[g]
            if spec.planted and g == BIG_GROUP:
                size = BIG_GROUP_PEAK if w == spec.windows // 2 else 60 + (w % 10)
            writer.write(
                {**window, "section": "group", "group_id": g, "group_kind": group_kinds[g], "max_members": size}
            )
            kind = group_kinds[g]
            if size > truth.largest_group.get(kind, ("", 0))[1]:
                truth.largest_group[kind] = (g, size)
            if spec.planted and g == BIG_GROUP and size > CONFIGURED_GROUP_MAX_SIZE:
                for m in range(size - CONFIGURED_GROUP_MAX_SIZE):
                    joiner = rng.choice(clients)
                    writer.write(
                        {
                            **base,
                            "type": "decision",
                            "ts": w_start + 1 + m * 0.01,
                            "policy": "group_size",
                            "mode": "observe",
                            "action": "refuse",
                            "reason": "group_max_size_reached",
                            "limit_key": "group.max.size",
                            "limit": CONFIGURED_GROUP_MAX_SIZE,
                            "listener": "external",
                            "client_address": f"{joiner.host}:40000",
                            "client_id": joiner.client_id,
                            "api": "join_group",
                            "api_key": 11,
                            "api_version": 9,
                            "error_code": 81,
                            "group_id": g,
                        }
                    )
                    truth.decisions[("group_size", "group.max.size")] += 1
                    truth.decision_groups.add(g)
        # memory pool
        hwm = _lognormal(rng, 6_000_000, 0.8, 400_000_000)
        if spec.planted and i == 0 and w == spec.windows // 3:
            hwm = 260_000_000
        waits = 0 if hwm <= POOL_CAPACITY else rng.randint(5, 50)
        writer.write(
            {**window, "section": "pool", "capacity_bytes": POOL_CAPACITY, "high_water_mark_bytes": hwm, "waits": waits}
        )
        truth.pool_high_water_marks.append(hwm)
        for _ in range(waits):
            client = rng.choice(clients)
            writer.write(
                {
                    **base,
                    "type": "decision",
                    "ts": w_start + rng.random() * spec.window_seconds,
                    "policy": "memory_pool",
                    "mode": "enforce",
                    "action": "wait",
                    "reason": "pool_exhausted",
                    "limit_key": "queued.max.request.bytes",
                    "limit": POOL_CAPACITY,
                    "listener": "external",
                    "client_address": f"{client.host}:41000",
                    "client_id": client.client_id,
                    "api": "produce",
                    "api_key": 0,
                    "api_version": 9,
                    "size": rng.randint(10**5, 10**7),
                }
            )
            truth.decisions[("memory_pool", "queued.max.request.bytes")] += 1
            truth.decision_client_ids.add(client.client_id)
        # the long client id, refused in observe mode on some of its requests
        if spec.planted and any(c.client_id == LONG_CLIENT_ID for c in clients):
            long_client = next(c for c in clients if c.client_id == LONG_CLIENT_ID)
            writer.write(
                {
                    **base,
                    "type": "decision",
                    "ts": w_start + 2.5,
                    "policy": "identifier_limits",
                    "mode": "observe",
                    "action": "refuse",
                    "reason": "identifier_too_long",
                    "limit_key": "resource.identifier.max.length",
                    "limit": 249,
                    "listener": "external",
                    "client_address": f"{long_client.host}:42000",
                    "client_id": LONG_CLIENT_ID,
                    "api": "produce",
                    "api_key": 0,
                    "api_version": 9,
                    "error_code": 42,
                    "identifier_kind": "client_id",
                    "identifier_length": len(LONG_CLIENT_ID),
                    "identifier": LONG_CLIENT_ID,
                    "breaches": [
                        {"kind": "client_id", "path": "client_id", "length": len(LONG_CLIENT_ID), "limit": 249}
                    ],
                }
            )
            truth.decisions[("identifier_limits", "resource.identifier.max.length")] += 1
            truth.decision_client_ids.add(LONG_CLIENT_ID)
    writer.close()
    _damage(spec, i, out, truth, rng)
    return truth


def _damage(spec: FleetSpec, i: int, out: Path, truth: FleetTruth, rng: random.Random) -> None:
    """Append malformed and version-1 lines to proxy ``i``'s files; leave the last one half-written."""
    mine = [f for f in truth.files if f.startswith(f"proxy-{i:02d}-")]

    def share(n: int) -> int:
        return n // spec.instances + (1 if i < n % spec.instances else 0)

    with (out / mine[0]).open("a", encoding="utf-8") as f:
        for n in range(share(spec.malformed_lines)):
            f.write(("{not json at all\n", "[1, 2, 3]\n", '{"schema_version": 2, "ts": "soon"}\n')[n % 3])
            truth.malformed += 1
        for _ in range(share(spec.v1_lines)):
            f.write(
                json.dumps(
                    {
                        "schema_version": 1,
                        "ts": spec.start,
                        "type": "identifier_breach",
                        "client_id": "old-format",
                        "length": rng.randint(1, 300),
                    }
                )
                + "\n"
            )
            truth.v1 += 1
    if spec.partial_file and i == 0:
        with (out / mine[-1]).open("a", encoding="utf-8") as f:
            f.write('{"schema_version":2,"type":"window","ts":')  # the writer is in the middle of a line
        truth.partial_files.append(mine[-1])


def hash_group(group: str) -> int:
    """A stable hash (Python's own is salted per process): which proxy coordinates a group."""
    return sum((n + 1) * ord(ch) for n, ch in enumerate(group))


def generate(spec: FleetSpec, out: Path, workers: int = 1) -> FleetTruth:
    """Write the fleet's files into ``out`` (created) and return their ground truth."""
    out.mkdir(parents=True, exist_ok=True)
    truth = FleetTruth()
    if workers <= 1:
        parts: Iterator[FleetTruth] = (_instance_events(spec, i, out) for i in range(spec.instances))
        for part in parts:
            truth.merge(part)
    else:
        with ProcessPoolExecutor(workers) as pool:
            for part in pool.map(
                _instance_events, [spec] * spec.instances, range(spec.instances), [out] * spec.instances
            ):
                truth.merge(part)
    return truth


def events_per_window(spec: FleetSpec) -> tuple[float, float]:
    """(events at start, events per window) across the fleet, from dry runs of 2 and 4 windows."""
    import tempfile

    counts = []
    for windows in (2, 4):
        with tempfile.TemporaryDirectory() as tmp:
            dry = replace(spec, windows=windows, malformed_lines=0, v1_lines=0, partial_file=False)
            counts.append(generate(dry, Path(tmp)).events)
    per_window = (counts[1] - counts[0]) / 2
    return counts[0] - 2 * per_window, per_window


def spec_for_events(target: int, **overrides: Any) -> FleetSpec:
    """A spec whose fleet writes about ``target`` events (the window count is scaled)."""
    spec = FleetSpec(**overrides)
    fixed, per_window = events_per_window(spec)
    return replace(spec, windows=max(2, round((target - fixed) / per_window)))


def bench_fleet_spec(target: int) -> FleetSpec:
    """The fleet the report benchmarks read (this script's defaults): 20 proxies, 2,000 client
    ids, 400 groups, files of 200,000 lines, with malformed and schema v1 lines mixed in."""
    return spec_for_events(
        target,
        instances=20,
        clients=2000,
        groups=400,
        lines_per_file=200_000,
        churn=30,
        malformed_lines=100,
        v1_lines=100,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="directory to write the audit files into")
    parser.add_argument("--events", type=int, default=1_000_000, help="about this many events (default 1,000,000)")
    parser.add_argument("--instances", type=int, default=20, help="proxies (default 20)")
    parser.add_argument("--clients", type=int, default=2000, help="client ids (default 2000)")
    parser.add_argument("--groups", type=int, default=400, help="consumer groups (default 400)")
    parser.add_argument("--churn", type=int, default=30, help="connections opened per proxy and window (default 30)")
    parser.add_argument("--lines-per-file", type=int, default=200_000, help="rotate files after this many lines")
    parser.add_argument("--malformed", type=int, default=100, help="malformed lines to mix in (default 100)")
    parser.add_argument("--v1", type=int, default=100, help="schema_version 1 lines to mix in (default 100)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    spec = spec_for_events(
        args.events,
        instances=args.instances,
        clients=args.clients,
        groups=args.groups,
        lines_per_file=args.lines_per_file,
        churn=args.churn,
        malformed_lines=args.malformed,
        v1_lines=args.v1,
        partial_file=True,
        seed=args.seed,
    )
    started = time.monotonic()
    truth = generate(spec, args.out, workers=args.workers)
    size = sum(f.stat().st_size for f in args.out.iterdir())
    print(
        f"wrote {truth.events:,} events ({dict(truth.by_type)}) + {truth.malformed} malformed + {truth.v1} v1 lines "
        f"in {len(truth.files)} files, {size / 1e9:.2f} GB, {spec.instances} proxies x {spec.windows} windows, "
        f"in {time.monotonic() - started:.1f}s -> {args.out}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
