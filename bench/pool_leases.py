"""The pool's leases as built (issue 29; docs/workers.md, "The pool: leases"): how many requests
ask the owner under a mixed load, and what the lease gate costs a request against the plain gate.

The proxy's own classes, in real processes: each worker process runs ``--tasks`` trio tasks
over one gate; each task loops: a request size from the mix of bench/shared_state.py (60%
100 B-1 KiB, 30% 1-64 KiB, 10% 64 KiB-1 MiB, log-uniform in each band), ``reserve`` (waiting
on ``wait_for`` when told), hold for 1-8 trio checkpoints, ``release``. Ways:

- ``plain``: one process, ``PoolGate(MemoryPool(budget))``: ``workers: 1`` as today.
- ``lease``: ``--workers`` processes, each a ``LeasedPoolGate`` (``LeasedMemoryPool`` with
  L = min(4 MiB, budget / 4N)) with its asking task, and one owner process running
  ``PoolOwner`` over a ``Link`` on a Unix socket pair per worker, as the supervisor does.

Per worker: requests, the asks it sent the owner (round trips) and the share of requests that
did, the requests that waited (for an ask, or for the budget), the WAIT decisions recorded
(the budget was all leased), and CPU per request (the worker's CPU over the timed run /
requests; the asking task's and the link's share included). For ``lease``: the owner's CPU
from start to end (its start-up included), and the most bytes leased at once against the bound.

    PYTHONPATH=$PWD .venv/bin/python bench/pool_leases.py    # budgets 16 and 2 MiB, 2 and 4 workers
    PYTHONPATH=$PWD .venv/bin/python bench/pool_leases.py --seconds 1 --budgets-mib 16 --workers 2
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import random
import socket
from typing import Any

import trio
from harness import cpu_seconds, load_average

from policies.memory_pool import MemoryPool
from policies.pool_leases import LeasedMemoryPool, lease_size
from proxy.config.model import Config, parse_config
from proxy.evidence.audit import AuditSink
from proxy.evidence.decisions import NOWHERE, DecisionRecorder
from proxy.evidence.metrics import Metrics
from proxy.serve.pool_gate import LeasedPoolGate, PoolGate
from proxy.workers.link import Link
from proxy.workers.owner_pool import PoolOwner

MIB = 1 << 20
MAX_REQUEST = MIB  # socket.request.max.bytes: the largest request of the mix


def request_size(rng: random.Random) -> int:
    band = rng.random()
    low, high = (100, 1024) if band < 0.6 else (1024, 64 * 1024) if band < 0.9 else (64 * 1024, MIB)
    return int(math.exp(rng.uniform(math.log(low), math.log(high))))


def config(budget: int) -> Config:
    return parse_config(
        {
            "mode": "sidecar",
            "upstream": {"bootstrap_servers": ["127.0.0.1:9092"]},
            "listeners": [{"name": "l", "bind": "127.0.0.1:1"}],
            "policies": {"queued.max.request.bytes": budget, "socket.request.max.bytes": MAX_REQUEST},
        }
    )


def waits_recorded(metrics: Metrics) -> float:
    labels = {"listener": "", "policy": "memory_pool", "action": "wait", "limit": "queued.max.request.bytes"}
    return metrics.registry.get_sample_value("kafka_admission_decisions_total", {**labels, "mode": "enforce"}) or 0.0


async def _load(
    gate: PoolGate, tasks: int, seconds: float, seed: int, counts: dict[str, float], metrics: Metrics
) -> None:
    """The tasks' loop for ``seconds`` after a short warm-up; counts (while ``counts["on"]``),
    the WAITs recorded and this process's CPU over the timed run into ``counts``."""

    async def task(rng: random.Random, n: int) -> None:
        conn = f"c{n}"
        while True:
            size = request_size(rng)
            admission = gate.reserve(conn, size, trio.current_time(), NOWHERE)
            if admission.waits:
                await gate.wait_for(admission.ticket)  # type: ignore[arg-type]
                counts["waited"] += counts["on"]
            for _ in range(rng.randint(1, 8)):
                await trio.lowlevel.checkpoint()
            gate.release(admission.ticket, trio.current_time())
            counts["requests"] += counts["on"]

    async with trio.open_nursery() as nursery:
        for n in range(tasks):
            nursery.start_soon(task, random.Random(seed * 1000 + n), n)
        await trio.sleep(0.3)
        counts["on"] = 1
        cpu0, recorded0 = cpu_seconds(os.getpid()), waits_recorded(metrics)
        await trio.sleep(seconds)
        counts["cpu"] = cpu_seconds(os.getpid()) - cpu0
        counts["recorded"] = waits_recorded(metrics) - recorded0
        counts["on"] = 0
        nursery.cancel_scope.cancel()


def _counts() -> dict[str, float]:
    return {"on": 0, "requests": 0, "waited": 0, "asks": 0, "recorded": 0, "cpu": 0.0}


def plain_worker(budget: int, tasks: int, seconds: float, out: Any) -> None:
    metrics = Metrics()
    cfg = config(budget)
    gate = PoolGate(
        MemoryPool(budget, MAX_REQUEST), metrics, DecisionRecorder(metrics, AuditSink(cfg.audit, metrics)), None
    )
    counts = _counts()
    trio.run(_load, gate, tasks, seconds, 0, counts, metrics)
    out.put(counts)


def lease_worker(
    index: int, workers: int, budget: int, tasks: int, seconds: float, fd: int, others: list[int], out: Any
) -> None:
    for other in others:  # the other ends, inherited by fork: closed, so each link ends when its peer does
        os.close(other)

    async def main() -> dict[str, float]:
        link = Link(trio.SocketStream(trio.socket.from_stdlib_socket(socket.socket(fileno=fd))))
        metrics = Metrics()
        cfg = config(budget)
        gate = LeasedPoolGate(
            LeasedMemoryPool(budget, MAX_REQUEST, lease_size(budget, workers)),
            metrics,
            DecisionRecorder(metrics, AuditSink(cfg.audit, metrics)),
            None,
            link,
        )
        counts = _counts()
        ask = link.ask

        async def counted(kind: str, *args: Any) -> Any:
            counts["asks"] += counts["on"]
            return await ask(kind, *args)

        link.ask = counted  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(link.run)
            nursery.start_soon(gate.run)
            await _load(gate, tasks, seconds, index + 1, counts, metrics)
            nursery.cancel_scope.cancel()
        return counts

    out.put(trio.run(main))


def owner(budget: int, fds: list[int], others: list[int], out: Any) -> None:
    """The owner's process: serves the workers' links until every worker has gone."""
    for other in others:
        os.close(other)

    async def main() -> dict[str, float]:
        service = PoolOwner(config(budget))
        cpu0 = cpu_seconds(os.getpid())
        async with trio.open_nursery() as nursery:
            for index, fd in enumerate(fds):
                link = Link(trio.SocketStream(trio.socket.from_stdlib_socket(socket.socket(fileno=fd))))
                link.handlers.update(service.handlers(index))
                service.attach(index, link)
                nursery.start_soon(link.run)
        assert service.book is not None
        return {"cpu": cpu_seconds(os.getpid()) - cpu0, "peak_leased": service.book.peak_leased}

    out.put(trio.run(main))


def run_plain(budget: int, tasks: int, seconds: float) -> list[dict[str, float]]:
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    proc = ctx.Process(target=plain_worker, args=(budget, tasks, seconds, out))
    proc.start()
    result = out.get(timeout=120)
    proc.join(30)
    return [result]


def run_lease(workers: int, budget: int, tasks: int, seconds: float) -> tuple[list[dict[str, float]], dict[str, float]]:
    ctx = multiprocessing.get_context("fork")
    out, owner_out = ctx.Queue(), ctx.Queue()
    pairs = [socket.socketpair() for _ in range(workers)]
    owner_ends, worker_ends = [a.fileno() for a, _ in pairs], [b.fileno() for _, b in pairs]
    owner_proc = ctx.Process(target=owner, args=(budget, owner_ends, worker_ends, owner_out))
    owner_proc.start()
    procs = [
        ctx.Process(
            target=lease_worker,
            args=(i, workers, budget, tasks, seconds, fd, [f for f in owner_ends + worker_ends if f != fd], out),
        )
        for i, fd in enumerate(worker_ends)
    ]
    for proc in procs:
        proc.start()
    for a, b in pairs:
        a.close()
        b.close()
    results = [out.get(timeout=120) for _ in procs]
    owner_result = owner_out.get(timeout=60)
    for proc in [*procs, owner_proc]:
        proc.join(30)
    return results, owner_result


def report(
    way: str, workers: int, budget: int, results: list[dict[str, float]], owner: dict[str, float] | None
) -> None:
    requests = sum(r["requests"] for r in results)
    asks = sum(r["asks"] for r in results)
    waited = sum(r["waited"] for r in results)
    recorded = sum(r["recorded"] for r in results)
    cpu_us = [1e6 * r["cpu"] / max(1, r["requests"]) for r in results]
    line = (
        f"{way:5} N={workers} budget={budget // MIB:>2} MiB  requests {requests:>8}  asks {asks:>6}"
        f" ({100 * asks / max(1, requests):.3f}%)  waited {100 * waited / max(1, requests):.3f}%"
        f"  WAITs recorded {int(recorded):>5}  CPU/request {min(cpu_us):.1f}-{max(cpu_us):.1f} us"
    )
    if owner is not None:
        bound = budget + MAX_REQUEST - 1
        line += (
            f"  owner CPU {1e3 * owner['cpu']:.0f} ms in all"
            f"  peak leased {owner['peak_leased'] / MIB:.2f} MiB (bound {bound / MIB:.2f})"
        )
        assert owner["peak_leased"] <= bound
    print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--tasks", type=int, default=32, help="tasks per worker (requests in flight)")
    parser.add_argument("--workers", default="2,4")
    parser.add_argument("--budgets-mib", default="16,2")
    args = parser.parse_args()
    print(f"# load average before: {load_average()}; {args.tasks} tasks per process, {args.seconds} s", flush=True)
    for budget in [int(b) * MIB for b in args.budgets_mib.split(",")]:
        report("plain", 1, budget, run_plain(budget, args.tasks, args.seconds), None)
        for workers in [int(w) for w in args.workers.split(",")]:
            results, owner_result = run_lease(workers, budget, args.tasks, args.seconds)
            report("lease", workers, budget, results, owner_result)
            report("plain", 1, budget, run_plain(budget, args.tasks, args.seconds), None)  # back to back


if __name__ == "__main__":
    main()
