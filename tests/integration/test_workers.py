"""``workers: N`` (issue 29): N worker processes on the same ports under one supervisor.
The kernel spreads connections over the workers (SO_REUSEPORT); a worker killed under
load is restarted while the others keep serving and an idempotent producer loses and
duplicates nothing; SIGHUP reloads every worker to one generation, counted once;
SIGTERM drains every worker. Which worker served a connection is read from the proxy's
own log (tests/workers_util.py)."""

from __future__ import annotations

import os
import re
import signal
import socket
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from demo.tansu import TansuBroker
from tests.audit_files import assert_valid, audit_files, read_events
from tests.clients import create_topic, unique
from tests.conftest import wait_until
from tests.faults import ProducerTraffic, assert_exactly_once, consumed_values
from tests.integration.test_graceful_shutdown import refuses_connections, topic_id
from tests.raw_kafka import RawConnection, api_versions_frame, fetch_frame, metadata_frame
from tests.workers_util import client_address, served_by, start_workers, worker_of, worker_pids

API_VERSIONS = 18


def round_trip(conn: RawConnection, correlation_id: int, client_id: str = "raw-test") -> int:
    """An ApiVersions round trip; the answer's error code."""
    conn.send(api_versions_frame(correlation_id, client_id=client_id))
    response = conn.read_response(API_VERSIONS, 3)
    assert response.header.correlation_id == correlation_id
    return int(response.body.error_code)


def connections_on_every_worker(proxy: Any, workers: int, count: int) -> dict[int, list[RawConnection]]:
    """``count`` connections that answered a round trip, by the worker that serves them; every
    worker has one. SO_REUSEPORT's hash leaves a worker without one with chance about
    workers * (1 - 1/workers)^count: 2^-15 for 16 on 2 workers, but 1 in 128 for 8, which CI met."""
    assert workers * (1 - 1 / workers) ** count < 1e-4, f"{count} connections may all miss a worker"
    by_worker: dict[int, list[RawConnection]] = {}
    for i in range(count):
        conn = RawConnection(proxy.bootstrap)
        assert round_trip(conn, i) == 0
        by_worker.setdefault(worker_of(proxy, conn), []).append(conn)
    assert sorted(by_worker) == list(range(workers)), {w: len(c) for w, c in by_worker.items()}
    return by_worker


def exited(pid: int) -> bool:
    """The process has exited (its sockets are closed), reaped or not yet."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


def close_all(by_worker: dict[int, list[RawConnection]]) -> None:
    for conns in by_worker.values():
        for conn in conns:
            conn.close()


@pytest.mark.parametrize("workers", [2, 4])
def test_connections_spread_over_the_workers_and_each_is_served(tansu: Any, start_proxy: Any, workers: int) -> None:
    proxy = start_workers(start_proxy, tansu.bootstrap, workers)
    assert sorted(worker_pids(proxy)) == list(range(workers))
    conns = [RawConnection(proxy.bootstrap) for _ in range(32)]
    try:
        for i, conn in enumerate(conns):
            assert round_trip(conn, i) == 0
        landed = Counter(worker_of(proxy, conn) for conn in conns)
    finally:
        for conn in conns:
            conn.close()
    assert set(landed) <= set(range(workers))
    assert len(landed) >= 2, f"every connection on one worker: {landed}"
    status, _ = proxy.get("/readyz")
    assert status == 200


@pytest.mark.kills_workers
def test_a_killed_worker_is_restarted_and_an_idempotent_producer_loses_and_duplicates_nothing(
    tansu: Any, start_proxy: Any
) -> None:
    """SIGKILL a worker while three idempotent producers run: the connections it held end,
    those of the other worker keep answering, the supervisor restarts it (counted), and every
    acknowledged record is read back exactly once."""
    proxy = start_workers(start_proxy, tansu.bootstrap, 2)
    topic = unique("workers-kill")
    create_topic(proxy.bootstrap, topic)
    traffic = [ProducerTraffic(proxy.bootstrap, topic, name=f"p{i}").start() for i in range(3)]
    by_worker: dict[int, list[RawConnection]] = {}
    try:
        wait_until(lambda: all(len(t.acked) >= 20 for t in traffic), timeout=20)
        by_worker = connections_on_every_worker(proxy, 2, 16)
        ours = {client_address(conn) for conns in by_worker.values() for conn in conns}
        producers = Counter(w for peer, w in served_by(proxy).items() if peer not in ours)
        # The worker that took the most producer connections: the producers lose connections too.
        victim = max(range(2), key=lambda w: producers[w])
        assert producers[victim] >= 1, producers
        survivor = 1 - victim
        pid = worker_pids(proxy)[victim]
        os.kill(pid, signal.SIGKILL)
        for conn in by_worker[victim]:
            assert conn.closed_by_peer(), "a connection of the killed worker is still open"
        for i, conn in enumerate(by_worker[survivor]):
            assert round_trip(conn, 100 + i) == 0  # the other worker's connections keep working
        wait_until(lambda: proxy.metric("kafka_admission_worker_restarts_total", worker=str(victim)) == 1)
        wait_until(lambda: worker_pids(proxy)[victim] != pid, timeout=15)
        acked = [len(t.acked) for t in traffic]
        wait_until(lambda: all(len(t.acked) > n + 20 for t, n in zip(traffic, acked, strict=True)), timeout=30)
    finally:
        close_all(by_worker)
        for t in traffic:
            t.stop()
    assert [t.failed for t in traffic] == [[], [], []]
    assert all(t.unflushed == 0 for t in traffic)
    assert_exactly_once(traffic, consumed_values(proxy.bootstrap, topic, sum(len(t.acked) for t in traffic)))
    assert proxy.metric("kafka_admission_worker_restarts_total") == 1
    assert f"worker {victim} exited with status -9; restarting it" in proxy.log()
    assert proxy.get("/readyz")[0] == 200


@pytest.mark.kills_workers
def test_sighup_reloads_every_worker_to_one_generation_counted_once(tansu: Any, start_proxy: Any) -> None:
    """A connection open on each worker sees the reloaded limit at its next request; the reload
    is one outcome, not one per worker; a worker restarted afterwards runs the new generation."""
    proxy = start_workers(start_proxy, tansu.bootstrap, 2)
    by_worker = connections_on_every_worker(proxy, 2, 16)
    long_id = "c" * 250
    try:
        for worker, conns in by_worker.items():
            assert round_trip(conns[0], 10 + worker, long_id) == 0  # no limit yet
        before = proxy.reloads()
        proxy.reload(**{"resource.identifier.limit.enable": True})
        after = proxy.reloads()
        assert after["success"] == before["success"] + 1
        assert sum(after.values()) == sum(before.values()) + 1
        for worker, conns in by_worker.items():
            assert round_trip(conns[0], 20 + worker, long_id) == 42  # INVALID_REQUEST: over the limit
        for worker in (0, 1):
            assert f"config reloaded: generation 2 applied worker={worker}" in proxy.log()
        # A worker restarted after the reload starts from the supervisor's generation, not the file's.
        os.kill(worker_pids(proxy)[0], signal.SIGKILL)
        wait_until(lambda: proxy.metric("kafka_admission_worker_restarts_total", worker="0") == 1)
        wait_until(lambda: "worker 0 serving pid" in proxy.log().rsplit("worker 0 exited", 1)[1], timeout=15)
        on_zero = [c for c in (RawConnection(proxy.bootstrap) for _ in range(16)) if worker_of(proxy, c) == 0]
        assert on_zero, "no new connection landed on the restarted worker"
        assert round_trip(on_zero[0], 30, long_id) == 42
        for conn in on_zero:
            conn.close()
    finally:
        close_all(by_worker)
    assert proxy.reloads() == after  # the restart reloaded nothing


def test_sigterm_drains_every_worker_and_exits_0(tansu: Any, start_proxy: Any) -> None:
    """A Fetch parked at the broker in each worker is answered after SIGTERM; no new
    connection is accepted; the drained connections are closed; the supervisor exits 0."""
    proxy = start_workers(start_proxy, tansu.bootstrap, 2, extra_args=["--drain-timeout", "30"])
    topic = f"empty-{uuid.uuid4().hex[:8]}"
    create_topic(proxy.bootstrap, topic)
    by_worker = connections_on_every_worker(proxy, 2, 16)
    parked = [conns[0] for conns in by_worker.values()]
    try:
        for i, conn in enumerate(parked):
            tid = topic_id(conn, topic)
            conn.send(fetch_frame(70 + i, tid, max_wait_ms=2000))
        time.sleep(0.3)  # the Fetches are now parked at the broker
        proxy.signal(signal.SIGTERM)
        wait_until(lambda: refuses_connections(proxy.bootstrap), timeout=5)
        for i, conn in enumerate(parked):
            response = conn.read_response(1, 13)
            assert (response.header.correlation_id, response.body.error_code) == (70 + i, 0)
            assert conn.closed_by_peer()
    finally:
        close_all(by_worker)
    assert proxy.wait(timeout=15) == 0
    for worker in (0, 1):
        assert f"draining in-flight requests worker={worker}" in proxy.log()


@pytest.mark.kills_workers
def test_a_worker_drained_by_sigterm_tells_the_owner_what_it_held_before_it_exits(tansu: Any, start_proxy: Any) -> None:
    """SIGTERM to one worker (not to the proxy): it drains, and closes the connections whose
    Fetches are still parked at the drain timeout. Their closes, their pool bytes and its lease
    reach the owner as the worker's own tells before it exits, so the supervisor has nothing
    left to release when it sees it gone, and the counts are the other worker's connections."""
    proxy = start_workers(
        start_proxy,
        tansu.bootstrap,
        2,
        extra_args=["--drain-timeout", "1"],
        policies={"queued.max.request.bytes": 1 << 20, "socket.request.max.bytes": 1 << 20},
    )
    topic = f"empty-{uuid.uuid4().hex[:8]}"
    create_topic(proxy.bootstrap, topic)
    by_worker = connections_on_every_worker(proxy, 2, 16)
    victim, survivor = 0, 1
    try:
        for i, conn in enumerate(by_worker[victim]):
            conn.send(fetch_frame(70 + i, topic_id(conn, topic), max_wait_ms=10000))
        wait_until(lambda: proxy.metric("kafka_admission_connections_counted_busy") == len(by_worker[victim]))
        os.kill(worker_pids(proxy)[victim], signal.SIGTERM)
        wait_until(lambda: proxy.metric("kafka_admission_worker_restarts_total", worker=str(victim)) == 1, timeout=15)
        assert f"worker {victim} exited with status 0; restarting it" in proxy.log()
        assert "drain time over; closing" in proxy.log()  # the busy connections were closed by the drain's end
        for conn in by_worker[victim]:
            assert conn.closed_by_peer()
        released = {labels["what"]: value for labels, value in proxy.samples("kafka_admission_worker_released_total")}
        assert released == {"connections": 0, "pool_bytes": 0, "group_joins": 0}
        assert proxy.metric("kafka_admission_connections_counted") == len(by_worker[survivor])
        assert proxy.metric("kafka_admission_memory_pool_leased_bytes") == proxy.metric(
            "kafka_admission_memory_pool_lease_bytes"
        )  # the owner's book: the leases the live workers hold, nothing of the drained one
    finally:
        close_all(by_worker)


def test_each_worker_writes_audit_files_of_its_own_and_its_connection_ids_name_it(
    tansu: Any, start_proxy: Any, tmp_path: Path
) -> None:
    """Two workers sharing one audit directory each write as an instance of their own
    (``<instance>-w<i>``), so neither finishes, numbers or deletes the other's files; the
    connection ids say which worker held each connection. Each open event is the owner's, with
    its counts, under the proxy's instance; each close is its worker's."""
    audit = tmp_path / "audit"
    proxy = start_workers(start_proxy, tansu.bootstrap, 2, audit={"path": str(audit), "instance_id": "px"})
    by_worker = connections_on_every_worker(proxy, 2, 16)
    close_all(by_worker)
    proxy.signal(signal.SIGTERM)
    assert proxy.wait(timeout=15) == 0
    events = read_events(audit, finished_only=True)
    assert_valid(events)
    opens = [e for e in events if e["type"] == "connection" and e["event"] == "open"]
    closes = [e for e in events if e["type"] == "connection" and e["event"] == "close"]
    assert len(opens) == len(closes) == 16
    assert {e["instance"] for e in opens} == {"px"}
    assert Counter(e["conn_id"][:3] for e in opens) == Counter({f"w{w}:": len(conns) for w, conns in by_worker.items()})
    assert Counter(e["instance"] for e in closes) == Counter({f"px-w{w}": len(c) for w, c in by_worker.items()})
    assert all(e["conn_id"].startswith(f"w{e['instance'][-1]}:") for e in closes)
    # ... beside the supervisor's, the proxy's own (its connections windows: test_workers_evidence.py)
    instances = {re.sub(r"-\d{8}T\d{6}Z-\d{6,}\.jsonl$", "", path.name) for path in audit_files(audit)}
    assert instances == {"px", "px-w0", "px-w1"}


def test_workers_exit_when_the_supervisor_is_killed(tansu: Any, start_proxy: Any) -> None:
    """Without the owner of the shared limits a worker cannot keep them: it sees its link end
    and exits (systemd or Kubernetes then restarts the whole proxy)."""
    proxy = start_workers(start_proxy, tansu.bootstrap, 2)
    pids = worker_pids(proxy)
    assert sorted(pids) == [0, 1]
    proxy.signal(signal.SIGKILL)
    proxy.wait(timeout=5)
    wait_until(lambda: all(exited(pid) for pid in pids.values()), timeout=10)
    assert "the supervisor is gone; worker exiting" in proxy.log()


@pytest.mark.kills_workers
def test_a_worker_that_keeps_dying_is_restarted_after_a_growing_pause(tansu: Any, start_proxy: Any) -> None:
    """A worker that dies within seconds of its start is not restarted in a tight loop."""
    proxy = start_workers(start_proxy, tansu.bootstrap, 2)
    for deaths, pause in ((1, "0.5s"), (2, "1s")):
        pid = worker_pids(proxy)[0]
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda deaths=deaths: proxy.metric("kafka_admission_worker_restarts_total", worker="0") == deaths)
        assert f"worker 0 exited with status -9; restarting it in {pause}" in proxy.log()
        wait_until(lambda pid=pid: worker_pids(proxy)[0] != pid, timeout=15)
    assert proxy.metric("kafka_admission_worker_restarts_total", worker="1") == 0
    assert proxy.get("/readyz")[0] == 200


@pytest.mark.kills_workers
def test_while_every_worker_restarts_no_other_process_takes_the_ports(tansu: Any, start_proxy: Any) -> None:
    """The supervisor holds the ports it claimed for its workers (proxy/workers/port_claims.py): with
    both workers killed at once, before their restart (half a second after a death this early), a
    process that binds the bootstrap port or a learned broker's node port fails, as it does while the
    workers serve them; and the restarted workers serve both."""
    proxy = start_workers(start_proxy, tansu.bootstrap, 2)
    node_port = int(proxy.config["listeners"][0]["node_port_base"]) + TansuBroker.NODE_ID
    with RawConnection(proxy.bootstrap) as conn:  # a worker learns the broker: its node port opens
        conn.send(metadata_frame(1))
        conn.read_response(3, 12)
    wait_until(lambda: proxy.log().count(f"bind=127.0.0.1:{node_port} ") == 2)  # in each worker
    pids = worker_pids(proxy)
    for pid in pids.values():
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: all(exited(pid) for pid in pids.values()), timeout=5, interval=0.01)
    for port in (int(proxy.bootstrap.rsplit(":", 1)[1]), node_port):
        with socket.socket() as other:
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a trio listener binds
            with pytest.raises(OSError, match="Address already in use"):
                other.bind(("127.0.0.1", port))
    assert all(worker_pids(proxy)[i] == pid for i, pid in pids.items()), "restarted before the binds: no test"
    wait_until(lambda: all(worker_pids(proxy)[i] != pid for i, pid in pids.items()), timeout=15)
    wait_until(lambda: proxy.get("/readyz")[0] == 200)
    for address in (proxy.bootstrap, f"127.0.0.1:{node_port}"):
        with RawConnection(address) as conn:
            assert round_trip(conn, 2) == 0


def test_a_node_port_another_proxys_workers_serve_is_not_joined(tansu: Any, start_proxy: Any) -> None:
    """Two proxies whose node_port_base overlap: the second one's supervisor finds broker 111's node
    port in use before any of its workers binds it (each binds with SO_REUSEPORT, which would join
    the first proxy's workers and take half of their clients without an error). It logs it as one
    process does, opens it in no worker, and every client of the port reaches the first proxy."""
    first = start_workers(start_proxy, tansu.bootstrap, 2)
    base = int(first.config["listeners"][0]["node_port_base"])
    node_port = base + TansuBroker.NODE_ID
    second = start_workers(start_proxy, tansu.bootstrap, 2, listeners=[{"name": "external", "node_port_base": base}])
    for proxy in (first, second):
        with RawConnection(proxy.bootstrap) as conn:
            conn.send(metadata_frame(1))
            assert conn.read_response(3, 12).header.correlation_id == 1
    assert f"listening listener=external bind=127.0.0.1:{node_port} " in first.log()
    line = f"cannot open the port for broker node 111: listener external: cannot listen on 127.0.0.1:{node_port}: "
    wait_until(lambda: line + "Address already in use" in second.log())
    assert f"bind=127.0.0.1:{node_port} " not in second.log()
    conns = [RawConnection(f"127.0.0.1:{node_port}") for _ in range(16)]
    try:
        for i, conn in enumerate(conns):
            assert round_trip(conn, i) == 0
        assert {worker_of(first, conn) for conn in conns} == {0, 1}
        assert not any(client_address(conn) in served_by(second) for conn in conns)
    finally:
        for conn in conns:
            conn.close()


@pytest.mark.kills_workers
def test_every_worker_opens_the_node_port_of_a_broker_one_worker_learned(tansu: Any, start_proxy: Any) -> None:
    """Cluster mode: a Metadata answer through one worker opens the broker's node port in every
    worker (so the kernel spreads node-port connections over all of them), and a restarted worker
    opens it at once, without waiting for a client's Metadata through it."""
    proxy = start_workers(start_proxy, tansu.bootstrap, 2)
    node_port = int(proxy.config["listeners"][0]["node_port_base"]) + TansuBroker.NODE_ID
    opened = re.compile(rf"listening listener=external bind=127\.0\.0\.1:{node_port} .*worker=(\d+)")

    def openings() -> Counter[int]:
        return Counter(int(worker) for worker in opened.findall(proxy.log()))

    with RawConnection(proxy.bootstrap) as conn:
        conn.send(metadata_frame(1))
        assert conn.read_response(3, 12).header.correlation_id == 1
    wait_until(lambda: openings() == Counter({0: 1, 1: 1}))
    pid = worker_pids(proxy)[0]
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: worker_pids(proxy)[0] != pid, timeout=15)
    wait_until(lambda: openings() == Counter({0: 2, 1: 1}))
    # It opened the node port as it started (told the brokers in worker.start), not once it served.
    restarted = proxy.log().split("worker 0 exited with status -9", 1)[1]
    assert re.search(rf"bind=127\.0\.0\.1:{node_port} .*worker=0\n(.*\n)*.*worker started worker=0", restarted)
    conns = [RawConnection(f"127.0.0.1:{node_port}") for _ in range(16)]
    try:
        for i, conn in enumerate(conns):
            assert round_trip(conn, i) == 0
        assert {worker_of(proxy, conn) for conn in conns} == {0, 1}
    finally:
        for conn in conns:
            conn.close()
