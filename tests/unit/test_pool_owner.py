"""The pool's budget across workers over real links (Link.pair, one trio process): one
PoolOwner and worker-side LeasedPoolGates, wired as the supervisor and the workers wire them."""

from __future__ import annotations

import math
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
import trio
import trio.testing

from policies.mode import Mode
from policies.pool_leases import LeasedMemoryPool, lease_size
from proxy.config.model import parse_config
from proxy.evidence.audit import AuditSink
from proxy.evidence.decisions import NOWHERE, DecisionRecorder
from proxy.evidence.metrics import Metrics
from proxy.serve.pool_gate import LeasedPoolGate
from proxy.workers.link import Link
from proxy.workers.owner_pool import PoolOwner

KIB = 1024
MIB = 1024 * KIB


def config(capacity: int, max_request: int, **policies: object):  # type: ignore[no-untyped-def]
    return parse_config(
        {
            "mode": "sidecar",
            "upstream": {"bootstrap_servers": ["127.0.0.1:9092"]},
            "listeners": [{"name": "l", "bind": "127.0.0.1:1"}],
            "policies": {"queued.max.request.bytes": capacity, "socket.request.max.bytes": max_request, **policies},
        }
    )


@dataclass
class Worker:
    index: int
    gate: LeasedPoolGate
    link: Link  # the worker's end
    scope: trio.CancelScope
    metrics: Metrics

    def reserve(self, conn: str, size: int) -> tuple[bool, int]:
        """(granted now, ticket)."""
        admission = self.gate.reserve(conn, size, trio.current_time(), NOWHERE)
        assert admission.ticket is not None
        return not admission.waits, admission.ticket

    async def take(self, conn: str, size: int) -> int:
        """A request that holds its bytes (at once, or after the owner granted them)."""
        now, ticket = self.reserve(conn, size)
        if not now:
            with trio.fail_after(5):
                await self.gate.wait_for(ticket)
        return ticket

    def release(self, ticket: int) -> None:
        self.gate.release(ticket, trio.current_time())


@asynccontextmanager
async def cluster(
    workers: int, capacity: int, max_request: int, **policies: object
) -> AsyncIterator[tuple[PoolOwner, list[Worker]]]:
    cfg = config(capacity, max_request, **policies)
    owner = PoolOwner(cfg)
    async with trio.open_nursery() as nursery:
        made = []
        for index in range(workers):
            made.append(await nursery.start(_worker, owner, index, workers, cfg))
        yield owner, made
        nursery.cancel_scope.cancel()


async def _worker(owner: PoolOwner, index: int, workers: int, cfg, task_status) -> None:  # type: ignore[no-untyped-def]
    owner_end, worker_end = Link.pair()
    owner_end.handlers.update(owner.handlers(index))
    owner.attach(index, owner_end)
    metrics = Metrics()
    policies = cfg.policies
    pool = LeasedMemoryPool(
        policies.queued_max_request_bytes,
        policies.socket_request_max_bytes,
        lease_size(policies.queued_max_request_bytes, workers),
        policies.queued_max_request_bytes_per_connection,
        Mode.ENFORCE,
    )
    gate = LeasedPoolGate(pool, metrics, DecisionRecorder(metrics, AuditSink(cfg.audit, metrics)), None, worker_end)
    with trio.CancelScope() as scope:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(owner_end.run)
                nursery.start_soon(worker_end.run)
                nursery.start_soon(gate.run)
                task_status.started(Worker(index, gate, worker_end, scope, metrics))
        finally:
            owner.worker_gone(index)


async def settled() -> None:
    """Let every message in flight be delivered and handled."""
    await trio.testing.wait_all_tasks_blocked(0.01)


async def test_the_total_in_use_never_passes_the_budget() -> None:
    async with cluster(2, capacity=4 * MIB, max_request=MIB) as (owner, (a, b)):
        waiting = []
        for i in range(6):
            worker = (a, b)[i % 2]
            _now, ticket = worker.reserve(f"c{i}", MIB)
            await settled()
            waiting.append((worker, ticket))  # granted at once, later, or never (the last two)
        assert a.gate.pool.used + b.gate.pool.used == 4 * MIB
        assert a.gate.pool.waiting + b.gate.pool.waiting == 2
        assert owner.book is not None and owner.book.leased <= 4 * MIB + MIB - 1


async def test_a_request_waiting_in_worker_a_resumes_when_worker_b_releases() -> None:
    async with cluster(2, capacity=4 * MIB, max_request=MIB) as (owner, (a, b)):
        held = [await b.take(f"b{i}", MIB) for i in range(4)]
        now, ticket = a.reserve("a", MIB)
        assert not now
        await settled()
        assert a.gate.pool.waiting == 1  # b holds the whole budget
        assert owner.book is not None and owner.book.recalling
        b.release(held[0])
        with trio.fail_after(5):
            await a.gate.wait_for(ticket)
        assert a.gate.pool.used == MIB and b.gate.pool.used == 3 * MIB
        await settled()
        assert not owner.book.recalling and a.gate.pool.recalled is False


async def test_unused_bytes_in_an_idle_worker_are_recalled_for_a_waiter_in_another() -> None:
    async with cluster(2, capacity=4 * MIB, max_request=512 * KIB) as (_owner, (a, b)):
        for ticket in [await b.take(f"b{i}", 512 * KIB) for i in range(8)]:
            b.release(ticket)
        await settled()
        assert 0 < b.gate.pool.lease <= 2 * b.gate.pool.lease_size  # kept, unused: b is idle now
        held_a = [await a.take(f"a{i}", 512 * KIB) for i in range(8)]  # the last needs b's lease
        assert a.gate.pool.used == 4 * MIB and b.gate.pool.lease == 0
        for ticket in held_a:
            a.release(ticket)


async def test_a_dead_workers_lease_returns_and_a_waiter_elsewhere_is_granted() -> None:
    async with cluster(3, capacity=3 * MIB, max_request=MIB) as (owner, (a, _b, c)):
        for i in range(3):
            await a.take(f"a{i}", MIB)
        now, ticket = c.reserve("c", MIB)
        assert not now
        await settled()
        assert c.gate.pool.waiting == 1
        a.scope.cancel()  # worker a's process ends: the owner sees its link end
        with trio.fail_after(5):
            await c.gate.wait_for(ticket)
        assert owner.book is not None and owner.book.lease(0) == 0
        assert c.gate.pool.used == MIB


def waits_recorded(worker: Worker) -> float:
    """The WAIT decisions the worker recorded for the budget (kafka_admission_decisions_total)."""
    labels = {"listener": "", "policy": "memory_pool", "action": "wait", "limit": "queued.max.request.bytes"}
    return (
        worker.metrics.registry.get_sample_value("kafka_admission_decisions_total", {**labels, "mode": "enforce"})
        or 0.0
    )


async def test_a_wait_for_the_lease_alone_is_no_decision_a_wait_for_the_budget_is_one() -> None:
    async with cluster(2, capacity=4 * MIB, max_request=MIB) as (_owner, (a, b)):
        held = [await a.take(f"a{i}", MIB) for i in range(4)]  # each waited for a's lease to grow
        assert waits_recorded(a) == 0
        _, ticket = b.reserve("b", MIB)
        await settled()
        assert waits_recorded(b) == 1  # the budget is all leased: a wait, as in one process
        a.release(held[0])
        with trio.fail_after(5):
            await b.gate.wait_for(ticket)
        assert waits_recorded(a) + waits_recorded(b) == 1


async def test_a_waiter_its_share_held_back_asks_the_owner_once_its_connection_releases_during_a_recall() -> None:
    share = {"queued.max.request.bytes.per.connection": MIB}
    async with cluster(3, capacity=4 * MIB, max_request=MIB, **share) as (owner, (a, b, c)):
        assert owner.book is not None
        x = await a.take("x", MIB)
        a.release(await a.take("y", 512 * KIB))  # a keeps 512 KiB unused
        a.reserve("x", 512 * KIB)  # fits a's lease; x's share holds it back
        await settled()
        assert a.gate.pool.waiting == 1 and a.gate.pool.wanted() == 0
        for i in range(3):
            await b.take(f"b{i}", MIB)  # the last one over the budget (non-strict): 4.5 MiB leased
        b.reserve("b3", MIB)
        c.reserve("c0", MIB)
        await settled()
        assert owner.book.recalling and {worker for worker, _ in owner.book._queue} == {1, 2}
        a.release(x)  # under the recall x's bytes go back; its waiter now needs the owner's bytes
        await settled()
        asking = [worker for worker, _ in owner.book._queue]
        assert owner.book.recalling and len(asking) == 2  # one of b and c still waits: no news of the recall
        assert asking[-1] == 0  # a asked for its waiter
        assert a.gate.pool.waiting == 1


async def test_news_of_the_recall_older_than_what_a_worker_heard_is_ignored() -> None:
    # An answer read before a later tell may be handled after it: the epoch keeps the newer news.
    async with cluster(2, capacity=4 * MIB, max_request=MIB) as (_owner, (a, _b)):
        a.gate._recall(True, 2)
        a.gate._recall(False, 1)
        assert a.gate.pool.recalled
        a.gate._recall(False, 3)
        assert not a.gate.pool.recalled


async def test_a_reload_to_observe_lets_a_waiter_go_and_the_worker_asks_for_what_it_took() -> None:
    async with cluster(2, capacity=4 * MIB, max_request=MIB) as (owner, (a, b)):
        assert owner.book is not None
        for i in range(4):
            await a.take(f"a{i}", MIB)  # the budget, all leased
        _, ticket = b.reserve("b", MIB)
        await settled()
        assert b.gate.pool.waiting == 1
        b.gate.reconfigure(MIB, Mode.OBSERVE)
        with trio.fail_after(5):
            await b.gate.wait_for(ticket)
        assert b.gate.pool.used == MIB and b.gate.pool.lease == 0  # observe: granted beyond its lease
        await settled()
        assert owner.book.waiting == 1  # its ask for what it took waits for the budget, as before


async def test_a_wait_a_release_ends_before_any_ask_is_no_decision_and_is_forgotten() -> None:
    async with cluster(2, capacity=4 * MIB, max_request=MIB) as (_owner, (a, _b)):
        first = await a.take("a0", MIB)
        await settled()
        lease = a.gate.pool.lease
        _, ticket = a.reserve("a1", lease - MIB + 1)  # one byte too many
        a.release(first)  # before the asking task runs: granted from the lease
        with trio.fail_after(5):
            await a.gate.wait_for(ticket)
        await settled()
        assert waits_recorded(a) == 0 and not a.gate._unrecorded


def mixed_size(rng: random.Random) -> int:
    """bench/pool_leases.py's mix: 60% 100 B-1 KiB, 30% 1-64 KiB, 10% 64 KiB-1 MiB."""
    band = rng.random()
    low, high = (100, KIB) if band < 0.6 else (KIB, 64 * KIB) if band < 0.9 else (64 * KIB, MIB)
    return int(math.exp(rng.uniform(math.log(low), math.log(high))))


@pytest.mark.parametrize("seed", range(4))
async def test_a_tight_budget_under_a_mixed_load_never_stalls(seed: int) -> None:
    """Four workers, 32 requests in flight each, a budget of two of the largest requests, until
    every worker has completed 1,500: never are all tasks blocked while requests wait (a stall,
    as when recalled workers kept the unused bytes their own waiters could not use)."""
    async with cluster(4, capacity=2 * MIB, max_request=MIB) as (owner, workers):
        done = [0] * len(workers)
        finished = trio.Event()

        async def requests(worker: Worker, rng: random.Random, n: int) -> None:
            while True:
                admission = worker.gate.reserve(f"c{n % 8}", mixed_size(rng), trio.current_time(), NOWHERE)
                if admission.waits:
                    await worker.gate.wait_for(admission.ticket)  # type: ignore[arg-type]
                for _ in range(rng.randint(1, 8)):
                    await trio.lowlevel.checkpoint()
                worker.release(admission.ticket)  # type: ignore[arg-type]
                done[worker.index] += 1
                if min(done) >= 1500:
                    finished.set()

        async with trio.open_nursery() as nursery:
            for worker in workers:
                for n in range(32):
                    nursery.start_soon(requests, worker, random.Random(seed * 10000 + worker.index * 100 + n), n)
            with trio.move_on_after(60):
                async with trio.open_nursery() as watch:
                    watch.start_soon(lambda: _cancel_when(finished, watch.cancel_scope))
                    await trio.testing.wait_all_tasks_blocked(0.05)  # only in a stall: requests always run
                    watch.cancel_scope.cancel()
            waiting = [w.gate.pool.waiting for w in workers]
            nursery.cancel_scope.cancel()
        assert finished.is_set(), f"stalled: {waiting} waiting, {done} done, {owner.book and owner.book.waiting} asks"
        assert owner.book is not None and owner.book.peak_leased <= 3 * MIB - 1


async def _cancel_when(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


def test_with_the_pool_off_nothing_is_leased_and_only_the_capacity_is_shown() -> None:
    owner = PoolOwner(config(-1, MIB))
    assert owner.book is None and owner.handlers(0) == {}
    assert owner.worker_gone(0) == {"pool_bytes": 0}
    families = [family for collector in owner.collectors() for family in collector.collect()]
    assert [(f.name, f.samples[0].value) for f in families] == [("kafka_admission_memory_pool_capacity_bytes", -1)]
