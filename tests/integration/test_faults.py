"""Faults and floods against the proxy (a subprocess) in front of a real Tansu, with
real clients (confluent-kafka producers, raw sockets, client processes that are
stopped): what RELIABILITY.md promises, scenario by scenario. Each test prints the
figures it measured (``pytest -s``), latencies apart: they are measured in bench/
(storm_latency.py), not in a test that asserts none. The records-lost counts across a *broker*
restart need storage that survives it: tests/apache_kafka/test_apache_kafka_faults.py.

Short on purpose (the default suite): seconds of traffic, not minutes; `make soak`
is the long run.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from proxy.protocol.framing import RECEIVE_SIZE
from tests.clients import create_topic, unique
from tests.conftest import wait_until
from tests.faults import (
    ConnectionStorm,
    FaultyTansu,
    ProducerTraffic,
    Slowloris,
    StoppedClient,
    assert_exactly_once,
    consumed_values,
    serves,
    sockets_to,
)
from tests.raw_kafka import RawConnection, api_versions_frame, metadata_frame

MIB = 1024 * 1024


@pytest.fixture
def faulty_tansu() -> Iterator[FaultyTansu]:
    with FaultyTansu() as broker:
        yield broker


def figures(scenario: str, **measured: Any) -> None:
    """What a scenario measured, one line (``pytest -s``), for RELIABILITY.md."""
    load = os.getloadavg()[0]
    print(f"\nFIGURES {scenario}: " + ", ".join(f"{k}={v}" for k, v in measured.items()) + f", load={load:.1f}")


def test_broker_killed_and_restarted_under_traffic(faulty_tansu: FaultyTansu, start_proxy: Any) -> None:
    """Clients recover through the proxy; a request in flight when the broker dies gets a
    close, at once, not a hang; the proxy keeps no broker connection nobody uses."""
    proxy = start_proxy(faulty_tansu.bootstrap)
    pid, broker_port = proxy.process.pid, faulty_tansu.port
    topic = unique("kill")
    create_topic(proxy.bootstrap, topic)
    # Not idempotent: a restarted Tansu forgets producer ids (memory storage; the
    # Apache Kafka variant keeps them and counts every record).
    traffic = [
        ProducerTraffic(proxy.bootstrap, topic, name=f"p{i}", config={"enable.idempotence": False}).start()
        for i in range(3)
    ]
    with RawConnection(proxy.bootstrap, timeout=10) as in_flight:
        in_flight.send(api_versions_frame(1))
        in_flight.read_frame()
        wait_until(lambda: all(len(t.acked) >= 20 for t in traffic), timeout=20)
        held_before = sockets_to(pid, broker_port)
        faulty_tansu.stall()  # so that a request is surely in flight when it dies
        in_flight.send(metadata_frame(2))
        time.sleep(0.2)
        faulty_tansu.kill()
        started = time.monotonic()
        assert in_flight.closed_by_peer(), "the request in flight was neither answered nor closed"
        closed_in = time.monotonic() - started
    assert not serves(proxy.bootstrap)  # nothing behind the proxy: a clean close, no hang
    faulty_tansu.restart(down_for=1.0)
    acked = [len(t.acked) for t in traffic]
    try:
        wait_until(lambda: all(len(t.acked) > n + 20 for t, n in zip(traffic, acked, strict=True)), timeout=30)
    finally:
        for t in traffic:
            t.stop()  # flushes: asserts nothing hangs
    assert all(t.unflushed == 0 for t in traffic)
    # Each client connection the dead broker took with it was closed and counted (a reset).
    assert proxy.metric("kafka_admission_connection_failures_total", cause="broken") >= 1
    # Every client is gone: so is every broker connection (none leaked, none in CLOSE_WAIT).
    wait_until(lambda: sockets_to(pid, broker_port) == 0, timeout=10)
    assert proxy.metric("kafka_admission_connections_active") == 0
    assert proxy.process.poll() is None
    figures(
        "broker kill",
        upstream_held_under_traffic=held_before,
        in_flight_closed_in_s=round(closed_in, 3),
        acked=sum(len(t.acked) for t in traffic),
        upstream_held_after=0,
    )


def test_a_stalled_broker_resumes_and_every_record_is_there_once(faulty_tansu: FaultyTansu, start_proxy: Any) -> None:
    """SIGSTOP for 3 s under idempotent traffic: requests wait, nothing hangs for good, a
    request sent during the stall is answered after it, and every acknowledged record is
    read back once."""
    proxy = start_proxy(faulty_tansu.bootstrap)
    topic = unique("stall")
    create_topic(proxy.bootstrap, topic)
    traffic = [ProducerTraffic(proxy.bootstrap, topic, name=f"p{i}").start() for i in range(2)]
    wait_until(lambda: all(len(t.acked) >= 20 for t in traffic), timeout=20)
    with RawConnection(proxy.bootstrap, timeout=10) as conn:
        faulty_tansu.stall()
        stalled = [len(t.acked) for t in traffic]
        conn.send(metadata_frame(7))
        time.sleep(3)
        during = sum(len(t.acked) for t in traffic) - sum(stalled)
        faulty_tansu.resume()
        assert int.from_bytes(conn.read_frame()[4:8], "big") == 7  # answered late, not dropped
    wait_until(lambda: all(len(t.acked) > n + 20 for t, n in zip(traffic, stalled, strict=True)), timeout=20)
    for t in traffic:
        t.stop()
    assert [t.failed for t in traffic] == [[], []]
    acked = assert_exactly_once(traffic, consumed_values(proxy.bootstrap, topic, sum(len(t.acked) for t in traffic)))
    figures("broker stall 3 s", acked_during_stall=during, acked=acked, lost=0, duplicated=0)


def test_half_open_clients_are_closed_by_connections_max_idle_ms(tansu: Any, start_proxy: Any) -> None:
    """Clients that vanish without a FIN (stopped processes: their kernel still answers
    TCP): one idle, one that left responses unread in a full socket. Both are closed after
    connections.max.idle.ms, with their broker connections."""
    proxy = start_proxy(tansu.bootstrap, policies={"connections.max.idle.ms": 4000})
    pid = proxy.process.pid
    # The unread client first: it stops once the proxy stops reading it (1-2 s, more on a loaded
    # machine), which must not use up the idle one's connections.max.idle.ms before the counts below.
    clients = [StoppedClient(proxy.bootstrap, "unread")]
    try:
        assert clients[0].sent > 1000  # it got ahead of the proxy, which stopped reading it
        clients.append(StoppedClient(proxy.bootstrap, "idle"))
        assert proxy.metric("kafka_admission_connections_active") == 2
        assert sockets_to(pid, tansu.port) == 2
        started = time.monotonic()
        wait_until(lambda: proxy.metric("kafka_admission_connections_active") == 0, timeout=15)
        closed_in = time.monotonic() - started
        wait_until(lambda: sockets_to(pid, tansu.port) == 0, timeout=5)
        assert proxy.metric("kafka_admission_decisions_total", action="close", limit="connections.max.idle.ms") == 2
    finally:
        for client in clients:
            client.kill()
    figures("half-open clients", held=2, closed_within_s=round(closed_in, 1), idle_ms=4000)


def test_half_open_broker_connections_end_with_their_clients(faulty_tansu: FaultyTansu, start_proxy: Any) -> None:
    """A stalled broker keeps its connections open and answers nothing. A client that gives
    up on its request (librdkafka does after request.timeout.ms) takes the proxy's broker
    connection with it; one that waits is answered once the broker resumes; a client that
    vanished while its request waited is closed connections.max.idle.ms after the answer."""
    proxy = start_proxy(faulty_tansu.bootstrap, policies={"connections.max.idle.ms": 2000})
    pid, port = proxy.process.pid, faulty_tansu.port
    conns = [RawConnection(proxy.bootstrap, timeout=10) for _ in range(4)]
    stopped: StoppedClient | None = None
    try:
        for conn in conns:
            conn.send(api_versions_frame(1))
            conn.read_frame()
        faulty_tansu.stall()
        for conn in conns:
            conn.send(metadata_frame(2))
        stopped = StoppedClient(proxy.bootstrap, "request")
        wait_until(lambda: sockets_to(pid, port) == 5)
        for conn in conns[:3]:
            conn.close()  # gave up
        wait_until(lambda: sockets_to(pid, port) == 2, timeout=5)  # while the broker is still stopped
        # Busy connections are not idle: a newcomer that sends nothing, idle since after their
        # last request, is closed after connections.max.idle.ms; the waiting one and the
        # vanished one, idle longer if they counted as idle, stay.
        with RawConnection(proxy.bootstrap, timeout=10) as idle:
            assert idle.closed_by_peer(), "an idle connection outlived connections.max.idle.ms (2 s) by 8 s"
        assert proxy.metric("kafka_admission_decisions_total", action="close", limit="connections.max.idle.ms") == 1
        wait_until(lambda: proxy.metric("kafka_admission_connections_active") == 2)
        faulty_tansu.resume()
        assert int.from_bytes(conns[3].read_frame()[4:8], "big") == 2
        conns[3].close()
        wait_until(lambda: proxy.metric("kafka_admission_connections_active") == 0, timeout=10)
        wait_until(lambda: sockets_to(pid, port) == 0, timeout=5)
    finally:
        for conn in conns:
            conn.close()
        if stopped is not None:
            stopped.kill()
    figures("half-open broker", broker_connections_held_while_stalled=5, released_by_giving_up=3)


def test_a_storm_of_5000_connection_attempts_a_second_while_producers_keep_working(
    tansu: Any, start_proxy: Any
) -> None:
    """The producers' latency before and during the storm is measured by bench/storm_latency.py."""
    proxy = start_proxy(tansu.bootstrap)
    topic = unique("storm")
    create_topic(proxy.bootstrap, topic)
    traffic = [ProducerTraffic(proxy.bootstrap, topic, name=f"p{i}").start() for i in range(2)]
    wait_until(lambda: all(len(t.acked) >= 50 for t in traffic), timeout=20)
    at_storm = [len(t.acked) for t in traffic]
    storm = ConnectionStorm(proxy.bootstrap, rate=5000, seconds=3).start().result()
    during = [len(t.acked) - n for t, n in zip(traffic, at_storm, strict=True)]
    for t in traffic:
        t.stop()
    assert storm.attempts == 15000
    assert all(n > 0 for n in during), f"acknowledgements during the storm: {during}"
    assert [t.failed for t in traffic] == [[], []]
    wait_until(lambda: serves(proxy.bootstrap), timeout=30)


def test_500_slowloris_senders_hold_no_more_than_the_pool(tansu: Any, start_proxy: Any) -> None:
    """Each announces 1 MB and pushes 900 kB of it as fast as the proxy reads, then a byte
    at a time: 450 MB if the proxy read them all. The pool (KIP-72) lets 8 MiB in; the
    rest wait unread in the kernel. RSS stays within pool + one max request + per
    connection its state and the one receive (64 KiB) read before its length was known."""
    pool, max_request = 8 * MIB, MIB
    proxy = start_proxy(
        tansu.bootstrap,
        policies={
            "queued.max.request.bytes": pool,
            "socket.request.max.bytes": max_request,
            "request.body.timeout.ms": 15000,
        },
    )
    assert serves(proxy.bootstrap)
    rss_before = proxy.rss_kib()
    senders = Slowloris(proxy.bootstrap, count=500, size=1_000_000, interval=0.5, prefill=900_000).start()
    peak = rss_before
    try:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            peak = max(peak, proxy.rss_kib())
            time.sleep(0.1)
        waiting = proxy.metric("kafka_admission_memory_pool_waiting_requests")
        used = proxy.metric("kafka_admission_memory_pool_used_bytes")
    finally:
        senders.stop()
    # (Meanwhile a new client's request waits for pool memory too, as in Kafka: the pool
    # is shared. Once the senders go, memory returns.)
    wait_until(lambda: serves(proxy.bootstrap), timeout=10)
    grown = (peak - rss_before) * 1024
    overhead = 500 * (RECEIVE_SIZE + 16 * 1024)  # per connection: a first receive read ahead, and its state
    figures(
        "500 slowloris",
        rss_before_mib=round(rss_before / 1024, 1),
        rss_growth_mib=round(grown / MIB, 1),
        bound_mib=round((pool + max_request + overhead) / MIB, 1),
        pool_used_mib=round(used / MIB, 1),
        waiting_for_pool=int(waiting),
    )
    assert waiting >= 480  # the pool held them back
    assert used <= pool + max_request
    assert grown <= pool + max_request + overhead


def test_the_proxy_restarted_under_traffic_loses_no_acknowledged_record(
    faulty_tansu: FaultyTansu, start_proxy: Any
) -> None:
    """SIGTERM: the proxy stops accepting, answers what is in flight, exits 0; a new one
    starts on the same ports; idempotent producers carry on; every acknowledged record is
    read back exactly once."""
    proxy = start_proxy(faulty_tansu.bootstrap, extra_args=["--drain-timeout", "10"])
    topic = unique("restart")
    create_topic(proxy.bootstrap, topic)
    traffic = [ProducerTraffic(proxy.bootstrap, topic, name=f"p{i}").start() for i in range(3)]
    wait_until(lambda: all(len(t.acked) >= 30 for t in traffic), timeout=20)
    started = time.monotonic()
    proxy.signal(signal.SIGTERM)
    assert proxy.wait(timeout=15) == 0
    drained_in = time.monotonic() - started
    proxy.start()
    down_for = time.monotonic() - started
    acked = [len(t.acked) for t in traffic]
    wait_until(lambda: all(len(t.acked) > n + 30 for t, n in zip(traffic, acked, strict=True)), timeout=30)
    for t in traffic:
        t.stop()
    assert [t.failed for t in traffic] == [[], [], []]
    count = assert_exactly_once(traffic, consumed_values(proxy.bootstrap, topic, sum(len(t.acked) for t in traffic)))
    figures(
        "proxy restart",
        drained_in_s=round(drained_in, 2),
        port_closed_for_s=round(down_for, 2),
        acked=count,
        lost=0,
        duplicated=0,
    )
