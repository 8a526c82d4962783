"""``queued.max.request.bytes`` as one budget across ``workers: N`` (issue 29): the owner
leases pool bytes to the workers (docs/workers.md, "The pool: leases").

Requests of one size X against a budget of 4 X, from raw connections whose worker is read
from the proxy's own log (tests/workers_util.py): a *holder* sends a frame's length and the
start of its body and no more, so the proxy holds X bytes for it (KIP-72 reserves a body's
memory before reading it); a *waiter* sends a whole request (an ApiVersions padded to X
bytes) that is answered once the pool grants its bytes. What the proxy admitted is read from
its own record: the owner's lease gauges on /metrics, and the audit's WAIT decisions, which a
worker records (naming the connection) only when the budget is found all leased."""

from __future__ import annotations

import json
import os
import select
import signal
import threading
import time
from typing import Any

import pytest
from kio.index import load_request_schema

from tests.clients import create_topic, produce, unique
from tests.conftest import wait_until
from tests.integration.test_memory_pool_through_proxy import big_batches
from tests.raw_kafka import RawConnection, frame
from tests.workers_util import client_address, served_by, start_workers, worker_of, worker_pids

API_VERSIONS = 18
KIB = 1024
X = 256 * KIB  # every request's size, and socket.request.max.bytes
BUDGET = 4 * X
POLICIES = {"queued.max.request.bytes": BUDGET, "socket.request.max.bytes": X}


def request_of_x_bytes(correlation_id: int) -> bytes:
    """An ApiVersions request whose frame announces exactly X bytes (a long client software name)."""
    schema = load_request_schema(API_VERSIONS, 3)
    pad = X - 100
    for _ in range(5):
        data = frame(
            API_VERSIONS, 3, correlation_id, schema(client_software_name="a" * pad, client_software_version="1")
        )
        pad += X - (len(data) - 4)
    assert len(data) - 4 == X
    return data


def hold(conn: RawConnection) -> None:
    """The length of an X-byte request and 60 bytes of it: the proxy reserves X for the rest."""
    conn.send(request_of_x_bytes(0)[:64])


def pool_waits(proxy: Any, mode: str = "enforce") -> dict[str, str]:
    """Client address -> connection id of every WAIT on the budget (enforced, or in observe mode
    would-be), from the audit (its events are log lines here: no audit.path)."""
    found = {}
    decoder = json.JSONDecoder()
    for line in proxy.log().splitlines():
        start = line.find("audit {")
        if start < 0:
            continue
        event, _ = decoder.raw_decode(line, start + len("audit "))
        if (event.get("policy"), event.get("action"), event.get("limit_key"), event.get("mode")) == (
            "memory_pool",
            "wait",
            "queued.max.request.bytes",
            mode,
        ):
            found[event["client_address"]] = event["conn_id"]
    return found


def leased(proxy: Any) -> float:
    return proxy.metric("kafka_admission_memory_pool_leased_bytes")


def answered(conn: RawConnection, correlation_id: int) -> bool:
    response = conn.read_response(API_VERSIONS, 3)
    return response.header.correlation_id == correlation_id and response.body.error_code == 0


def unanswered(conn: RawConnection) -> bool:
    readable, _, _ = select.select([conn.sock], [], [], 0)
    return not readable


def connections_by_worker(proxy: Any, workers: int, each: int) -> dict[int, list[RawConnection]]:
    """Connections (nothing sent yet) until every worker has ``each``, by the worker that
    accepted them (the kernel spreads them: SO_REUSEPORT)."""
    by_worker: dict[int, list[RawConnection]] = {w: [] for w in range(workers)}
    extra = []
    for _ in range(60 * workers):
        if all(len(conns) >= each for conns in by_worker.values()):
            break
        conn = RawConnection(proxy.bootstrap)
        worker = worker_of(proxy, conn)
        (by_worker[worker] if len(by_worker[worker]) < each else extra).append(conn)
    for conn in extra:
        conn.close()
    assert all(len(conns) >= each for conns in by_worker.values()), {w: len(c) for w, c in by_worker.items()}
    return by_worker


def fill_worker_1(proxy: Any, by_worker: dict[int, list[RawConnection]], count: int) -> None:
    """More connections until worker 1 has ``count`` (the others' kept in ``by_worker[0]``, to close)."""
    for _ in range(30 * count):
        if len(by_worker[1]) == count:
            break
        conn = RawConnection(proxy.bootstrap)
        (by_worker[1] if worker_of(proxy, conn) == 1 else by_worker[0]).append(conn)
    assert len(by_worker[1]) == count


@pytest.mark.parametrize("workers", [2, 4])
def test_the_budget_holds_across_workers_and_a_waiter_resumes_when_another_worker_releases(
    tansu: Any, start_proxy: Any, workers: int
) -> None:
    proxy = start_workers(start_proxy, tansu.bootstrap, workers, policies=POLICIES)
    by_worker = connections_by_worker(proxy, workers, 4 // workers + 1)  # holders and a waiter in each
    try:
        # Four holders, spread round the workers: the budget is taken, X each, exactly.
        holders = [by_worker[k % workers][k // workers] for k in range(4)]
        holder_workers = [k % workers for k in range(4)]
        for k, conn in enumerate(holders, 1):
            hold(conn)
            wait_until(lambda k=k: leased(proxy) == k * X)
        assert {worker_of(proxy, conn) for conn in holders} == set(range(min(workers, 4)))
        # One waiter in each worker: each waits, though its own worker may have had none in use.
        waiters = [by_worker[w][-1] for w in range(workers)]
        assert not set(map(id, waiters)) & set(map(id, holders))
        for w, conn in enumerate(waiters):
            conn.send(request_of_x_bytes(100 + w))
            wait_until(lambda conn=conn: client_address(conn) in pool_waits(proxy))
        waits = pool_waits(proxy)
        assert sorted(waits) == sorted(client_address(conn) for conn in waiters)  # the holders never waited
        assert [waits[client_address(conn)].split(":")[0] for conn in waiters] == [f"w{w}" for w in range(workers)]
        assert leased(proxy) == BUDGET  # nothing admitted beyond the budget, in any worker
        assert proxy.metric("kafka_admission_memory_pool_lease_asks_waiting") == workers
        assert all(unanswered(conn) for conn in waiters)

        # Bytes come back in worker 1: the waiter that asked first, in worker 0, resumes.
        assert holder_workers[1] == 1
        holders[1].close()
        assert answered(waiters[0], 100)
        # Its answer gives its bytes back in worker 0, and so on: every waiter resumes in turn.
        for w in range(1, workers):
            assert answered(waiters[w], 100 + w)
        wait_until(lambda: proxy.metric("kafka_admission_memory_pool_lease_asks_waiting") == 0)
        assert leased(proxy) <= BUDGET + X - 1
        assert proxy.metric("kafka_admission_memory_pool_depleted_seconds_total") > 0
    finally:
        for conns in by_worker.values():
            for conn in conns:
                conn.close()


@pytest.mark.parametrize("workers", [2, 4])
def test_observe_mode_records_a_would_be_wait_for_exactly_each_request_over_the_budget(
    tansu: Any, start_proxy: Any, workers: int
) -> None:
    """memory.pool.mode: observe. Six requests of X against a budget of 4 X, sent at once on six
    connections of one worker: each is granted at once (the worker runs past its lease while it
    asks the owner for more), and the two the budget has no room for are recorded as would-be
    WAITs, as one process records them: not none (the lease's asks answered), not six."""
    proxy = start_workers(start_proxy, tansu.bootstrap, workers, policies={**POLICIES, "memory.pool.mode": "observe"})
    by_worker = connections_by_worker(proxy, workers, 1)
    try:
        fill_worker_1(proxy, by_worker, 6)
        start = request_of_x_bytes(0)[:64]
        for conn in by_worker[1]:  # back to back: the worker reads them before its first ask is answered
            conn.send(start)
        wait_until(lambda: leased(proxy) == BUDGET)
        wait_until(lambda: len(pool_waits(proxy, "observe")) >= 2)
        time.sleep(0.5)  # a third would-be WAIT, had one been recorded, is in the log by now
        waits = pool_waits(proxy, "observe")
        assert len(waits) == 2, waits
        assert all(conn_id.startswith("w1:") for conn_id in waits.values())
        assert proxy.metric("kafka_admission_memory_pool_waiting_requests") == 0  # nobody waits in observe mode
        assert pool_waits(proxy) == {}  # and nothing was enforced
    finally:
        for conns in by_worker.values():
            for conn in conns:
                conn.close()


@pytest.mark.parametrize("workers", [2, 4])
@pytest.mark.kills_workers
def test_a_killed_workers_bytes_go_to_a_waiter_in_another_worker(tansu: Any, start_proxy: Any, workers: int) -> None:
    proxy = start_workers(start_proxy, tansu.bootstrap, workers, policies=POLICIES)
    by_worker = connections_by_worker(proxy, workers, 1)
    try:
        fill_worker_1(proxy, by_worker, 4)  # it holds the whole budget
        for k, conn in enumerate(by_worker[1], 1):
            hold(conn)
            wait_until(lambda k=k: leased(proxy) == k * X)
        waiter = by_worker[0][0]
        assert worker_of(proxy, waiter) == 0
        waiter.send(request_of_x_bytes(7))
        wait_until(lambda: client_address(waiter) in pool_waits(proxy))
        assert unanswered(waiter)
        os.kill(worker_pids(proxy)[1], signal.SIGKILL)
        assert answered(waiter, 7)  # worker 1's lease came back to the owner, and went to worker 0
        assert proxy.metric("kafka_admission_worker_released_total", what="pool_bytes") >= BUDGET
    finally:
        for conns in by_worker.values():
            for conn in conns:
                conn.close()


@pytest.mark.parametrize("workers", [2, 4])
def test_producers_on_every_worker_all_deliver_within_one_pools_bound(
    tansu: Any, start_proxy: Any, workers: int
) -> None:
    """Twenty confluent-kafka producers of ~900 KB batches through 2 or 4 workers, against a
    budget of 2 MiB: every record is delivered, the budget ran out (waits were recorded) and
    the bytes leased, hence admitted, never passed one MemoryPool's bound (2 MiB + 1 MiB - 1)."""
    mib = 1024 * KIB
    proxy = start_workers(
        start_proxy,
        tansu.bootstrap,
        workers,
        policies={"queued.max.request.bytes": 2 * mib, "socket.request.max.bytes": mib},
    )
    topic = unique("workers-pool")
    create_topic(proxy.bootstrap, topic, partitions=4)
    results: list[int] = []
    threads = [
        threading.Thread(target=big_batches, args=(proxy.bootstrap, topic, 30, 90_000, results)) for _ in range(20)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert results == [30] * 20
    assert set(served_by(proxy).values()) == set(range(workers))  # the producers' connections on every worker
    assert mib < proxy.metric("kafka_admission_memory_pool_leased_high_water_mark_bytes") <= 3 * mib - 1
    assert pool_waits(proxy)  # the budget ran out: requests waited for it
    wait_until(lambda: proxy.metric("kafka_admission_memory_pool_lease_asks_waiting") == 0)


@pytest.mark.parametrize("workers", [2, 4])
def test_300_slow_senders_across_workers_hold_the_budget_and_a_normal_client_is_served(
    tansu: Any, start_proxy: Any, workers: int
) -> None:
    """Slow senders announce 1 MiB and send 60 bytes of it: two hold the 2 MiB budget, whichever
    workers they landed on, every other waits (one ask per worker waits at the owner); when
    request.body.timeout.ms ends them, a producer is served."""
    mib = 1024 * KIB
    proxy = start_workers(
        start_proxy,
        tansu.bootstrap,
        workers,
        policies={
            "queued.max.request.bytes": 2 * mib,
            "socket.request.max.bytes": mib,
            "request.body.timeout.ms": 3000,
        },
    )
    topic = unique("workers-slow")
    create_topic(proxy.bootstrap, topic)
    senders = [RawConnection(proxy.bootstrap) for _ in range(300)]
    try:
        for sock in senders:
            sock.send(mib.to_bytes(4, "big") + b"\0\x00\0\x09" + b"\0" * 60)  # a Produce header's start
        wait_until(lambda: proxy.metric("kafka_admission_memory_pool_lease_asks_waiting") == workers, timeout=20)
        assert 2 * mib <= leased(proxy) <= 3 * mib - 1
        assert set(served_by(proxy).values()) == set(range(workers))
        wait_until(lambda: len(pool_waits(proxy)) >= 250, timeout=20)  # the audit names the waiting ones
        started = time.monotonic()
        assert produce(proxy.bootstrap, topic, 10) == 10  # served once the stalled requests time out
        assert time.monotonic() - started < 30
        assert proxy.metric("kafka_admission_memory_pool_lease_asks_waiting") == 0
    finally:
        for sock in senders:
            sock.close()
