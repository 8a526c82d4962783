"""Instructions per single-record round trip of the process in the middle of a path, counted
by valgrind's callgrind: a cost figure that, unlike CPU time, does not move with the
load of a shared machine (issue 15).

``perf stat -e instructions`` would be cheaper, but this machine's virtual CPU
has no hardware counters ("<not supported> instructions"), so the middle
process runs under ``valgrind --tool=callgrind --instr-atstart=no``: start-up
and warm-up run uninstrumented, then for each window ``callgrind_control``
switches instrumentation on, zeroes the counters, the client makes
``--round-trips`` single-record acks=1 produce round trips through the path,
and a dump gives the instructions executed in that window (user space only:
the kernel's share of each system call is not counted). A Python process runs
some 50-100 times slower under callgrind, so the counts are small (a few
hundred round trips take about a minute); they repeat within about 1% from
window to window.

    .venv/bin/python bench/instructions_per_request.py                     # floor, epoll, trio-epoll, proxy-all
    .venv/bin/python bench/instructions_per_request.py --paths proxy-all --round-trips 300 --windows 3

``--load produce`` counts bulk produce instead: per window, ``--megabytes`` of
1 KiB records pipelined by one producer in full 256 KiB batches (``linger.ms``
long enough that every batch fills, so a slowed middle sees the same requests),
and prints instructions per MB of record values.

    .venv/bin/python bench/instructions_per_request.py --load produce --paths stunnel,proxy-all-tls
"""

from __future__ import annotations

import argparse
import contextlib
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from harness import BenchError, load_average, process_tree
from proxy_vs_direct import _produce_all, _producer, middle_paths, round_trips, started

DEFAULT_PATHS = "floor,epoll,trio-epoll,proxy-all"


def callgrind_control(pid: int, *options: str) -> None:
    result = subprocess.run(["callgrind_control", *options, str(pid)], capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise BenchError(f"callgrind_control {' '.join(options)} {pid}: {result.stderr or result.stdout}")


def instructions_in(dump: Path) -> int:
    """Total instructions (Ir) of one callgrind dump."""
    match = re.search(r"^(?:summary|totals): (\d+)", dump.read_text(errors="replace"), re.MULTILINE)
    if match is None:
        raise BenchError(f"{dump}: no totals line")
    return int(match.group(1))


def count_windows(name: str, args: argparse.Namespace, workdir: Path) -> list[float]:
    """Instructions per round trip in each window, for one path."""
    out = workdir / name
    out.mkdir()
    wrap = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        "--dump-instr=no",
        "--trace-children=yes",  # a proxy with workers: N is a supervisor and its worker processes
        f"--callgrind-out-file={out}/callgrind.out.%p",
    ]
    payload = random.randbytes(1024)
    per_unit = []
    unit, per = ("round trip", args.round_trips) if args.load == "round-trips" else ("MB", args.megabytes)
    with started([name], wrap=wrap) as endpoints:
        endpoint = endpoints[name]
        assert endpoint.middle is not None
        # one connection for all windows: its set-up (accept, ApiVersions, Metadata) is not counted
        with load(endpoint, payload, args) as run:
            run(args.warmup)
            pids = process_tree(endpoint.middle.pid)  # every process of the middle, summed
            for pid in pids:
                callgrind_control(pid, "--instr=on")
            run(args.warmup)  # code paths instrumented once
            for window in range(args.windows):
                for pid in pids:
                    callgrind_control(pid, "--zero")
                run(per)
                total = 0
                for pid in pids:
                    callgrind_control(pid, f"--dump=window{window}")
                    dumps = sorted(out.glob(f"callgrind.out.{pid}.*"), key=lambda p: p.stat().st_mtime)
                    if not dumps:
                        raise BenchError(f"{name}: callgrind wrote no dump of process {pid} in {out}")
                    total += instructions_in(dumps[-1])
                per_unit.append(total / per)
                print(f"{name:<14} window {window + 1}: {per_unit[-1]:,.0f} instructions per {unit}", flush=True)
    return per_unit


@contextlib.contextmanager
def load(endpoint: Any, payload: bytes, args: argparse.Namespace) -> Iterator[Callable[[int], object]]:
    """``run(n)``: n single-record round trips, or n MB of pipelined 1 KiB records."""
    if args.load == "round-trips":
        with round_trips(endpoint, payload) as run:
            yield run
        return
    config = {"acks": "1", "linger.ms": 1000, "batch.size": 256 * 1024, "batch.num.messages": 1_000_000}
    with _producer(endpoint, **config) as (producer, deliveries):

        def produce(megabytes: int) -> None:
            _produce_all(producer, payload, megabytes * 1_000_000 // len(payload), "produce")
            deliveries.check("produce")

        yield produce


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", default=DEFAULT_PATHS, help="comma-separated paths with a middle process")
    parser.add_argument("--round-trips", type=int, default=200, help="round trips per window")
    parser.add_argument("--windows", type=int, default=2, help="windows counted per path")
    parser.add_argument("--warmup", type=int, default=None, help="round trips (50) or MB (2) before counting")
    parser.add_argument("--load", choices=["round-trips", "produce"], default="round-trips")
    parser.add_argument("--megabytes", type=int, default=20, help="MB of records per window (--load produce)")
    args = parser.parse_args(argv)
    paths = middle_paths(parser, args.paths, "valgrind", "callgrind_control")
    began = time.monotonic()
    if args.warmup is None:
        args.warmup = 50 if args.load == "round-trips" else 2
    what = f"{args.round_trips} round trips" if args.load == "round-trips" else f"{args.megabytes} MB produced"
    print(f"load average {load_average()}; {args.windows} windows of {what} per path")
    unit = "round trip" if args.load == "round-trips" else "MB produced"
    rows = [f"| path | instructions per {unit} (median of windows) | windows |", "|---|---:|---|"]
    try:
        with tempfile.TemporaryDirectory(prefix="callgrind-") as tmp:
            for name in paths:
                counts = count_windows(name, args, Path(tmp))
                counts_text = ", ".join(f"{c:,.0f}" for c in counts)
                rows.append(f"| {name} | {sorted(counts)[len(counts) // 2]:,.0f} | {counts_text} |")
    except BenchError as exc:
        print(f"failed: {exc}", file=sys.stderr)
        return 1
    print(f"\n{time.monotonic() - began:.0f}s in all\n")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
