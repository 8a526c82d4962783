"""How N worker processes should share one listening port (issue 29): each binding its own
socket with SO_REUSEPORT, all accepting on one socket they inherited from the supervisor, or the
supervisor accepting and handing each connection to a worker over a Unix socket (SCM_RIGHTS).

For each way (``--modes``), N (``--workers``, default 2 and 4) and round (``--rounds``,
alternated: every mode and N once, then again), a fresh supervisor process (a trio program)
starts N worker processes (trio programs serving a tiny echo the way the proxy serves: a plain
trio accept loop, a task per connection) and restarts any that dies:

  ``reuseport``   each worker binds its own listening socket on the port (SO_REUSEPORT): the
                  kernel spreads connections by a hash of their addresses;
  ``inherit``     the supervisor binds and listens once; every worker inherits the socket and
                  accepts on it (the classic prefork);
  ``handoff``     the supervisor accepts and sends each connection's fd to the worker with the
                  fewest live connections (handed minus closed, the closes read from the
                  workers' shared counters), over a SOCK_SEQPACKET socketpair (socket.send_fds'
                  SCM_RIGHTS, through trio's sendmsg);
  ``handoff-rr``  the same, round robin.

Load comes from separate client processes (``--clients``, trio, raw sockets); a request is 8
bytes, its answer the same 8 bytes and the serving worker's index. Measured per run:

1. set-up one at a time: ``--sequential`` connections, each connect, one round trip, close:
   latency p50/p99 (connect start to the first answer: the kernel's handshake, the accept or the
   hand-over, the worker's first read);
2. a storm: ``--storm`` such short connections, ``--concurrency`` at a time over the clients:
   connections per second, latency p50/p99, the CPU the workers and the supervisor spent per
   connection, the workers' wake-ups (voluntary context switches) per connection, and how many
   each worker accepted, from the workers' own counters (a shared file; each worker writes only
   its slot), checked against the worker index the clients read in the answers (the run fails
   when they differ);
3. long connections: ``--long`` connections opened, then each doing one round trip after
   another for ``--seconds``: round trips per second, and how the connections spread;
4. a worker's death while connections wait in the kernel: every worker is stopped (SIGSTOP),
   ``--waiting`` connections are opened and send a request (handoff: until the supervisor has
   handed all of them over), worker 0 is killed (SIGKILL), the supervisor restarts it (time
   from the kill until the new worker reports ready), the others continue: how many of the
   waiting connections are answered, reset or closed unanswered;
5. a worker's death in a storm: the storm again, worker 0 killed once a third of it is
   accepted: the short connections that failed, by kind (the dead worker's own connections fail in
   every mode; what differs is what waited for it).

With SO_REUSEPORT the connections waiting in a dead worker's queue are reset unless
``net.ipv4.tcp_migrate_req`` is 1 (Linux 5.14+), which moves them to another socket of the group;
the script prints it and leaves it as it is.

Everything shares this machine's cores (2 here): clients, workers and supervisor. Compare the
modes with each other in the same run, not with other tables.

    .venv/bin/python bench/workers_accept.py                         # about 3 minutes
    .venv/bin/python bench/workers_accept.py --workers 2 --rounds 1 --modes reuseport,handoff
"""

from __future__ import annotations

import argparse
import array
import contextlib
import ctypes
import json
import mmap
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any

import trio
from harness import HOST, BenchError, Service, context_switches, cpu_seconds, load_average

from demo.tansu import free_port

MODES = ("reuseport", "inherit", "handoff", "handoff-rr")
BACKLOG = 4096
REQUEST = b"12345678"
ANSWER_SIZE = len(REQUEST) + 1  # the request, then the worker's index
READY_TIMEOUT_S = 20.0
CLIENT_TIMEOUT_S = 120.0
PR_SET_PDEATHSIG = 1


# --- the workers' counters: a file each process maps; one writer per cell ----------------------


class Counters:
    """Per worker slot: the pid of the worker serving it (0 while it is down, set once it is
    ready), connections it accepted and closed. The last slot is the supervisor's: restarts, and
    connections handed over. Each cell has one writer, so plain increments are exact."""

    FIELDS = 3

    def __init__(self, path: Path, workers: int, *, create: bool = False) -> None:
        size = 8 * self.FIELDS * (workers + 1)
        if create:
            path.write_bytes(bytes(size))
        self._file = path.open("r+b")
        self._map = mmap.mmap(self._file.fileno(), size)
        self.cells = memoryview(self._map).cast("q")
        self.workers = workers

    def pid(self, slot: int) -> int:
        return int(self.cells[self.FIELDS * slot])

    def set_pid(self, slot: int, pid: int) -> None:
        self.cells[self.FIELDS * slot] = pid

    def accepted(self, slot: int) -> int:
        return int(self.cells[self.FIELDS * slot + 1])

    def closed(self, slot: int) -> int:
        return int(self.cells[self.FIELDS * slot + 2])

    def add(self, slot: int, field: int, n: int = 1) -> None:
        self.cells[self.FIELDS * slot + field] += n

    @property
    def restarts(self) -> int:
        return int(self.cells[self.FIELDS * self.workers + 1])

    @property
    def handed(self) -> int:
        return int(self.cells[self.FIELDS * self.workers + 2])


# --- a worker ----------------------------------------------------------------------------------


async def serve(stream: trio.SocketStream, index: bytes, counters: Counters, slot: int) -> None:
    try:
        async with stream:
            while True:
                data = await stream.receive_some(4096)
                if not data:
                    return
                await stream.send_all(data + index)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        counters.add(slot, 2)


async def worker(args: argparse.Namespace) -> None:
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the supervisor's death ends it
    counters = Counters(Path(args.counters), args.workers)
    slot, index = args.index, bytes([args.index])
    async with trio.open_nursery() as connections:
        if args.mode.startswith("handoff"):
            channel = trio.socket.from_stdlib_socket(socket.socket(fileno=args.fd))
            counters.set_pid(slot, os.getpid())
            space = socket.CMSG_SPACE(array.array("i").itemsize)
            while True:
                message, ancillary, _, _ = await channel.recvmsg(1, space)
                if not message:
                    return  # the supervisor is gone
                for level, kind, data in ancillary:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        fds = array.array("i")
                        fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
                        for fd in fds:
                            sock = trio.socket.from_stdlib_socket(socket.socket(fileno=fd))
                            counters.add(slot, 1)
                            connections.start_soon(serve, trio.SocketStream(sock), index, counters, slot)
        if args.mode == "inherit":
            sock = trio.socket.from_stdlib_socket(socket.socket(fileno=args.fd))
        else:
            sock = trio.socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            await sock.bind((HOST, args.port))
            sock.listen(BACKLOG)
        listener = trio.SocketListener(sock)
        counters.set_pid(slot, os.getpid())
        while True:  # the proxy's accept loop, without its admission
            stream = await listener.accept()
            counters.add(slot, 1)
            connections.start_soon(serve, stream, index, counters, slot)


# --- the supervisor ----------------------------------------------------------------------------


class Supervisor:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.counters = Counters(Path(args.counters), args.workers)
        self.listening: socket.socket | None = None
        self.channels: list[trio.socket.SocketType | None] = [None] * args.workers
        self.handed = [0] * args.workers  # per worker, since its (re)start
        self.closed_at_start = [0] * args.workers
        self._next = 0

    async def run(self) -> None:
        args = self.args
        if args.mode != "reuseport":
            self.listening = socket.create_server((HOST, args.port), backlog=BACKLOG)
            self.listening.set_inheritable(True)
        async with trio.open_nursery() as nursery:
            for slot in range(args.workers):
                nursery.start_soon(self.keep_running, slot)
            if args.mode.startswith("handoff"):
                nursery.start_soon(self.hand_over)
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break

    async def keep_running(self, slot: int) -> None:
        args, counters = self.args, self.counters
        while True:
            argv = [sys.executable, __file__, "_worker", "--mode", args.mode, "--workers", str(args.workers)]
            argv += ["--counters", args.counters, "--index", str(slot), "--port", str(args.port)]
            theirs: socket.socket | None = None
            if args.mode == "inherit":
                assert self.listening is not None
                fd = self.listening.fileno()
            elif args.mode.startswith("handoff"):
                ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 22)
                fd = theirs.fileno()
            else:
                fd = -1
            if fd >= 0:
                argv += ["--fd", str(fd)]
            process = await trio.lowlevel.open_process(argv, pass_fds=[fd] if fd >= 0 else [])
            if theirs is not None:
                theirs.close()
                self.handed[slot], self.closed_at_start[slot] = 0, counters.closed(slot)
                self.channels[slot] = trio.socket.from_stdlib_socket(ours)
            try:
                await process.wait()
            finally:
                if process.returncode is None:
                    process.kill()
                    with trio.CancelScope(shield=True):
                        await process.wait()
            channel, self.channels[slot] = self.channels[slot], None
            if channel is not None:
                channel.close()
            counters.set_pid(slot, 0)
            counters.add(counters.workers, 1)

    def choose(self) -> int | None:
        live = [slot for slot, channel in enumerate(self.channels) if channel is not None]
        if not live:
            return None
        if self.args.mode == "handoff-rr":
            self._next += 1
            return live[self._next % len(live)]

        def load(slot: int) -> int:
            return self.handed[slot] - (self.counters.closed(slot) - self.closed_at_start[slot])

        return min(live, key=load)

    async def hand_over(self) -> None:
        assert self.listening is not None
        listening = trio.socket.from_stdlib_socket(self.listening)
        counters = self.counters
        while True:
            conn, _ = await listening.accept()
            with conn:
                while (slot := self.choose()) is not None:
                    channel = self.channels[slot]
                    assert channel is not None
                    try:
                        await channel.sendmsg(
                            [b"c"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [conn.fileno()]))]
                        )
                    except OSError:  # the worker died: it is restarted; try another
                        if self.channels[slot] is channel:
                            self.channels[slot] = None
                        continue
                    self.handed[slot] += 1
                    counters.add(counters.workers, 2)
                    break


# --- the clients -------------------------------------------------------------------------------


async def recv_answer(sock: trio.socket.SocketType) -> bytes:
    answer = b""
    while len(answer) < ANSWER_SIZE:
        chunk = await sock.recv(ANSWER_SIZE - len(answer))
        if not chunk:
            raise EOFError
        answer += chunk
    return answer


async def short_connections(address: tuple[str, int], count: int, concurrency: int) -> dict[str, Any]:
    latencies: list[float] = []
    workers: Counter[int] = Counter()
    errors: Counter[str] = Counter()
    left = count

    async def one_after_another() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            started = perf_counter()
            try:
                with trio.socket.socket() as sock:
                    await sock.connect(address)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    await sock.send(REQUEST)
                    answer = await recv_answer(sock)
            except (OSError, EOFError) as exc:
                errors[type(exc).__name__] += 1
                continue
            latencies.append(perf_counter() - started)
            workers[answer[-1]] += 1

    started = perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(one_after_another)
    return {"seconds": perf_counter() - started, "latencies": latencies, "workers": workers, "errors": errors}


async def long_connections(address: tuple[str, int], count: int, seconds: float) -> dict[str, Any]:
    socks = []
    workers: Counter[int] = Counter()
    round_trips: Counter[int] = Counter()
    for _ in range(count):
        sock = trio.socket.socket()
        await sock.connect(address)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await sock.send(REQUEST)
        workers[(await recv_answer(sock))[-1]] += 1
        socks.append(sock)
    deadline = trio.current_time() + seconds

    async def ping(sock: trio.socket.SocketType) -> None:
        while trio.current_time() < deadline:
            await sock.send(REQUEST)
            round_trips[(await recv_answer(sock))[-1]] += 1

    started = perf_counter()
    async with trio.open_nursery() as nursery:
        for sock in socks:
            nursery.start_soon(ping, sock)
    elapsed = perf_counter() - started
    for sock in socks:
        sock.close()
    return {"seconds": elapsed, "workers": workers, "round_trips": round_trips}


async def waiting_connections(address: tuple[str, int], count: int) -> dict[str, Any]:
    """Open ``count`` connections that each send a request, say so, wait for a line on stdin,
    then read every answer: how many were answered, reset or closed."""
    socks = []
    for _ in range(count):
        sock = trio.socket.socket()
        await sock.connect(address)
        await sock.send(REQUEST)
        socks.append(sock)
    print(json.dumps({"opened": len(socks)}), flush=True)
    await trio.to_thread.run_sync(sys.stdin.readline)
    outcomes: Counter[str] = Counter()

    async def answer(sock: trio.socket.SocketType) -> None:
        try:
            with trio.fail_after(10):
                await recv_answer(sock)
            outcomes["answered"] += 1
        except ConnectionResetError:
            outcomes["reset"] += 1
        except EOFError:
            outcomes["closed"] += 1
        except trio.TooSlowError:
            outcomes["no answer in 10 s"] += 1
        finally:
            sock.close()

    async with trio.open_nursery() as nursery:
        for sock in socks:
            nursery.start_soon(answer, sock)
    return {"outcomes": outcomes}


async def client(args: argparse.Namespace) -> None:
    address = (HOST, args.port)
    if args.load == "short":
        report = await short_connections(address, args.count, args.concurrency)
    elif args.load == "long":
        report = await long_connections(address, args.count, args.seconds)
    else:
        report = await waiting_connections(address, args.count)
    print(json.dumps(report), flush=True)


# --- the benchmark -----------------------------------------------------------------------------


@dataclass
class Run:
    mode: str
    workers: int
    round: int
    sequential: dict[str, Any]
    storm: dict[str, Any]
    long: dict[str, Any]
    death: dict[str, Any]
    in_storm: dict[str, Any]


def quantile_ms(latencies: list[float], q: float) -> float:
    ordered = sorted(latencies)
    return 1000 * ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


def split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def run_clients(port: int, load: str, counts: list[int], extra: list[str]) -> list[dict[str, Any]]:
    """Client processes in parallel, one per count; their reports."""
    return client_reports(start_clients(port, load, counts, extra), load)


def start_clients(port: int, load: str, counts: list[int], extra: list[str]) -> list[subprocess.Popen[str]]:
    base = [sys.executable, __file__, "_client", "--port", str(port), "--load", load, *extra]
    return [subprocess.Popen([*base, "--count", str(n)], stdout=subprocess.PIPE, text=True) for n in counts]


def client_reports(processes: list[subprocess.Popen[str]], load: str) -> list[dict[str, Any]]:
    reports = []
    for process in processes:
        out, _ = process.communicate(timeout=CLIENT_TIMEOUT_S)
        if process.returncode != 0:
            raise BenchError(f"a {load} client exited with status {process.returncode}")
        reports.append(json.loads(out))
    return reports


def merged(reports: list[dict[str, Any]], key: str) -> Counter[int]:
    total: Counter[int] = Counter()
    for report in reports:
        total.update({int(k): v for k, v in report[key].items()})
    return total


class Workers:
    """A supervisor process and the counters its workers write."""

    def __init__(self, folder: Path, mode: str, workers: int) -> None:
        self.port = free_port()
        self.counters = Counters(folder / f"counters-{mode}-{workers}", workers, create=True)
        argv = [sys.executable, __file__, "_supervisor", "--mode", mode, "--workers", str(workers)]
        argv += ["--port", str(self.port), "--counters", str(folder / f"counters-{mode}-{workers}")]
        self.supervisor = Service(f"supervisor-{mode}-{workers}", argv, folder / f"supervisor-{mode}-{workers}.log")
        self.n, self.mode = workers, mode
        self.wait_ready()

    def wait_ready(self, slot: int | None = None, not_pid: int = 0) -> float:
        started = time.monotonic()
        slots = range(self.n) if slot is None else [slot]
        while not all(self.counters.pid(s) not in (0, not_pid) for s in slots):
            self.supervisor.check_running(" while its workers start")
            if time.monotonic() - started > READY_TIMEOUT_S:
                raise BenchError(f"workers not ready after {READY_TIMEOUT_S:.0f}s:\n{self.supervisor.log_tail()}")
            time.sleep(0.005)
        return time.monotonic() - started

    def pids(self) -> list[int]:
        return [self.counters.pid(s) for s in range(self.n)]

    def accepted(self) -> list[int]:
        return [self.counters.accepted(s) for s in range(self.n)]

    def cpu(self) -> tuple[float, float, int]:
        """CPU seconds so far of the workers together and of the supervisor, and the workers'
        voluntary context switches (their waits: wake-ups)."""
        pids = self.pids()
        wakeups = sum(context_switches(pid)[0] for pid in pids)
        return sum(cpu_seconds(pid) for pid in pids), self.supervisor.cpu_seconds(), wakeups

    def signal_all(self, signum: int) -> None:
        for pid in self.pids():
            os.kill(pid, signum)

    def stop(self) -> None:
        pids = self.pids()
        self.supervisor.stop()
        for pid in pids:  # they die with the supervisor (PDEATHSIG); a stopped one needs this
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def checked_spread(workers: Workers, before: list[int], seen: Counter[int], what: str) -> list[int]:
    """Connections each worker accepted, from its own counter; the clients' view must agree."""
    counted = [after - b for after, b in zip(workers.accepted(), before, strict=True)]
    if counted != [seen.get(slot, 0) for slot in range(workers.n)]:
        raise BenchError(f"{what}: the workers counted {counted}, the clients saw {dict(seen)}")
    return counted


def measure(folder: Path, mode: str, n: int, round_: int, args: argparse.Namespace) -> Run:
    workers = Workers(folder, mode, n)
    try:
        clients = args.clients
        # 1. set-up one at a time
        before = workers.accepted()
        (seq,) = run_clients(workers.port, "short", [args.sequential], ["--concurrency", "1"])
        sequential = {
            "p50": quantile_ms(seq["latencies"], 0.5),
            "p99": quantile_ms(seq["latencies"], 0.99),
            "spread": checked_spread(workers, before, merged([seq], "workers"), "sequential"),
            "errors": sum(seq["errors"].values()),
        }
        # 2. the storm
        before = workers.accepted()
        cpu_before = workers.cpu()
        reports = run_clients(
            workers.port,
            "short",
            split(args.storm, clients),
            ["--concurrency", str(max(1, args.concurrency // clients))],
        )
        cpu_after = workers.cpu()
        latencies = [x for r in reports for x in r["latencies"]]
        done = len(latencies)
        storm = {
            "rate": done / max(r["seconds"] for r in reports),
            "p50": quantile_ms(latencies, 0.5),
            "p99": quantile_ms(latencies, 0.99),
            "spread": checked_spread(workers, before, merged(reports, "workers"), "storm"),
            "errors": sum(sum(r["errors"].values()) for r in reports),
            "worker_us": 1e6 * (cpu_after[0] - cpu_before[0]) / max(done, 1),
            "supervisor_us": 1e6 * (cpu_after[1] - cpu_before[1]) / max(done, 1),
            "wakeups": (cpu_after[2] - cpu_before[2]) / max(done, 1),
        }
        # 3. long connections
        before = workers.accepted()
        reports = run_clients(workers.port, "long", split(args.long, clients), ["--seconds", str(args.seconds)])
        long = {
            "rate": sum(sum(r["round_trips"].values()) / r["seconds"] for r in reports),
            "spread": checked_spread(workers, before, merged(reports, "workers"), "long"),
            "round_trips": [merged(reports, "round_trips").get(s, 0) for s in range(n)],
        }
        # 4. a worker dies while connections wait in the kernel
        death = worker_death(workers, args)
        # 5. a worker dies in a storm
        processes = start_clients(
            workers.port,
            "short",
            split(args.storm, clients),
            ["--concurrency", str(max(1, args.concurrency // clients))],
        )
        started, deadline = sum(workers.accepted()), time.monotonic() + CLIENT_TIMEOUT_S
        while sum(workers.accepted()) - started < args.storm // 3 and time.monotonic() < deadline:
            time.sleep(0.001)  # a third of the storm is served: the rest meets the death
        victim, killed = workers.counters.pid(0), time.monotonic()
        os.kill(victim, signal.SIGKILL)
        workers.wait_ready(0, not_pid=victim)
        restart = time.monotonic() - killed
        reports = client_reports(processes, "short")
        errors: Counter[str] = Counter()
        for report in reports:
            errors.update(report["errors"])
        in_storm = {
            "done": sum(len(r["latencies"]) for r in reports),
            "errors": dict(errors),
            "restart_s": restart,
        }
        return Run(mode, n, round_, sequential, storm, long, death, in_storm)
    finally:
        workers.stop()


def worker_death(workers: Workers, args: argparse.Namespace) -> dict[str, Any]:
    handed = workers.counters.handed
    workers.signal_all(signal.SIGSTOP)
    argv = [sys.executable, __file__, "_client", "--port", str(workers.port), "--load", "waiting"]
    process = subprocess.Popen(
        [*argv, "--count", str(args.waiting)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        opened = json.loads(process.stdout.readline())["opened"]
        if workers.mode.startswith("handoff"):
            deadline = time.monotonic() + 10
            while workers.counters.handed - handed < opened and time.monotonic() < deadline:
                time.sleep(0.005)
        in_flight = workers.counters.handed - handed
        victim = workers.counters.pid(0)
        restarts = workers.counters.restarts
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        workers.wait_ready(0, not_pid=victim)
        restart = time.monotonic() - killed
        workers.signal_all(signal.SIGCONT)
        process.stdin.write("go\n")
        process.stdin.flush()
        out, _ = process.communicate(timeout=CLIENT_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
        with contextlib.suppress(ProcessLookupError):
            workers.signal_all(signal.SIGCONT)
    if workers.counters.restarts != restarts + 1:
        raise BenchError(f"the supervisor restarted {workers.counters.restarts - restarts} workers, not 1")
    return {"waiting": opened, "handed": in_flight, "restart_s": restart, **json.loads(out)["outcomes"]}


# --- the tables ----------------------------------------------------------------------------------


def spread_text(counts: list[int]) -> str:
    mean = sum(counts) / len(counts) if counts else 0
    ratio = max(counts) / mean if mean else float("nan")
    return f"{' / '.join(str(c) for c in counts)} ({ratio:.2f})"


def tables(runs: list[Run]) -> Iterator[str]:
    yield "Set-up and the storm (latency: connect to the first answer; spread: connections each worker"
    yield "accepted by its own count, then the largest over the mean):"
    yield ""
    yield (
        "| mode | N | round | one at a time p50 / p99 ms | storm conn/s | storm p50 / p99 ms | storm spread "
        "| workers CPU us/conn | workers' wake-ups/conn | supervisor CPU us/conn | errors |"
    )
    yield "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"
    for r in runs:
        s, q = r.storm, r.sequential
        yield (
            f"| {r.mode} | {r.workers} | {r.round} | {q['p50']:.2f} / {q['p99']:.2f} | {s['rate']:,.0f} "
            f"| {s['p50']:.2f} / {s['p99']:.2f} | {spread_text(s['spread'])} | {s['worker_us']:.0f} "
            f"| {s['wakeups']:.2f} | {s['supervisor_us']:.0f} | {q['errors'] + s['errors']} |"
        )
    yield ""
    yield "Long connections, one small request in flight each:"
    yield ""
    yield "| mode | N | round | round trips/s | connections per worker | round trips per worker |"
    yield "|---|---:|---:|---:|---|---|"
    for r in runs:
        lg = r.long
        yield (
            f"| {r.mode} | {r.workers} | {r.round} | {lg['rate']:,.0f} | {spread_text(lg['spread'])} "
            f"| {' / '.join(f'{x:,}' for x in lg['round_trips'])} |"
        )
    yield ""
    yield "Worker 0 killed while connections wait (every worker stopped; handoff: all handed over first):"
    yield ""
    yield "| mode | N | round | waiting | answered | reset | closed unanswered | no answer | restart s |"
    yield "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    for r in runs:
        d = r.death
        yield (
            f"| {r.mode} | {r.workers} | {r.round} | {d['waiting']} | {d.get('answered', 0)} | {d.get('reset', 0)} "
            f"| {d.get('closed', 0)} | {d.get('no answer in 10 s', 0)} | {d['restart_s']:.2f} |"
        )
    yield ""
    yield "Worker 0 killed in a storm of short connections (errors the clients met, by kind):"
    yield ""
    yield "| mode | N | round | answered | failed | failures by kind | restart s |"
    yield "|---|---:|---:|---:|---:|---|---:|"
    for r in runs:
        k = r.in_storm
        kinds = ", ".join(f"{name} {count}" for name, count in sorted(k["errors"].items())) or "-"
        yield (
            f"| {r.mode} | {r.workers} | {r.round} | {k['done']:,} | {sum(k['errors'].values())} | {kinds} "
            f"| {k['restart_s']:.2f} |"
        )


def migrate_req() -> str:
    """Linux 5.14+: 1 moves the connections waiting in a closed SO_REUSEPORT socket's queue to
    another socket of its group instead of resetting them."""
    path = Path("/proc/sys/net/ipv4/tcp_migrate_req")
    return path.read_text().strip() if path.exists() else "absent"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("_worker", "_supervisor", "_client"):
        return role(argv[0], argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="reuseport,inherit,handoff", help=f"of {', '.join(MODES)}")
    parser.add_argument("--workers", default="2,4", help="worker counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=2, help="every mode and N once per round")
    parser.add_argument("--clients", type=int, default=2, help="client processes for the storm and long load")
    parser.add_argument("--sequential", type=int, default=300, help="connections set up one at a time")
    parser.add_argument("--storm", type=int, default=3000, help="short connections in the storm")
    parser.add_argument("--concurrency", type=int, default=64, help="storm connections at once, over the clients")
    parser.add_argument("--long", type=int, default=64, help="long connections")
    parser.add_argument("--seconds", type=float, default=2.0, help="of round trips on the long connections")
    parser.add_argument("--waiting", type=int, default=200, help="connections waiting when a worker dies")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    if unknown := set(modes) - set(MODES):
        parser.error(f"unknown modes {sorted(unknown)}")
    counts = [int(n) for n in args.workers.split(",")]

    print(f"load average at the start {load_average()}, net.ipv4.tcp_migrate_req = {migrate_req()}", flush=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="workers-accept-") as tmp:
        for round_ in range(1, args.rounds + 1):
            for n in counts:
                for mode in modes:
                    run = measure(Path(tmp), mode, n, round_, args)
                    runs.append(run)
                    print(
                        f"{mode} N={n} round {round_}: storm {run.storm['rate']:,.0f} conn/s, "
                        f"long {run.long['rate']:,.0f} rt/s, load {load_average()}",
                        flush=True,
                    )
    print(f"load average at the end {load_average()}\n")
    print("\n".join(tables(runs)))
    return 0


def role(name: str, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"workers_accept.py {name}")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", choices=MODES)
    parser.add_argument("--workers", type=int)
    parser.add_argument("--counters")
    parser.add_argument("--index", type=int)
    parser.add_argument("--fd", type=int)
    parser.add_argument("--load", choices=("short", "long", "waiting"))
    parser.add_argument("--count", type=int)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args(argv)
    if name == "_worker":
        trio.run(worker, args)
    elif name == "_supervisor":
        trio.run(Supervisor(args).run)
    else:
        trio.run(client, args)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError, KeyboardInterrupt):
        sys.exit(main())
