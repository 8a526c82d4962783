"""How N worker processes could share the proxy's limits, measured from trio workers (issue 29):
what each way costs per operation, how many operations a second it carries, and whether it keeps
a cap exact. The design it informs is docs/workers.md.

Three ways, each run with 2 and 4 worker processes (``--workers``), every worker a ``trio.run``:

- ``shm-lock``: the counts in ``multiprocessing.shared_memory``, each admission under one
  process-shared ``multiprocessing.Lock`` (check the count against the cap, add one, release).
  ``slots-naive`` and ``slots-checked``: no lock, one slot per worker (only its worker writes it),
  readers sum the slots; ``naive`` checks the sum then adds one to its slot, ``checked`` adds one
  first, sums, and takes it back when over the cap. After the timed run, ``--trials`` races to
  the cap: from 0, every worker admits at once until it is refused, and the count they end with
  is read. Exact: every race ends at the cap. ``over``: more were admitted than the cap allows;
  ``under``: a connection was refused that the cap had room for (two workers each took a slot,
  each saw the sum over the cap, both gave theirs back).
- ``owner``: one owner process (trio) holds the counts; a worker asks it over a Unix socket,
  one 16-byte request and one 16-byte answer per admission, from a task of the worker, while a
  reader task of the worker takes the answers: connection opens and closes, group joins and
  leaves. p50 / p99 of the round trip as the worker's task sees it, and the CPU per round trip
  of the workers and of the owner (``/proc/PID/task/*/schedstat``). ``owner`` asks back to back
  (the throughput); ``owner-paced`` pauses 1 ms between asks, so the owner is idle when asked,
  as it is for connection opens (the latency an open would add); ``owner-paced-direct`` the same
  with no reader task: the asking task waits on the socket itself, as a link served by the
  worker's I/O driver would wake only the asker.
- ``lease``: the KIP-72 pool's bytes leased from the owner. A worker asks the owner for bytes
  (at least ``L``, ``--lease-mib``) only when a request does not fit in what it already holds,
  grants requests from its lease locally, and gives back what it holds beyond ``2 L`` (beyond
  nothing while the owner has a request waiting: the owner then recalls unused leases); with
  ``--ask-ahead on`` it also asks for L more when less than L / 2 is left unused. The owner
  grants while any budget remains (Kafka's non-strict pool), so the bytes leased, hence the bytes
  admitted, never pass ``queued.max.request.bytes + socket.request.max.bytes - 1``, the bound of
  one ``MemoryPool``. ``--tasks`` tasks per worker each loop: a request size from the mix below,
  reserve, hold for 1-8 trio checkpoints, release. Request sizes: 60% 100 B-1 KiB (fetches,
  metadata, heartbeats), 30% 1-64 KiB, 10% 64 KiB-1 MiB (large produce batches), log-uniform in
  each band.

``--instructions`` also counts (callgrind, N and 2N operations, differenced) the instructions of
one uncontended ``shm-lock`` admission, one owner round trip on the worker's side, and one local
lease grant and release, to set against the proxy's ~124k instructions per round trip.

    .venv/bin/python bench/shared_state.py                       # every way, 2 and 4 workers
    .venv/bin/python bench/shared_state.py --seconds 1 --ways owner,lease --instructions
"""

from __future__ import annotations

import argparse
import array
import collections
import math
import multiprocessing
import multiprocessing.synchronize
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import trio
from harness import cpu_seconds, load_average

MSG = struct.Struct("<BxxxIq")  # op, request id, value: every message, both ways
OPEN, CLOSE, JOIN, LEAVE, LEASE, RETURN, RECALL, REPLY, STATS, AHEAD = range(1, 11)
MIB = 1 << 20
MAX_REQUEST = MIB  # socket.request.max.bytes in the lease runs: the largest request of the mix
HELD_PER_WORKER = 64  # connections (or members) a worker keeps open, so the caps are reached
RACE_CAP = 20_000  # the cap of race_to_the_cap: some milliseconds of admissions, so the workers overlap
GROUPS = 8
WAYS = ("shm-lock", "slots-naive", "slots-checked", "owner", "owner-paced", "owner-paced-direct", "lease")
PACE_S = 0.001  # owner-paced: a worker's pause between two round trips (the owner and it go idle)


# --- the owner --------------------------------------------------------------------------------


class _Held:
    """What one worker holds at the owner: released when its socket ends (the worker died)."""

    def __init__(self) -> None:
        self.conns = 0
        self.members = [0] * GROUPS
        self.leased = 0


class Owner:
    """The counts of every worker: connections against ``cap``, members of each group against
    ``group_cap``, and pool bytes leased against ``capacity`` (FIFO waiters, recalls)."""

    def __init__(self, cap: int, group_cap: int, capacity: int, lease: int) -> None:
        self.cap, self.group_cap, self.capacity, self.lease = cap, group_cap, capacity, lease
        self.conns = 0
        self.members = [0] * GROUPS
        self.leased = 0
        self.peak_leased = 0
        self.queued = 0  # lease requests that had to wait
        self.recalling = False  # the workers were told to give back unused leases
        self.waiting: collections.deque[tuple[socket.socket, _Held, int, int]] = collections.deque()
        self.links: dict[socket.socket, _Held] = {}

    def handle(self, sock: socket.socket, held: _Held, op: int, rid: int, value: int) -> None:
        answer = 1
        if op == OPEN:
            if self.conns < self.cap:
                self.conns += 1
                held.conns += 1
            else:
                answer = 0
        elif op == CLOSE:
            self.conns -= 1
            held.conns -= 1
        elif op == JOIN:
            if self.members[value] < self.group_cap:
                self.members[value] += 1
                held.members[value] += 1
            else:
                answer = 0
        elif op == LEAVE:
            self.members[value] -= 1
            held.members[value] -= 1
        elif op == LEASE:
            if self.waiting or self.leased >= self.capacity:
                if not self.recalling:
                    self.recalling = True
                    self._tell_all(RECALL, 1)
                self.waiting.append((sock, held, rid, value))
                self.queued += 1
                return
            answer = self._grant(held, value)
        elif op == AHEAD:  # strict, never queued: up to L from what remains, or nothing
            answer = 0 if self.waiting else max(0, min(self.lease, self.capacity - self.leased))
            self._add(held, answer)
        elif op == RETURN:
            self._give_back(held, value)
            return  # one way
        elif op == STATS:
            answer = (self.peak_leased, self.queued, self.conns + sum(self.members) + self.leased)[value]
        _send(sock, MSG.pack(REPLY, rid, answer))

    def _grant(self, held: _Held, need: int) -> int:
        """``need`` bytes and up to ``lease`` more, while any budget remains (non-strict: the
        grant may pass the budget by less than one request, as Kafka's pool does)."""
        granted = max(need, min(self.lease, self.capacity - self.leased))
        self._add(held, granted)
        return granted

    def _add(self, held: _Held, granted: int) -> None:
        self.leased += granted
        held.leased += granted
        self.peak_leased = max(self.peak_leased, self.leased)

    def _give_back(self, held: _Held, value: int) -> None:
        self.leased -= value
        held.leased -= value
        while self.waiting and self.leased < self.capacity:
            sock, waiter, rid, need = self.waiting.popleft()
            _send(sock, MSG.pack(REPLY, rid, self._grant(waiter, need)))
        if self.recalling and not self.waiting:
            self.recalling = False
            self._tell_all(RECALL, 0)

    def _tell_all(self, op: int, value: int) -> None:
        for sock in self.links:
            _send(sock, MSG.pack(op, 0, value))

    def worker_gone(self, sock: socket.socket) -> None:
        """A worker's socket ended (it exited or died): what it held goes back."""
        held = self.links.pop(sock)
        self.conns -= held.conns
        for group, n in enumerate(held.members):
            self.members[group] -= n
        self.waiting = collections.deque(w for w in self.waiting if w[0] is not sock)
        self._give_back(held, held.leased)

    async def serve(self, path: str) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(64)
        listener.setblocking(False)
        print("ready", flush=True)
        async with trio.open_nursery() as nursery:
            while True:
                await trio.lowlevel.wait_readable(listener)
                sock, _ = listener.accept()
                sock.setblocking(False)
                self.links[sock] = _Held()
                nursery.start_soon(self._serve_link, sock)

    async def _serve_link(self, sock: socket.socket) -> None:
        held = self.links[sock]
        pending = b""
        unpack = MSG.unpack_from
        while True:
            await trio.lowlevel.wait_readable(sock)
            try:
                data = sock.recv(65536)
            except ConnectionResetError:  # a worker closed with our RECALLs unread, or died
                data = b""
            if not data:
                self.worker_gone(sock)
                sock.close()
                return
            pending += data
            whole = len(pending) - len(pending) % MSG.size
            for offset in range(0, whole, MSG.size):
                self.handle(sock, held, *unpack(pending, offset))
            pending = pending[whole:]


def _send(sock: socket.socket, message: bytes) -> None:
    try:
        sock.send(message)
    except OSError:  # that worker is gone (it ended with an ask unanswered): its reader releases what it held
        pass


def start_owner(path: str, cap: int, group_cap: int, capacity: int, lease: int) -> subprocess.Popen[str]:
    owner = subprocess.Popen(
        [sys.executable, __file__, "--serve-owner", path, "--owner-args", f"{cap},{group_cap},{capacity},{lease}"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert owner.stdout is not None
    if owner.stdout.readline().strip() != "ready":
        raise RuntimeError("the owner did not start")
    return owner


# --- a worker's side of the owner -------------------------------------------------------------


class OwnerLink:
    """A worker's one socket to the owner: ``call`` sends a request and parks its task until the
    reader task (``read``) hands it the answer; RECALL messages go to ``on_recall``."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.sock.setblocking(False)
        self.next_id = 1
        self.answers: dict[int, Any] = {}  # request id -> [Event, answer]
        self.on_recall: Callable[[int], None] = lambda value: None

    async def call(self, op: int, value: int = 0) -> int:
        rid = self.next_id
        self.next_id += 1
        slot = self.answers[rid] = [trio.Event(), 0]
        self.sock.send(MSG.pack(op, rid, value))
        await slot[0].wait()
        del self.answers[rid]
        return int(slot[1])

    async def call_direct(self, op: int, value: int = 0) -> int:
        """``call`` with no reader task: the asking task waits on the socket itself (one task, one
        request at a time), as a link served by the worker's I/O driver would wake only the asker."""
        self.sock.send(MSG.pack(op, 0, value))
        while True:
            await trio.lowlevel.wait_readable(self.sock)
            data = self.sock.recv(MSG.size)
            if data:
                return int(MSG.unpack(data)[2])

    def tell(self, op: int, value: int) -> None:
        self.sock.send(MSG.pack(op, 0, value))

    async def read(self) -> None:
        pending = b""
        while True:
            await trio.lowlevel.wait_readable(self.sock)
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                return
            pending += data
            whole = len(pending) - len(pending) % MSG.size
            for offset in range(0, whole, MSG.size):
                op, rid, value = MSG.unpack_from(pending, offset)
                if op == REPLY:
                    slot = self.answers[rid]
                    slot[1] = value
                    slot[0].set()
                else:
                    self.on_recall(value)
            pending = pending[whole:]


class LeasedPool:
    """A worker's part of the pool: grants from its lease; a request that does not fit waits in
    the worker's FIFO queue while one task (``ask``) asks the owner for the shortfall of the
    queue's head (at least L); gives back what it holds beyond ``2 L`` (all it does not use
    while the owner recalls). ``ahead``: when less than ``L / 2`` is left unused, the same task
    asks the owner for L more before a request needs it (strict: only from what remains; an
    answer of nothing stops asking ahead until bytes are granted again)."""

    def __init__(self, link: OwnerLink | None, lease: int, ahead: bool = False) -> None:
        self.link, self.lease_size, self.ahead = link, lease, ahead
        self.ahead_blocked = False
        self.lease = 0
        self.used = 0
        self.recall = False
        self.queue: collections.deque[tuple[int, trio.Event]] = collections.deque()
        self.wanted = trio.Event()
        self.local = self.waited = self.remote = self.returns = 0
        if link is not None:
            link.on_recall = self._on_recall

    async def reserve(self, size: int) -> bool:
        """True when the request waited for the owner."""
        if not self.queue and self.used + size <= self.lease:
            self.used += size
            self.local += 1
            if self.ahead and self.lease - self.used < self.lease_size // 2:
                self.wanted.set()
            return False
        granted = trio.Event()
        self.queue.append((size, granted))
        self.wanted.set()
        self.waited += 1
        await granted.wait()
        return True

    async def ask(self) -> None:
        assert self.link is not None
        while True:
            await self.wanted.wait()
            self.wanted = trio.Event()
            while self.queue or self._short():
                if not self.queue:
                    got = await self.link.call(AHEAD)
                    self.remote += 1
                    self.lease += got
                    self.ahead_blocked = not got
                    continue
                need = self.used + self.queue[0][0] - self.lease
                if need > 0:
                    self.lease += await self.link.call(LEASE, need)
                    self.remote += 1
                    self.ahead_blocked = False
                self._grant_queued()

    def _short(self) -> bool:
        return (
            self.ahead and not self.recall and not self.ahead_blocked and self.lease - self.used < self.lease_size // 2
        )

    def _grant_queued(self) -> None:
        while self.queue and self.used + self.queue[0][0] <= self.lease:
            size, granted = self.queue.popleft()
            self.used += size
            granted.set()

    def release(self, size: int) -> None:
        self.used -= size
        if self.queue:
            self._grant_queued()
            return
        spare = self.lease - self.used
        keep = 0 if self.recall else 2 * self.lease_size
        if spare > keep and self.link is not None:
            back = spare - keep // 2
            self.lease -= back
            self.returns += 1
            self.link.tell(RETURN, back)

    def _on_recall(self, value: int) -> None:
        self.recall = bool(value)
        self.ahead_blocked = False
        if self.recall:
            self.release(0)


def request_size(rng: random.Random) -> int:
    """The request-size mix (module docstring): log-uniform in each band."""
    band = rng.random()
    low, high = (100, 1024) if band < 0.6 else (1024, 64 * 1024) if band < 0.9 else (64 * 1024, MIB)
    return int(math.exp(rng.uniform(math.log(low), math.log(high))))


# --- the workers ------------------------------------------------------------------------------


def _percentiles(samples: array.array[int]) -> tuple[float, float]:
    ordered = sorted(samples)
    if not ordered:
        return math.nan, math.nan
    return ordered[len(ordered) // 2] / 1000, ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] / 1000


def _admit(way: str, counts: memoryview, lock: Any, cap: int, mine: int, slots: range) -> bool:
    """One admission against ``cap``, the way ``way`` counts."""
    if way == "shm-lock":
        with lock:
            if counts[0] < cap:
                counts[0] += 1
                return True
            return False
    if way == "slots-naive":
        if sum(counts[i] for i in slots) < cap:
            counts[mine] += 1
            return True
        return False
    counts[mine] += 1  # slots-checked: take first, then look
    if sum(counts[i] for i in slots) <= cap:
        return True
    counts[mine] -= 1
    return False


def _close(way: str, counts: memoryview, lock: Any, mine: int) -> None:
    if way == "shm-lock":
        with lock:
            counts[0] -= 1
    else:
        counts[mine] -= 1


async def _shm_loop(
    way: str, index: int, workers: int, counts: memoryview, lock: Any, cap: int, deadline: float
) -> dict[str, Any]:
    """Admit and close for ever (a worker holds up to HELD_PER_WORKER; the cap is below what they
    all try to hold), timing each admission and close."""
    latencies: array.array[int] = array.array("q")
    ops = admitted = held = turns = 0
    clock = time.perf_counter_ns
    mine = 1 + index
    slots = range(1, 1 + workers)
    while True:
        start = clock()
        ok = _admit(way, counts, lock, cap, mine, slots)
        end = clock()
        latencies.append(end - start)
        ops += 1
        if ok:
            admitted += 1
            held += 1
        if held and (held >= HELD_PER_WORKER or not ok):
            start = clock()
            _close(way, counts, lock, mine)
            latencies.append(clock() - start)
            ops += 1
            held -= 1
        turns += 1
        if turns % 64 == 0:  # a worker's loop lets trio run now and then, as the proxy's would
            await trio.lowlevel.checkpoint()
            if end >= deadline:
                break
    for _ in range(held):
        _close(way, counts, lock, mine)
    return {"ops": ops, "admitted": admitted, "latencies": {"admit/close": latencies}}


def race_to_the_cap(
    way: str, index: int, workers: int, counts: memoryview, lock: Any, race: Any, trials: int
) -> list[int]:
    """Each trial: from 0, every worker admits until it is refused once, all at once; then the
    count they ended with (read when all have stopped). Exact: every trial ends at the cap."""
    mine = 1 + index
    slots = range(1, 1 + workers)
    finals = []
    for _ in range(trials):
        counts[mine] = 0
        if index == 0:
            counts[0] = 0
        race.wait()
        while _admit(way, counts, lock, RACE_CAP, mine, slots):
            pass
        race.wait()
        finals.append(counts[0] if way == "shm-lock" else sum(counts[i] for i in slots))
        race.wait()
    return finals


async def _owner_loop(path: str, deadline: float, pace: float, direct: bool = False) -> dict[str, Any]:
    link = OwnerLink(path)
    latencies: dict[str, array.array[int]] = {name: array.array("q") for name in ("open", "close", "join", "leave")}
    ops = admitted = 0
    rng = random.Random(1)
    conns: collections.deque[int] = collections.deque()
    members: collections.deque[int] = collections.deque()
    clock = time.perf_counter_ns
    call = link.call_direct if direct else link.call
    async with trio.open_nursery() as nursery:
        if not direct:
            nursery.start_soon(link.read)
        while clock() < deadline:
            for op, name, held, value in ((OPEN, "open", conns, 0), (JOIN, "join", members, rng.randrange(GROUPS))):
                if pace:
                    await trio.sleep(pace)
                start = clock()
                ok = await call(op, value)
                latencies[name].append(clock() - start)
                ops += 1
                admitted += ok
                if ok:
                    held.append(value)
                if len(held) >= HELD_PER_WORKER or (not ok and held):
                    close_op, close_name = (CLOSE, "close") if op == OPEN else (LEAVE, "leave")
                    start = clock()
                    await call(close_op, held.popleft())
                    latencies[close_name].append(clock() - start)
                    ops += 1
        while conns:
            await call(CLOSE, conns.popleft())
        while members:
            await call(LEAVE, members.popleft())
        nursery.cancel_scope.cancel()
    link.sock.close()
    return {"ops": ops, "admitted": admitted, "latencies": latencies}


async def _lease_loop(path: str, lease: int, tasks: int, deadline: float, ahead: bool) -> dict[str, Any]:
    link = OwnerLink(path)
    pool = LeasedPool(link, lease, ahead)
    latencies: dict[str, array.array[int]] = {"local": array.array("q"), "waited": array.array("q")}
    clock = time.perf_counter_ns

    async def requester(seed: int) -> None:
        rng = random.Random(seed)
        while clock() < deadline:
            size = request_size(rng)
            start = clock()
            waited = await pool.reserve(size)
            latencies["waited" if waited else "local"].append(clock() - start)
            for _ in range(rng.randint(1, 8)):
                await trio.lowlevel.checkpoint()
            pool.release(size)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.read)
        nursery.start_soon(pool.ask)
        async with trio.open_nursery() as requesters:
            for i in range(tasks):
                requesters.start_soon(requester, os.getpid() * 100 + i)
        if pool.lease:
            pool.returns += 1
            link.tell(RETURN, pool.lease)
        nursery.cancel_scope.cancel()
    link.sock.close()
    requests = pool.local + pool.waited
    return {
        "ops": requests,
        "admitted": requests,
        "remote": pool.remote,
        "waited": pool.waited,
        "returns": pool.returns,
        "latencies": latencies,
    }


def worker_main(
    way: str,
    index: int,
    args: argparse.Namespace,
    shm_name: str,
    lock: Any,
    cap: int,
    path: str,
    barrier: multiprocessing.synchronize.Barrier,
    race: multiprocessing.synchronize.Barrier,
    results: Any,
) -> None:
    """One worker process: warm up, meet the others at the barrier, run ``args.seconds``, meet
    again (the owner's CPU is read between the two meetings), report."""

    async def run() -> dict[str, Any]:
        if way.startswith("owner"):
            pace = PACE_S if way.startswith("owner-paced") else 0.0
            return await _owner_loop(path, deadline, pace, way == "owner-paced-direct")
        if way == "lease":
            return await _lease_loop(path, args.lease_mib_now, args.tasks, deadline, args.ahead_now)
        return await _shm_loop(way, index, args.workers_now, counts, lock, cap, deadline)

    shm = shared_memory.SharedMemory(name=shm_name)
    assert shm.buf is not None
    counts = shm.buf.cast("q")  # [0]: the count (shm-lock); [1 + i]: worker i's slot
    barrier.wait()
    cpu0 = time.process_time()
    deadline = time.perf_counter_ns() + int(args.seconds * 1e9)
    result = trio.run(run)
    cpu = time.process_time() - cpu0
    barrier.wait()
    result["cpu"] = cpu
    if way.startswith("slots") or way == "shm-lock":
        result["finals"] = race_to_the_cap(way, index, args.workers_now, counts, lock, race, args.trials)
    counts.release()
    shm.close()
    result["latencies"] = {k: v.tobytes() for k, v in result["latencies"].items()}
    results.put(result)


def run_way(
    way: str, workers: int, args: argparse.Namespace, lease_mib: int = 0, ahead: bool = False
) -> dict[str, Any]:
    """One run of ``way`` with ``workers`` processes; the merged results."""
    context = multiprocessing.get_context("fork")
    args.workers_now, args.lease_mib_now, args.ahead_now = workers, lease_mib * MIB, ahead
    cap = workers * HELD_PER_WORKER * 3 // 4  # below what the workers try to hold: the cap is reached
    shm = shared_memory.SharedMemory(create=True, size=8 * (1 + workers))
    lock = context.Lock()
    owner = None
    with tempfile.TemporaryDirectory(prefix="shared-state-") as tmp:
        path = f"{tmp}/owner.sock"
        try:
            if way.startswith("owner") or way == "lease":
                capacity = args.pool_mib_now * MIB if way == "lease" else MIB
                owner = start_owner(path, cap, cap // GROUPS, capacity, lease_mib * MIB)
            barrier, race = context.Barrier(workers + 1), context.Barrier(workers)
            results = context.Queue()
            procs = [
                context.Process(
                    target=worker_main, args=(way, i, args, shm.name, lock, cap, path, barrier, race, results)
                )
                for i in range(workers)
            ]
            for proc in procs:
                proc.start()
            barrier.wait(timeout=120)
            started = time.perf_counter()
            owner_cpu0 = cpu_seconds(owner.pid) if owner else 0.0
            barrier.wait(timeout=120)
            wall = time.perf_counter() - started
            owner_cpu = cpu_seconds(owner.pid) - owner_cpu0 if owner else 0.0
            each = [results.get(timeout=60) for _ in procs]
            for proc in procs:
                proc.join(timeout=30)
            stats: list[int] = []
            if owner is not None:
                stats = trio.run(_owner_stats, path)
        finally:
            if owner is not None:
                owner.terminate()
                owner.wait(timeout=10)
            shm.close()
            shm.unlink()
    latencies: dict[str, array.array[int]] = {}
    for result in each:
        for name, raw in result["latencies"].items():
            latencies.setdefault(name, array.array("q")).frombytes(raw)
    return {
        "ops": sum(r["ops"] for r in each),
        "admitted": sum(r["admitted"] for r in each),
        "finals": each[0].get("finals", []),
        "remote": sum(r.get("remote", 0) for r in each),
        "returns": sum(r.get("returns", 0) for r in each),
        "waited": sum(r.get("waited", 0) for r in each),
        "cpu": sum(r["cpu"] for r in each),
        "owner_cpu": owner_cpu,
        "wall": wall,
        "latencies": latencies,
        "stats": stats,
        "cap": cap,
    }


async def _owner_stats(path: str) -> list[int]:
    link = OwnerLink(path)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.read)
        stats = [await link.call(STATS, i) for i in range(3)]
        nursery.cancel_scope.cancel()
    link.sock.close()
    return stats


# --- what a dead worker leaves ----------------------------------------------------------------


def lock_left_held_by_a_killed_holder() -> bool:
    """A process takes a multiprocessing.Lock and is SIGKILLed holding it: can anyone take it after?"""
    context = multiprocessing.get_context("fork")
    lock = context.Lock()

    def hold_and_die() -> None:
        lock.acquire()
        os.kill(os.getpid(), signal.SIGKILL)

    proc = context.Process(target=hold_and_die)
    proc.start()
    proc.join()
    taken = lock.acquire(timeout=1.0)
    if taken:
        lock.release()
    return not taken


def owner_counts_after_a_killed_worker() -> tuple[int, int]:
    """A worker opens connections, joins groups and leases bytes, then is SIGKILLed: what the
    owner counts before and after (connections + members + bytes leased)."""
    context = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="shared-state-") as tmp:
        path = f"{tmp}/owner.sock"
        owner = start_owner(path, 1000, 1000, 64 * MIB, MIB)
        ready = context.Event()

        def hold_and_die() -> None:
            async def hold() -> None:
                link = OwnerLink(path)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(link.read)
                    for group in range(5):
                        await link.call(OPEN)
                        await link.call(JOIN, group)
                    await link.call(LEASE, 300_000)
                    ready.set()
                    await trio.sleep_forever()

            trio.run(hold)

        try:
            proc = context.Process(target=hold_and_die)
            proc.start()
            ready.wait(timeout=30)
            before = trio.run(_owner_stats, path)[2]
            assert proc.pid is not None
            os.kill(proc.pid, signal.SIGKILL)
            proc.join()
            after = trio.run(_owner_stats, path)[2]
            deadline = time.monotonic() + 5
            while after and time.monotonic() < deadline:  # the owner reads the EOF on its next turn
                after = trio.run(_owner_stats, path)[2]
        finally:
            owner.terminate()
            owner.wait(timeout=10)
    return before, after


# --- instructions ------------------------------------------------------------------------------


def callgrind_op(op: str, n: int) -> None:
    """Run ``n`` operations of ``op`` (under callgrind, from ``instructions``)."""
    if op == "lock":
        shm = shared_memory.SharedMemory(create=True, size=8)
        assert shm.buf is not None
        counts = shm.buf.cast("q")
        lock = multiprocessing.get_context("fork").Lock()
        for _ in range(n):
            with lock:
                if counts[0] < 1 << 40:
                    counts[0] += 1
        del counts
        shm.close()
        shm.unlink()
    elif op == "owner":
        with tempfile.TemporaryDirectory(prefix="shared-state-") as tmp:
            owner = start_owner(f"{tmp}/owner.sock", 1 << 40, 1 << 40, MIB, MIB)

            async def calls() -> None:
                link = OwnerLink(f"{tmp}/owner.sock")
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(link.read)
                    for _ in range(n):
                        await link.call(OPEN)
                    nursery.cancel_scope.cancel()

            try:
                trio.run(calls)
            finally:
                owner.terminate()
                owner.wait(timeout=10)
    else:  # lease-local: a reserve and a release inside the lease, no owner
        pool = LeasedPool(None, MIB)
        pool.lease = 1 << 40

        async def grants() -> None:
            for _ in range(n):
                await pool.reserve(1000)
                pool.release(1000)

        trio.run(grants)


def instructions(op: str, n: int, workdir: Path) -> float:
    totals = []
    for count in (n, 2 * n):
        out = workdir / f"{op}-{count}.out"
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                __file__,
                "--callgrind-op",
                op,
                "--ops",
                str(count),
            ],
            check=True,
            capture_output=True,
            timeout=900,
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )
        match = re.search(r"^(?:summary|totals): (\d+)", out.read_text(errors="replace"), re.MULTILINE)
        assert match is not None, f"no totals in {out}"
        totals.append(int(match.group(1)))
    return (totals[1] - totals[0]) / n


# --- main ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ways", default=",".join(WAYS), help="comma-separated: " + ", ".join(WAYS))
    parser.add_argument("--workers", default="2,4", help="worker counts, comma-separated")
    parser.add_argument("--seconds", type=float, default=2.0, help="length of each run")
    parser.add_argument("--trials", type=int, default=200, help="races to the cap per run (shm ways)")
    parser.add_argument("--tasks", type=int, default=16, help="requesting tasks per worker (lease)")
    parser.add_argument("--lease-mib", default="1,4", help="lease sizes L in MiB (lease)")
    parser.add_argument("--ask-ahead", default="off,on", help="lease runs without and with asking ahead")
    parser.add_argument("--pool-mib", default="16,2", help="queued.max.request.bytes in MiB, comma-separated (lease)")
    parser.add_argument("--instructions", action="store_true", help="also count instructions (callgrind)")
    parser.add_argument("--serve-owner", help=argparse.SUPPRESS)
    parser.add_argument("--owner-args", help=argparse.SUPPRESS)
    parser.add_argument("--callgrind-op", help=argparse.SUPPRESS)
    parser.add_argument("--ops", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_owner:
        cap, group_cap, capacity, lease = map(int, args.owner_args.split(","))
        trio.run(Owner(cap, group_cap, capacity, lease).serve, args.serve_owner)
        return 0
    if args.callgrind_op:
        callgrind_op(args.callgrind_op, args.ops)
        return 0
    ways = [w for w in args.ways.split(",") if w]
    unknown = [w for w in ways if w not in WAYS]
    if unknown:
        parser.error(f"unknown way(s) {', '.join(unknown)}; choose from {', '.join(WAYS)}")
    counts = [int(w) for w in args.workers.split(",")]
    print(f"load average {load_average()} at the start; {os.cpu_count()} CPUs; {args.seconds:g} s a run\n")

    counters = [w for w in ways if w != "lease"]
    if counters:
        print(
            "| way | workers | operation | ops/s, all workers | p50 us | p99 us | worker CPU us/op "
            "| owner CPU us/op | race to the cap: over / under, of trials |"
        )
        print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
        for workers in counts:
            for way in counters:
                r = run_way(way, workers, args)
                per = 1e6 / r["ops"]
                owner_cpu = f"{r['owner_cpu'] * per:.1f}" if way.startswith("owner") else "-"
                finals = r["finals"]
                race = (
                    f"{sum(f > RACE_CAP for f in finals)} / {sum(f < RACE_CAP for f in finals)}, of {len(finals)}"
                    if finals
                    else "- (one decider)"
                )
                for name, samples in r["latencies"].items():
                    p50, p99 = _percentiles(samples)
                    print(
                        f"| {way} | {workers} | {name} | {r['ops'] / r['wall']:,.0f} | {p50:.2f} | {p99:.2f} "
                        f"| {r['cpu'] * per:.2f} | {owner_cpu} | {race} |",
                        flush=True,
                    )
        print()
    if "lease" in ways:
        print(
            f"Pool leases: socket.request.max.bytes = 1 MiB, {args.tasks} requesting tasks per worker; "
            "per request: lease asks sent to the owner, returns sent, requests that waited in the worker's queue\n"
        )
        print(
            "| workers | queued.max.request.bytes | L | ask ahead | requests/s | asks | returns | waited "
            "| asks the owner queued "
            "| local p50 / p99 us | waited p50 / p99 us | worker CPU us/request | owner CPU us/request "
            "| peak leased | within Q + 1 MiB - 1, none left |"
        )
        print("|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for workers in counts:
            for pool_mib in (int(x) for x in args.pool_mib.split(",")):
                args.pool_mib_now = pool_mib
                bound = pool_mib * MIB + MAX_REQUEST - 1
                for lease_mib, ahead in (
                    (int(x), a == "on") for x in args.lease_mib.split(",") for a in args.ask_ahead.split(",")
                ):
                    r = run_way("lease", workers, args, lease_mib, ahead)
                    peak, queued, left = r["stats"]
                    local = _percentiles(r["latencies"]["local"])
                    waited = _percentiles(r["latencies"]["waited"])
                    ok = "yes" if peak <= bound and left == 0 else f"NO ({left} left)"
                    ops = r["ops"]
                    print(
                        f"| {workers} | {pool_mib} MiB | {lease_mib} MiB | {'on' if ahead else 'off'} "
                        f"| {ops / r['wall']:,.0f} "
                        f"| {r['remote'] / ops:.2%} | {r['returns'] / ops:.2%} | {r['waited'] / ops:.2%} | {queued} "
                        f"| {local[0]:.1f} / {local[1]:.1f} | {waited[0]:.0f} / {waited[1]:.0f} "
                        f"| {r['cpu'] * 1e6 / ops:.1f} | {r['owner_cpu'] * 1e6 / ops:.2f} "
                        f"| {peak / MIB:.2f} MiB | {ok} |",
                        flush=True,
                    )
        print()
    print(f"multiprocessing.Lock left held after its holder was SIGKILLed: {lock_left_held_by_a_killed_holder()}")
    before, after = owner_counts_after_a_killed_worker()
    print(f"the owner's counts (connections, members, bytes leased) of a SIGKILLed worker: {before:,}, then {after}")
    if args.instructions:
        print("\n| operation | instructions | of the proxy's 124k per round trip |\n|---|---:|---:|")
        with tempfile.TemporaryDirectory(prefix="shared-state-cg-") as tmp:
            for op, what in (
                ("lock", "one shm-lock admission, uncontended (acquire, compare, add, release)"),
                ("owner", "one owner round trip, the worker's side (send, park, reader wakes, answer)"),
                ("lease-local", "one local lease grant and release (reserve + release, no owner)"),
            ):
                count = instructions(op, 2000, Path(tmp))
                print(f"| {what} | {count:,.0f} | {count / 124_000:.1%} |", flush=True)
    print(f"\nload average {load_average()} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
