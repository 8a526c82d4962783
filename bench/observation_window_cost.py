"""Cost per call of the observation-window bookkeeping (proxy/evidence/observation_window.py),
next to two floors measured the same way: an empty method call, and one dict
lookup with a tuple key plus one integer update. Keys are realistic: 3
listeners, 200 client ids, 12 APIs (7,200 client_api keys), group ids of 20-60
characters.

Two measures:
- nanoseconds per call (median of 7 loops of ``--calls`` calls): what a request
  pays, but noisy on a shared 2-core machine;
- with ``--instructions``: CPU instructions per call, counted by valgrind's
  callgrind (the difference between runs of 20,000 and 120,000 calls, so
  start-up cancels out): repeatable run to run.

    .venv/bin/python bench/observation_window_cost.py [--calls N] [--instructions]
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from proxy.config.model import Audit
from proxy.evidence.audit import AuditSink
from proxy.evidence.metrics import Metrics
from proxy.evidence.observation_window import ObservationWindow

LISTENERS = ["external", "internal", "replication"]
CLIENTS = [f"service-{n}-producer" for n in range(200)]
APIS = [
    "produce",
    "fetch",
    "metadata",
    "offset_commit",
    "heartbeat",
    "join_group",
    "sync_group",
    "find_coordinator",
    "list_offsets",
    "api_versions",
    "offset_fetch",
    "describe_configs",
]
REPEATS = 7
WORKLOAD = 20_000  # distinct argument tuples, cycled


def _empty(listener: str, client_id: str | None, api: str, size: int) -> None:
    pass


def _dict_floor() -> Callable[..., None]:
    table: dict[tuple[str, str | None, str], list[int]] = {}

    def call(listener: str, client_id: str | None, api: str, size: int) -> None:
        key = (listener, client_id, api)
        slot = table.get(key)
        if slot is None:
            slot = table[key] = [0]
        slot[0] += size

    return call


def cases() -> dict[str, tuple[Callable[..., None], list[tuple[Any, ...]]]]:
    rng = random.Random(7)
    requests = [
        (rng.choice(LISTENERS), rng.choice(CLIENTS), rng.choice(APIS), rng.randint(100, 1_000_000))
        for _ in range(WORKLOAD)
    ]
    identifiers = [("group_id", c, "consumer-group-" + "x" * rng.randint(5, 45)) for _, c, _, _ in requests]
    groups = [(f"group-{rng.randint(0, 500)}", "classic", rng.randint(1, 50)) for _ in range(WORKLOAD)]
    pool = [(rng.randint(0, 100_000_000), rng.random() < 0.01) for _ in range(WORKLOAD)]
    connections = [(rng.choice(LISTENERS), rng.random() < 0.5) for _ in range(WORKLOAD)]
    window = ObservationWindow(time.time(), pool_capacity_bytes=-1)
    return {
        "floor: empty function call": (_empty, requests),
        "floor: dict lookup, tuple key": (_dict_floor(), requests),
        "on_request": (window.on_request, requests),
        "on_response": (window.on_response, requests),
        "on_identifier (ASCII)": (window.on_identifier, identifiers),
        "on_group_size": (window.on_group_size, groups),
        "on_pool": (window.on_pool, pool),
        "on_connection_open": (window.on_connection_open, connections),
        "on_connection_close": (window.on_connection_close, connections),
    }


def run(fn: Callable[..., None], args: list[tuple[Any, ...]], calls: int) -> None:
    for i in range(calls):
        fn(*args[i % WORKLOAD])


def ns_per_call(fn: Callable[..., None], args: list[tuple[Any, ...]], calls: int) -> float:
    runs = []
    for _ in range(REPEATS):
        started = time.perf_counter_ns()
        run(fn, args, calls)
        runs.append((time.perf_counter_ns() - started) / calls)
    return statistics.median(runs)


def instructions(name: str, calls: int) -> int:
    """Instructions callgrind counts for a whole process running ``calls`` calls of ``name``."""
    out = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            __file__,
            "--one",
            name,
            "--calls",
            str(calls),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    found = re.search(r"Collected : (\d+)", out)
    assert found, out
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--instructions", action="store_true", help="also count instructions with callgrind")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # one case, once: what callgrind runs
    options = parser.parse_args()
    table = cases()
    if options.one:
        run(*table[options.one], options.calls)
        return
    counted = options.instructions and shutil.which("valgrind") is not None
    if options.instructions and not counted:
        print("valgrind not found (apt-get install valgrind): instructions not counted")
    print(f"{options.calls:,} calls per loop, median of {REPEATS} loops")
    print(f"{'call':34} {'ns/call':>8}" + (f" {'instructions/call':>18}" if counted else ""))
    for name, (fn, args) in table.items():
        line = f"{name:34} {ns_per_call(fn, args, options.calls):8.0f}"
        if counted:
            line += f" {(instructions(name, 120_000) - instructions(name, 20_000)) / 100_000:18.0f}"
        print(line)
    # Once per window, on the event loop: roll() and recording its rows (real sink, temp dir).
    window = ObservationWindow(time.time())
    run(window.on_request, table["on_request"][1], WORKLOAD)
    run(window.on_identifier, table["on_identifier (ASCII)"][1], WORKLOAD)
    started = time.perf_counter()
    rows = window.roll(time.time())
    rolled = time.perf_counter()
    with tempfile.TemporaryDirectory() as directory:
        sink = AuditSink(Audit(path=directory), Metrics())
        for row in rows:
            sink.record(row)
        recorded = time.perf_counter()
        sink.close()
    print(
        f"roll(): {len(rows):,} rows in {(rolled - started) * 1000:.1f} ms; "
        f"AuditSink.record() of them: {(recorded - rolled) * 1000:.1f} ms"
    )


if __name__ == "__main__":
    main()
