"""System calls and context switches per single-record round trip, for the process in the
middle of each path (``bench/proxy_vs_direct.py``'s paths): how many times the kernel
and the event loop are entered to forward one request and its response.

For each path, one at a time, with its own broker: warm-up round trips, then
``--round-trips`` single-record acks=1 produce round trips measured twice:

1. plain: the middle's CPU time and its time runnable but waiting for a CPU
   (schedstat), and its voluntary and involuntary context switches
   (/proc/PID/task/*/status), per round trip;
2. under ``strace -c -f -p PID`` (all threads): the calls of each system call
   (and how many failed, e.g. EAGAIN), per round trip. strace slows every call
   down, so only its counts are used, not its times.

    .venv/bin/python bench/syscalls_per_request.py                  # the floor variants, epoll, proxy-all
    .venv/bin/python bench/syscalls_per_request.py --paths floor,proxy --round-trips 2000
"""

from __future__ import annotations

import argparse
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from harness import BenchError, context_switches, load_average
from proxy_vs_direct import Endpoint, middle_paths, round_trips, started

DEFAULT_PATHS = "floor,floor-lowlevel,floor-socket,floor-stream,epoll,proxy,proxy-all"


def run_queue_seconds(pid: int) -> float:
    """Time the process's live threads spent runnable but waiting for a CPU (schedstat field 2)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        total += int((task / "schedstat").read_text().split()[1])
    return total / 1e9


def strace_counts(output: str) -> tuple[Counter[str], Counter[str]]:
    """Calls and errors by system call from ``strace -c`` output."""
    calls: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    for line in output.splitlines():
        fields = line.split()
        # % time, seconds, usecs/call, calls, [errors,] syscall
        if len(fields) >= 5 and fields[0][0].isdigit() and fields[-1] != "total":
            calls[fields[-1]] = int(fields[3])
            if len(fields) == 6:
                errors[fields[-1]] = int(fields[4])
    return calls, errors


def under_strace(
    endpoint: Endpoint, run: Callable[[int], list[float]], count: int, workdir: Path
) -> tuple[Counter[str], Counter[str]]:
    """System calls (and failed ones) by name while ``run(count)`` makes its round trips."""
    assert endpoint.middle is not None
    out = workdir / f"strace-{endpoint.middle.pid}.txt"
    strace = subprocess.Popen(
        ["strace", "-c", "-f", "-p", str(endpoint.middle.pid), "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.0)  # attached to every thread by then (it says "Process N attached" per thread)
    if strace.poll() is not None:
        raise BenchError(f"strace exited with {strace.returncode}: {strace.stderr.read() if strace.stderr else ''}")
    run(count)
    strace.send_signal(signal.SIGINT)  # detach and write the summary
    strace.wait(timeout=30)
    return strace_counts(out.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", default=DEFAULT_PATHS, help="comma-separated paths with a middle process")
    parser.add_argument("--round-trips", type=int, default=2000, help="round trips per measurement")
    parser.add_argument("--warmup", type=int, default=200, help="round trips before measuring")
    args = parser.parse_args(argv)
    paths = middle_paths(parser, args.paths, "strace")
    payload = random.randbytes(1024)
    print(f"load average {load_average()} at the start; {args.round_trips} single-record round trips per path")
    rows = [
        "| path | CPU us/rt | waiting for a CPU us/rt | context switches/rt | syscalls/rt | failed/rt "
        "| per round trip, by call |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    try:
        with tempfile.TemporaryDirectory(prefix="syscalls-") as tmp:
            for name in paths:
                with started([name]) as endpoints:
                    endpoint = endpoints[name]
                    assert endpoint.middle is not None
                    pid = endpoint.middle.pid
                    # one connection throughout: its set-up is in neither window
                    with round_trips(endpoint, payload) as run:
                        run(args.warmup)
                        switches, waited = sum(context_switches(pid)), run_queue_seconds(pid)
                        cpu = endpoint.middle.cpu_seconds()
                        run(args.round_trips)
                        cpu_rt = (endpoint.middle.cpu_seconds() - cpu) / args.round_trips * 1e6
                        switches = sum(context_switches(pid)) - switches
                        waited = run_queue_seconds(pid) - waited
                        calls, errors = under_strace(endpoint, run, args.round_trips, Path(tmp))
                n = args.round_trips
                by_call = ", ".join(
                    f"{call} {count / n:.2f}" + (f" ({errors[call] / n:.2f} failed)" if errors[call] else "")
                    for call, count in calls.most_common()
                    if count / n >= 0.05
                )
                rows.append(
                    f"| {name} | {cpu_rt:.0f} | {waited / n * 1e6:.0f} | {switches / n:.2f} "
                    f"| {sum(calls.values()) / n:.2f} "
                    f"| {sum(errors.values()) / n:.2f} | {by_call} |"
                )
                print(rows[-1], flush=True)
    except BenchError as exc:
        print(f"failed: {exc}", file=sys.stderr)
        return 1
    print(f"\nload average {load_average()} at the end\n")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
