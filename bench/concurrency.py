"""Round trips per second and the middle's CPU per round trip when C connections each keep
one small request in flight (issue 28), for C = 1, 16, 128 and 1,024.

Two loads, each on every connection of a path: a Fetch answered at once (the first
record batch of ``bench-fetch``, one record of ``--record-size`` bytes) and a Produce of one
record with acks=1 (v9, one v2 record batch). Every connection sends its next request as
soon as its response is whole: C requests are in flight all the time. The paths and their
brokers are ``bench/proxy_vs_direct.py``'s (one fresh Tansu per path, started once,
topics created through the path); add ``trio-epoll-budget`` and ``trio-epoll-blocking``
for the variants of ``bench/trio_epoll_forwarder.py``.

The client is lean, so that it is not the bottleneck: raw sockets (TCP_NODELAY) to the
address the metadata names, requests encoded once, one ``select.epoll`` loop per client
process (``--client-processes``, forked; the connections split among them). A
measurement: the path's C connections are opened, each load runs ``--warmup`` seconds
unmeasured, then ``--seconds`` measured; after that no new request is sent and the
requests still in flight are awaited and counted, so the middle's CPU from the start to
the last response belongs to the round trips counted. The middle's CPU is the CPU time of
all its threads (``/proc/PID/task/*/schedstat``), and its waits per round trip are its
voluntary context switches (``/proc/PID/task/*/status``): how often it found nothing to
do and blocked (in ``epoll_wait``, for these middles). With one connection that is 2 per
round trip (the request, the response); near 0 when the middle never runs out of work,
busy or waiting for a CPU on a loaded machine. They count the process's waits, not trio's
task switches. The client's CPU is that of its processes (``time.process_time``), shown
beside it as a share of one core.

Paths and C are interleaved: each round goes through every C, and for each C through
every path in an order rotated each round; each figure is the median over rounds, its
spread the lowest and highest round, and "vs direct" the median over rounds of that
round's ratio to direct (load that drifts between rounds hits a round's paths alike).
Before round 1 every path runs each load for ``--warmup-path`` seconds at 16
connections (Kroxylicious's JIT).

With ``--middle-cpus LIST`` the middle runs on those CPUs (``taskset -c``) and the bench, its
brokers and its clients on the others, so that the middle's cores are its own (issue 29's
saturation figures: round trips per second per core of the middle).

With ``--rate R`` every path is offered the same R round trips a second on a fixed schedule
(split over the client processes by their connections; a connection still has at most one
request in flight), so that the middles' CPU per round trip compares at the same load, not
at the rate each reaches when it sends as fast as it is answered (issue 29's workers: 1
against workers: 2). Rounds served below 98% of R are listed after the tables.

    .venv/bin/python bench/concurrency.py                       # every default path, 3 rounds
    .venv/bin/python bench/concurrency.py --paths direct,floor,trio-epoll --connections 1,128 --rounds 2
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import select
import socket
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from harness import (
    BenchError,
    KafkaSocket,
    context_switches,
    fetch_frame,
    fetch_high_watermark,
    load_average,
    process_tree,
    produce_error_code,
    produce_frame,
)
from proxy_vs_direct import (
    FETCH_TOPIC,
    FETCH_TOPIC_RECORDS,
    STARTERS,
    TOPIC,
    Endpoint,
    run_bench,
    started,
)

DEFAULT_PATHS = "direct,floor,epoll,trio-epoll,proxy-all,haproxy,kroxylicious"
DEFAULT_CONNECTIONS = "1,16,128,1024"
LOADS = ("fetch", "produce")
STALL_S = 10.0  # no response on any connection for this long: the path is stuck
SHORT_OF_RATE = 0.98  # --rate: a round served below this share of the offered rate is not the same load
FD_SPARE = 64  # descriptors besides the connections: the bench's own, its logs and pipes


def tree_waits(pid: int) -> int:
    """Voluntary context switches of the middle's processes (one, or a supervisor and its workers)."""
    return sum(context_switches(p)[0] for p in process_tree(pid))


# --- the client ----------------------------------------------------------------------------


def open_connections(address: tuple[str, int], count: int) -> list[socket.socket]:
    socks = []
    try:
        for _ in range(count):
            sock = socket.create_connection(address, timeout=10)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            socks.append(sock)
    except OSError as exc:
        for sock in socks:
            sock.close()
        raise BenchError(f"connection {len(socks) + 1} of {count} to {address}: {exc}") from None
    return socks


def drive(socks: list[socket.socket], frame: bytes, seconds: float, rate: float | None = None) -> int:
    """Keep ``frame`` in flight on every socket for ``seconds``, then await the last responses;
    the number of round trips made (responses are not decoded: only their length is read).

    With ``rate`` (requests a second), requests leave on a fixed schedule instead: a socket whose
    response is whole waits in a queue for the next slot, still one request in flight at most."""
    epoll = select.epoll()
    by_fd = {sock.fileno(): sock for sock in socks}
    received = {fd: bytearray() for fd in by_fd}
    view = memoryview(bytearray(1 << 16))
    try:
        for fd in by_fd:
            epoll.register(fd, select.EPOLLIN)
        clock = time.monotonic
        deadline = clock() + seconds
        size = len(frame)
        interval = 1 / rate if rate else 0.0
        idle: deque[socket.socket] = deque(socks)  # sockets with no request in flight
        next_at = clock()
        in_flight = count = 0
        poll = epoll.poll

        def send_due(now: float) -> None:
            nonlocal next_at, in_flight
            while idle and next_at <= now:
                if idle.popleft().send(frame) != size:  # no request in flight: the buffer is empty
                    raise BenchError("a request did not fit the socket's empty send buffer")
                in_flight += 1
                next_at += interval

        send_due(clock())
        while in_flight or idle:
            if clock() >= deadline:
                idle.clear()  # no new request: await those in flight
                if not in_flight:
                    break
            wait = max(next_at - clock(), 0.0) if idle else STALL_S
            ready = poll(min(wait, STALL_S))
            if not ready and not idle:
                raise BenchError(f"no response for {STALL_S:.0f}s with {in_flight} requests in flight")
            for fd, _ in ready:
                n = by_fd[fd].recv_into(view)
                if n == 0:
                    raise BenchError("the path closed a connection")
                buffer = received[fd]
                buffer += view[:n]
                if len(buffer) < 4 or len(buffer) < 4 + int.from_bytes(buffer[:4], "big"):
                    continue
                buffer.clear()  # one request in flight: one response, nothing after it
                count += 1
                in_flight -= 1
                idle.append(by_fd[fd])
            now = clock()
            if now < deadline:
                send_due(now)
        return count
    finally:
        epoll.close()


def client_process(pipe: Connection, address: tuple[str, int], count: int) -> None:
    """One client process: ``count`` connections, then loads as the parent sends them."""
    try:
        socks = open_connections(address, count)
        pipe.send("ready")
        while (job := pipe.recv()) is not None:
            frame, warmup, seconds, rate = job
            drive(socks, frame, warmup, rate)
            pipe.send("warm")
            pipe.recv()  # go
            cpu = time.process_time()
            round_trips = drive(socks, frame, seconds, rate)
            pipe.send((round_trips, time.process_time() - cpu))
        for sock in socks:
            sock.close()
    except (BenchError, OSError) as exc:
        pipe.send(f"{type(exc).__name__}: {exc}")


@dataclass
class Sample:
    """One measurement: a load on C connections of one path."""

    round_trips: int
    seconds: float
    middle_cpu: float | None
    middle_waits: int | None  # the middle's voluntary context switches: its threads blocked
    client_cpu: float

    @property
    def rate(self) -> float:
        return self.round_trips / self.seconds


class Clients:
    """The client processes holding a path's C connections; ``measure`` runs one load."""

    def __init__(self, endpoint: Endpoint, connections: int, processes: int) -> None:
        self.endpoint = endpoint
        context = multiprocessing.get_context("fork")
        shares = [connections // processes + (i < connections % processes) for i in range(processes)]
        self.pipes: list[Connection] = []
        self.processes = []
        self.shares = [s / connections for s in shares if s]
        for share in (s for s in shares if s):
            parent, child = context.Pipe()
            process = context.Process(target=client_process, args=(child, endpoint.advertised, share))
            process.start()
            self.pipes.append(parent)
            self.processes.append(process)
        self._expect("ready")

    def _answers(self) -> list[object]:
        answers = []
        for pipe in self.pipes:
            if not pipe.poll(120):
                raise BenchError("a client process did not answer in 120s")
            answers.append(pipe.recv())
        return answers

    def _expect(self, word: str) -> None:
        for answer in self._answers():
            if answer != word:
                raise BenchError(f"client: {answer}")

    def measure(self, frame: bytes, warmup: float, seconds: float, rate: float | None) -> Sample:
        for pipe, share in zip(self.pipes, self.shares, strict=True):
            pipe.send((bytes(frame), warmup, seconds, rate * share if rate else None))
        self._expect("warm")
        middle = self.endpoint.middle
        middle_before = middle.cpu_seconds() if middle else 0.0
        waits_before = tree_waits(middle.pid) if middle else 0
        started_at = time.perf_counter()
        for pipe in self.pipes:
            pipe.send("go")
        answers = self._answers()
        elapsed = time.perf_counter() - started_at
        middle_cpu = middle.cpu_seconds() - middle_before if middle else None
        middle_waits = tree_waits(middle.pid) - waits_before if middle else None
        for answer in answers:
            if not isinstance(answer, tuple):
                raise BenchError(f"client: {answer}")
        if middle is not None:
            middle.check_running(" during the run")
        return Sample(
            sum(a[0] for a in answers),
            elapsed,
            middle_cpu,
            middle_waits,
            sum(a[1] for a in answers),  # type: ignore[index]
        )

    def close(self) -> None:
        for pipe in self.pipes:
            try:
                pipe.send(None)
            except OSError:
                pass
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.kill()


# --- the run -------------------------------------------------------------------------------


def check_answers(endpoint: Endpoint, frames: dict[str, bytes]) -> None:
    """One round trip of each load through the path, its answer decoded: no error, the records there."""
    conn = KafkaSocket(endpoint.advertised)
    try:
        if fetch_high_watermark(conn.round_trip(frames["fetch"])) != FETCH_TOPIC_RECORDS:
            raise BenchError(f"fetch: {FETCH_TOPIC} does not hold {FETCH_TOPIC_RECORDS} records")
        if code := produce_error_code(conn.round_trip(frames["produce"])):
            raise BenchError(f"produce: error code {code}")
    finally:
        conn.close()


@dataclass
class Cell:
    """One path, load and C: a sample per round."""

    samples: list[Sample] = field(default_factory=list)

    def medians(self, measure: Callable[[Sample], float | None]) -> tuple[float, float, float] | None:
        values = [v for s in self.samples if (v := measure(s)) is not None]
        return (statistics.median(values), min(values), max(values)) if values else None


def middle_us(s: Sample) -> float | None:
    return None if s.middle_cpu is None else s.middle_cpu / s.round_trips * 1e6


def middle_waits(s: Sample) -> float | None:
    return None if s.middle_waits is None else s.middle_waits / s.round_trips


def client_us(s: Sample) -> float:
    return s.client_cpu / s.round_trips * 1e6


def client_share(s: Sample) -> float:
    return s.client_cpu / s.seconds


def rate(s: Sample) -> float:
    return s.rate


def versus_direct(cell: Cell, direct: Cell | None) -> str:
    if direct is None or len(direct.samples) != len(cell.samples):
        return "-"
    return f"{statistics.median(s.rate / d.rate for s, d in zip(cell.samples, direct.samples, strict=True)):.2f}x"


def spread(values: tuple[float, float, float] | None, spec: str) -> tuple[str, str]:
    if values is None:
        return "-", "-"
    middle, low, high = values
    return format(middle, spec), f"{format(low, spec)}-{format(high, spec)}"


def tables(cells: dict[tuple[str, int, str], Cell], paths: list[str], connections: list[int]) -> str:
    out = []
    for load in LOADS:
        out.append(f"\n{load}: round trips per second (vs direct), middle CPU us per round trip\n")
        out.append("| path | " + " | ".join(f"C={c:,}" for c in connections) + " |")
        out.append("|---|" + "---:|" * len(connections))
        for path in paths:
            row = []
            for c in connections:
                cell, direct = cells[path, c, load], cells.get(("direct", c, load))
                rt, _ = spread(cell.medians(rate), ",.0f")
                cpu, _ = spread(cell.medians(middle_us), ".0f")
                versus = versus_direct(cell, direct) if path != "direct" else "1x"
                row.append(f"{rt} ({versus}), {cpu} us" if cpu != "-" else f"{rt} ({versus})")
            out.append(f"| {path} | " + " | ".join(row) + " |")
    out.append("\nEvery measurement: median over rounds and the lowest-highest round\n")
    out.append(
        "| load | C | path | round trips/s | range | vs direct | middle CPU us/rt | range "
        "| middle waits/rt | client CPU us/rt | client CPU, cores |"
    )
    out.append("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for load in LOADS:
        for c in connections:
            for path in paths:
                cell = cells[path, c, load]
                rt, rt_range = spread(cell.medians(rate), ",.0f")
                cpu, cpu_range = spread(cell.medians(middle_us), ".1f")
                waits, _ = spread(cell.medians(middle_waits), ".2f")
                client, _ = spread(cell.medians(client_us), ".1f")
                share, _ = spread(cell.medians(client_share), ".2f")
                versus = versus_direct(cell, cells.get(("direct", c, load))) if path != "direct" else "-"
                out.append(
                    f"| {load} | {c:,} | {path} | {rt} | {rt_range} | {versus} | {cpu} | {cpu_range} "
                    f"| {waits} | {client} | {share} |"
                )
    return "\n".join(out)


def pin_middle(cpus: str) -> list[str]:
    """The command prefix that runs a middle on ``cpus``; this process (and so the brokers and
    clients it starts) moves to the CPUs left."""
    middle = {int(c) for c in cpus.split(",")}
    rest = os.sched_getaffinity(0) - middle
    if not middle <= os.sched_getaffinity(0) or not rest:
        raise BenchError(f"--middle-cpus {cpus}: needs CPUs of {sorted(os.sched_getaffinity(0))}, leaving one")
    os.sched_setaffinity(0, rest)
    return ["taskset", "-c", cpus]


def raise_fd_limit(connections: int, processes: int) -> None:
    """Enough descriptors for the clients and the middles (which inherit the limit): a middle
    holds two per connection."""
    need = 2 * connections + FD_SPARE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            raise BenchError(f"{connections} connections need {need} file descriptors; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--paths", default=DEFAULT_PATHS, help=f"comma-separated, from {', '.join(STARTERS)}")
    parser.add_argument("--connections", default=DEFAULT_CONNECTIONS, help="comma-separated values of C")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0, help="measured seconds per load, path, C and round")
    parser.add_argument("--warmup", type=float, default=0.3, help="unmeasured seconds before each measurement")
    parser.add_argument(
        "--warmup-path", type=float, default=3.0, help="seconds of each load per path at 16 connections before round 1"
    )
    parser.add_argument(
        "--middle-cpus",
        default=None,
        help="CPUs of the middle (taskset -c), e.g. 2,3; the bench, brokers and clients get the rest",
    )
    parser.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="client processes sharing the connections (at most one per connection)",
    )
    parser.add_argument("--record-size", type=int, default=100, help="bytes of the record fetched and produced")
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="round trips a second offered on each path (a fixed schedule, at most one request in flight "
        "per connection) instead of sending each request as the last response arrives",
    )
    args = parser.parse_args(argv)
    args.paths = [p for p in args.paths.split(",") if p]
    unknown = [p for p in args.paths if p not in STARTERS]
    if unknown:
        parser.error(f"unknown path(s) {', '.join(unknown)}; choose from {', '.join(STARTERS)}")
    if any(p in ("stunnel", "proxy-all-tls") for p in args.paths):
        parser.error("the TLS paths are not measured here (the client speaks plaintext)")
    try:
        args.connections = [int(c) for c in args.connections.split(",") if c]
    except ValueError:
        parser.error(f"--connections: not numbers: {args.connections!r}")
    if not args.connections or min(args.connections) < 1:
        parser.error("--connections: each C must be at least 1")
    for name in ("rounds", "client_processes", "record_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.rate is not None and args.rate <= 0:
        parser.error("--rate must be positive")
    if args.seconds <= 0 or args.warmup < 0 or args.warmup_path < 0:
        parser.error("--seconds must be positive, the warm-ups not negative")
    return args


def measure(
    endpoint: Endpoint,
    connections: int,
    args: argparse.Namespace,
    frames: dict[str, bytes],
    warmup: float,
    seconds: float,
) -> dict[str, Sample]:
    clients = Clients(endpoint, connections, min(args.client_processes, connections))
    try:
        return {load: clients.measure(frames[load], warmup, seconds, args.rate) for load in LOADS}
    finally:
        clients.close()


def run(args: argparse.Namespace) -> int:
    raise_fd_limit(max(args.connections), args.client_processes)
    frames = {
        "fetch": bytes(fetch_frame(FETCH_TOPIC, 0, 1)),  # at least one batch: the first record
        "produce": bytes(produce_frame(TOPIC, os.urandom(args.record_size))),
    }
    paths, cs = args.paths, args.connections
    print(
        f"{args.rounds} rounds x {len(paths)} paths x C in {cs} x {', '.join(LOADS)}, {args.seconds:g}s each, "
        f"{args.client_processes} client process(es), "
        f"{f'{args.rate:,.0f} round trips/s offered' if args.rate else 'each request sent as the last is answered'}, "
        f"{os.cpu_count()} CPUs, load average {load_average()} at the start",
        flush=True,
    )
    began = time.monotonic()
    cells = {(p, c, load): Cell() for p in paths for c in cs for load in LOADS}
    wrap = pin_middle(args.middle_cpus) if args.middle_cpus else None
    with started(paths, wrap=wrap, record_size=args.record_size) as endpoints:
        for path in paths:
            check_answers(endpoints[path], frames)
            if args.warmup_path:
                measure(endpoints[path], 16, args, frames, 0, args.warmup_path)
        for round_no in range(args.rounds):
            shift = round_no % len(paths)
            for c in cs:
                for path in paths[shift:] + paths[:shift]:
                    try:
                        samples = measure(endpoints[path], c, args, frames, args.warmup, args.seconds)
                    except BenchError as exc:
                        raise BenchError(f"path {path!r}, C={c}: {exc}") from None
                    line = []
                    for load, s in samples.items():
                        cells[path, c, load].samples.append(s)
                        cpu = f" {middle_us(s):5.1f} us" if s.middle_cpu is not None else ""
                        line.append(f"{load} {s.rate:8,.0f}/s{cpu} (client {client_share(s):.2f} cores)")
                    print(f"round {round_no + 1}/{args.rounds} C={c:<5} {path:<20} " + "  ".join(line), flush=True)
    print(f"\n{time.monotonic() - began:.0f}s in all; load average {load_average()} at the end")
    print(tables(cells, paths, cs))
    if args.rate:
        short = [
            f"{path} C={c} {load} ({min(s.rate for s in cell.samples):,.0f}/s)"
            for (path, c, load), cell in cells.items()
            if min(s.rate for s in cell.samples) < SHORT_OF_RATE * args.rate
        ]
        print(
            f"\nBelow {SHORT_OF_RATE:.0%} of the offered rate in some round (not the same load): {', '.join(short)}"
            if short
            else f"\nEvery round of every path served at least {SHORT_OF_RATE:.0%} of the offered rate."
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_bench(run, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
