"""What each trio pattern on a request path costs, one operation at a time, measured in
isolation: the price list behind the floor forwarder (issue 15, "go under the floor").

Each pattern runs ``--iterations`` times inside one ``trio.run`` (or a bare
``select.epoll`` loop, for comparison). Two measures:

- time (default): microseconds per operation, the best of ``--repeats`` runs
  (the best, because other processes on a shared machine only ever add time);
- ``--instructions``: instructions per operation, counted by valgrind's
  callgrind: each pattern runs in a process of its own under callgrind
  (instrumentation switched on with ``callgrind_control`` after start-up),
  once with N and once with 2N operations, and the difference of the two
  counts divided by N is the cost of one operation (what a run itself costs
  cancels out). Repeatable to a few instructions; a few minutes for all.

    .venv/bin/python bench/trio_pattern_cost.py
    .venv/bin/python bench/trio_pattern_cost.py --instructions
"""

from __future__ import annotations

import argparse
import os
import re
import select
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio
import trio.testing

# --- the patterns: each does ``n`` operations -------------------------------------------------


def _nothing() -> None:
    pass


async def python_call(n: int) -> None:
    for _ in range(n):
        _nothing()


async def checkpoint(n: int) -> None:
    for _ in range(n):
        await trio.lowlevel.checkpoint()


async def cancel_scope(n: int) -> None:
    for _ in range(n):
        with trio.CancelScope():  # noqa: ASYNC100 - the cost of opening one is what is measured
            pass


async def cancel_scope_with_deadline(n: int) -> None:
    for _ in range(n):
        with trio.move_on_after(60):  # noqa: ASYNC100 - the cost of opening one is what is measured
            pass


async def current_time(n: int) -> None:
    for _ in range(n):
        trio.current_time()


async def event_created_and_set(n: int) -> None:
    for _ in range(n):
        trio.Event().set()


async def wake_another_task(n: int) -> None:
    """One operation: a task wakes a parked task and parks itself until woken back (one task
    switch without I/O; two per loop, so ``n // 2`` loops)."""
    lots = trio.lowlevel.ParkingLot(), trio.lowlevel.ParkingLot()

    async def player(mine: trio.lowlevel.ParkingLot, other: trio.lowlevel.ParkingLot, first: bool) -> None:
        for _ in range(n // 2):
            if first:
                other.unpark()
                await mine.park()
            else:
                await mine.park()
                other.unpark()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(player, lots[1], lots[0], False)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(player, lots[0], lots[1], True)


async def memory_channel_message(n: int) -> None:
    send, receive = trio.open_memory_channel[bytes](1)

    async def consumer() -> None:
        for _ in range(n):
            await receive.receive()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consumer)
        for _ in range(n):
            await send.send(b"x")


def _socketpair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    return a, b


async def socket_wakeup_lowlevel(n: int) -> None:
    """One operation: a message crosses a socketpair and wakes the task waiting for it, the
    floor's pattern (plain non-blocking send / recv, ``wait_readable`` only to wait)."""
    a, b = _socketpair()

    async def echo(sock: socket.socket, count: int, first: bool) -> None:
        if first:
            sock.send(b"x" * 100)
        for _ in range(count):
            await trio.lowlevel.wait_readable(sock)
            sock.recv(65536)
            sock.send(b"x" * 100)

    with a, b:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(echo, b, n // 2, False)
            nursery.start_soon(echo, a, n // 2, True)


async def socket_wakeup_stream(n: int) -> None:
    """The same message ping-pong through ``trio.SocketStream`` (``receive_some`` / ``send_all``)."""
    a, b = trio.socket.socketpair()
    streams = trio.SocketStream(a), trio.SocketStream(b)

    async def echo(stream: trio.SocketStream, count: int, first: bool) -> None:
        if first:
            await stream.send_all(b"x" * 100)
        for _ in range(count):
            await stream.receive_some(65536)
            await stream.send_all(b"x" * 100)

    async with streams[0], streams[1], trio.open_nursery() as nursery:
        nursery.start_soon(echo, streams[1], n // 2, False)
        nursery.start_soon(echo, streams[0], n // 2, True)


def socket_wakeup_epoll(n: int) -> None:
    """The same message ping-pong in a bare level-triggered ``select.epoll`` loop."""
    a, b = _socketpair()
    with a, b, select.epoll() as epoll:
        epoll.register(a.fileno(), select.EPOLLIN)
        epoll.register(b.fileno(), select.EPOLLIN)
        socks = {a.fileno(): a, b.fileno(): b}
        a.send(b"x" * 100)
        done = 0
        while done < n:
            for fd, _ in epoll.poll():
                sock = socks[fd]
                sock.recv(65536)
                sock.send(b"x" * 100)
                done += 1


def _metric_pair() -> tuple[Callable[[], None], Callable[[], None]]:
    from prometheus_client import CollectorRegistry, Counter

    counter = Counter("bench_requests", "requests", ["listener", "api"], registry=CollectorRegistry())
    child = counter.labels("bench", "produce")
    return (lambda: counter.labels("bench", "produce").inc()), child.inc


async def metric_labels_then_inc(n: int) -> None:
    by_labels, _ = _metric_pair()
    for _ in range(n):
        by_labels()


async def metric_bound_child_inc(n: int) -> None:
    _, bound = _metric_pair()
    for _ in range(n):
        bound()


PATTERNS: dict[str, tuple[Callable[[int], Awaitable[None] | None], str]] = {
    "python-call": (python_call, "a call of an empty Python function, for scale"),
    "checkpoint": (checkpoint, "`await trio.lowlevel.checkpoint()`: one pass through the scheduler"),
    "cancel-scope": (cancel_scope, "`with trio.CancelScope(): pass`"),
    "cancel-scope-deadline": (cancel_scope_with_deadline, "`with trio.move_on_after(60): pass` (per-request deadline)"),
    "current-time": (current_time, "`trio.current_time()`"),
    "event": (event_created_and_set, "`trio.Event().set()` (an Event per response, no waiter)"),
    "wake-task": (wake_another_task, "wake a parked task (ParkingLot), it runs: one task switch, no I/O"),
    "memory-channel": (memory_channel_message, "one message through a memory channel to another task"),
    "socket-lowlevel": (
        socket_wakeup_lowlevel,
        "a message over a socketpair wakes the reader: send / `wait_readable` / recv (floor)",
    ),
    "socket-stream": (socket_wakeup_stream, "the same through `trio.SocketStream` `send_all` / `receive_some`"),
    "socket-epoll": (socket_wakeup_epoll, "the same in a bare `select.epoll` loop, no trio"),
    "metric-labels": (metric_labels_then_inc, "prometheus `counter.labels(a, b).inc()` per request"),
    "metric-bound": (metric_bound_child_inc, "prometheus `child.inc()`, the child bound once"),
}


def run_pattern(name: str, n: int) -> float:
    """Seconds for ``n`` operations of a pattern."""
    function = PATTERNS[name][0]
    started = time.perf_counter()
    if name == "socket-epoll":
        function(n)
    else:
        trio.run(function, n)  # type: ignore[arg-type]
    return time.perf_counter() - started


def callgrind_window(name: str, n: int) -> None:
    """Under callgrind (started with instrumentation off): one dump per run of n and 2n
    operations, instrumentation switched on and counters zeroed just before each run."""
    pid = str(os.getpid())

    def control(*options: str) -> None:
        subprocess.run(["callgrind_control", *options, pid], check=True, capture_output=True, timeout=120)

    run_pattern(name, n)  # imports and first-time paths, not counted
    control("--instr=on")
    for count in (n, 2 * n):
        control("--zero")
        run_pattern(name, count)
        control(f"--dump={count}")


def instructions(name: str, n: int, workdir: Path) -> float:
    """Instructions per operation: callgrind totals for 2n and n operations, differenced (what
    the run itself costs, ``trio.run`` included, cancels out)."""
    out = workdir / f"{name}.out"
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
            sys.executable,
            __file__,
            "--run",
            name,
            "--iterations",
            str(n),
        ],
        check=True,
        capture_output=True,
        timeout=900,
    )
    totals = []
    for dump in sorted(workdir.glob(f"{name}.out.*"), key=lambda p: p.stat().st_mtime):
        match = re.search(r"^(?:summary|totals): (\d+)", dump.read_text(errors="replace"), re.MULTILINE)
        assert match is not None, f"no totals in {dump}"
        totals.append(int(match.group(1)))
    if len(totals) != 2:
        raise RuntimeError(f"{name}: {len(totals)} callgrind dumps, expected 2")
    return (totals[1] - totals[0]) / n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--patterns", default=",".join(PATTERNS), help="comma-separated patterns")
    parser.add_argument("--iterations", type=int, default=20000, help="operations per run (time)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per pattern; the best counts (time)")
    parser.add_argument("--instructions", action="store_true", help="count instructions with callgrind")
    parser.add_argument("--run", help=argparse.SUPPRESS)  # one run, under callgrind
    args = parser.parse_args(argv)
    if args.run:
        callgrind_window(args.run, args.iterations)
        return 0
    names = [p for p in args.patterns.split(",") if p]
    unknown = [p for p in names if p not in PATTERNS]
    if unknown:
        parser.error(f"unknown pattern(s) {', '.join(unknown)}; choose from {', '.join(PATTERNS)}")
    unit = "instructions per operation" if args.instructions else "us per operation (best of runs)"
    print(f"| pattern | what one operation is | {unit} |\n|---|---|---:|", flush=True)
    with tempfile.TemporaryDirectory(prefix="trio-cost-") as tmp:
        for name in names:
            if args.instructions:
                figure = f"{instructions(name, 2000, Path(tmp)):,.0f}"
            else:
                run_pattern(name, 1000)  # imports, first-time paths
                best = min(run_pattern(name, args.iterations) for _ in range(args.repeats))
                figure = f"{best / args.iterations * 1e6:.2f}"
            print(f"| {name} | {PATTERNS[name][1]} | {figure} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
