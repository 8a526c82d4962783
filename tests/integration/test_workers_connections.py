"""Connection limits with ``workers: N`` (issue 29): real worker processes on one port (the kernel
spreads the connections, SO_REUSEPORT), real clients (raw Kafka sockets, TLS through ``ssl``), a
real Tansu broker. Each cap keeps the meaning it has in one process: the connection over it is
the one refused, whichever workers hold the others, and a TLS connection over
``max.ssl.connections`` closes the least recently used idle TLS connection even when that one
lives in another worker. Every test asserts which worker each connection landed on (the
worker's own log line, tests/workers_util.py), so the spread is seen, not assumed.

A cap is set to the count of connections the test opened until every worker held one (a reload,
which the supervisor applies to the owner and then to every worker), so the connections that
fill it are spread over every worker whatever the kernel's hash did. Sidecar mode: one pool of
counts; cluster mode counts per upstream broker (BrokerQuotas; its moves with slots out:
tests/unit/test_owner_connections.py), here a node port's connections admitted from slots.
"""

from __future__ import annotations

import os
import re
import select
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from demo.tansu import TansuBroker
from policies.api_keys import API_VERSIONS
from tests.audit_files import read_events
from tests.clients import create_topic, unique
from tests.conftest import wait_until
from tests.integration.test_connection_admission import KafkaSocket, closed, tls_listener
from tests.integration.test_connection_admission import sockets as sockets  # a fixture
from tests.raw_kafka import api_versions_frame, metadata_frame
from tests.workers_util import client_address, start_workers, worker_of, worker_pids

MAX_CONNECTIONS = "max.connections"
MAX_SSL = "max.ssl.connections"
MAX_PER_IP = "max.connections.per.ip"
LISTENER_CAP = "listener.name.external.max.connections"
COVER_AT_MOST = 40  # connections opened until every worker holds one (2^-39 to miss one of 2)


def counted(proxy: Any, tls: bool = False) -> float:
    """What the owner's quotas count (served by the supervisor: the workers do not export it)."""
    name = "kafka_admission_connections_counted_tls" if tls else "kafka_admission_connections_counted"
    return float(proxy.metric(name))


def on_every_worker(proxy: Any, workers: int, open_one: Any) -> dict[KafkaSocket, int]:
    """Connections from ``open_one()`` (each served once) until every worker holds one: each
    connection with the worker that accepted it."""
    held: dict[KafkaSocket, int] = {}
    while len(set(held.values())) < workers:
        assert len(held) < COVER_AT_MOST, f"{len(held)} connections did not reach every worker: {held}"
        conn = open_one()
        held[conn] = worker_of(proxy, conn)
    return held


@pytest.mark.parametrize("cap_key", [MAX_CONNECTIONS, LISTENER_CAP])
@pytest.mark.parametrize("workers", [2, 4])
def test_a_full_cap_refuses_exactly_the_connection_over_it_wherever_the_others_are(
    tansu: TansuBroker, start_proxy: Any, sockets: list[KafkaSocket], workers: int, cap_key: str
) -> None:
    """``max.connections`` or the listener's own cap, filled by busy connections (a Fetch held at
    the broker: never evicted) spread over every worker: the next connection waits
    ``max.connections.wait.ms`` and is refused; another listener's connection is refused too under
    ``max.connections``, admitted under the listener's cap."""
    proxy = start_workers(
        start_proxy,
        tansu.bootstrap,
        workers,
        mode="sidecar",
        listeners=[{"name": "external"}, {"name": "other"}],
        policies={cap_key: 1000, "max.connections.wait.ms": 1000},
    )
    topic = unique("empty")
    create_topic(tansu.bootstrap, topic)

    def busy_one() -> KafkaSocket:
        conn = KafkaSocket(proxy.listener_bind("external"))
        sockets.append(conn)
        conn.park_fetch(conn.topic_id(topic), max_wait_ms=20000)
        return conn

    held = on_every_worker(proxy, workers, busy_one)
    cap = len(held)
    proxy.reload(**{cap_key: cap})
    wait_until(lambda: counted(proxy) == cap)

    over = KafkaSocket(proxy.listener_bind("external"))  # the one over the cap: it waits, then is refused
    sockets.append(over)
    over.send(api_versions_frame(1))
    assert over.wait_closed(timeout=8), f"connection {cap + 1} over {cap_key}={cap} was served"
    assert closed(list(held)) == []  # nobody else paid for it
    assert counted(proxy) == cap

    elsewhere = KafkaSocket(proxy.listener_bind("other"))
    sockets.append(elsewhere)
    if cap_key == MAX_CONNECTIONS:  # every listener together
        elsewhere.send(api_versions_frame(1))
        assert elsewhere.wait_closed(timeout=8), f"another listener's connection over {cap_key}={cap} was served"
    else:
        elsewhere.api_versions()
        elsewhere.close()
    wait_until(lambda: counted(proxy) == cap)

    # A slot frees in one worker: the next connection is admitted, whichever worker accepts it.
    first = next(iter(held))
    first.close()
    wait_until(lambda: counted(proxy) == cap - 1)
    newcomer = KafkaSocket(proxy.listener_bind("external"))
    sockets.append(newcomer)
    newcomer.api_versions()
    assert worker_of(proxy, newcomer) in range(workers)
    assert counted(proxy) == cap
    assert closed([c for c in held if c is not first]) == []


@pytest.mark.parametrize("workers", [2, 4])
def test_max_connections_per_ip_and_its_override_refuse_exactly_the_one_over_across_workers(
    tansu: TansuBroker, start_proxy: Any, sockets: list[KafkaSocket], workers: int
) -> None:
    proxy = start_workers(start_proxy, tansu.bootstrap, workers, mode="sidecar", policies={MAX_PER_IP: 1000})

    def idle_from(source: str) -> KafkaSocket:
        conn = KafkaSocket(proxy.bootstrap, source=source)
        sockets.append(conn)
        conn.api_versions()
        return conn

    ones = on_every_worker(proxy, workers, lambda: idle_from("127.0.0.1"))
    twos = on_every_worker(proxy, workers, lambda: idle_from("127.0.0.2"))
    overrides = f"127.0.0.2:{len(twos)}"
    proxy.reload(**{MAX_PER_IP: len(ones), "max.connections.per.ip.overrides": overrides})

    for source, limit in (("127.0.0.1", len(ones)), ("127.0.0.2", len(twos))):
        over = KafkaSocket(proxy.bootstrap, source=source)
        sockets.append(over)
        over.send(api_versions_frame(1))
        # At once (a wait would last max.connections.wait.ms, 30 s by default).
        assert over.wait_closed(timeout=5), f"{source}: connection {limit + 1} over its limit of {limit} was served"
    assert closed(list(ones) + list(twos)) == []
    for conn in [*ones, *twos]:
        conn.api_versions()  # every one below the limit is still served
    assert counted(proxy) == len(ones) + len(twos)


@pytest.mark.parametrize("workers", [2, 4])
def test_a_tls_connection_over_max_ssl_connections_evicts_the_lru_idle_tls_connection_in_another_worker(
    tansu: TansuBroker, start_proxy: Any, certs: Any, sockets: list[KafkaSocket], workers: int
) -> None:
    proxy = start_workers(
        start_proxy,
        tansu.bootstrap,
        workers,
        mode="sidecar",
        listeners=[tls_listener(certs), {"name": "plain"}],
        policies={MAX_SSL: 1000},
    )
    tls_address = proxy.listener_bind("tls")

    def tls_one() -> KafkaSocket:
        conn = KafkaSocket(tls_address, ca_file=certs.ca_file)
        sockets.append(conn)
        conn.api_versions()
        return conn

    held = on_every_worker(proxy, workers, tls_one)
    cap = len(held)
    proxy.reload(**{MAX_SSL: cap})
    plain = KafkaSocket(proxy.listener_bind("plain"))  # the oldest of all, but plaintext: never a victim
    sockets.append(plain)
    plain.api_versions()

    # Each newcomer evicts the least recently used idle TLS connection, and only it; again until
    # a newcomer landed on a worker other than its victim's (each has a 1 - 1/N chance; bounded).
    alive = dict(held)
    across = 0
    for attempt in range(12):
        for conn in alive:  # every one used once more, in order: the first is the LRU
            conn.api_versions()
        victim = next(iter(alive))
        newcomer = tls_one()
        assert victim.wait_closed(timeout=5), f"attempt {attempt}: the LRU idle TLS connection was not evicted"
        lands = worker_of(proxy, newcomer)
        across += alive.pop(victim) != lands
        assert closed(list(alive)) == [], f"attempt {attempt}: a connection other than the LRU one was closed"
        alive[newcomer] = lands
        wait_until(lambda: counted(proxy, tls=True) == cap)
        if across:
            break
    assert across, "no newcomer landed on a worker other than its victim's in 12 attempts"
    for conn in alive:
        conn.api_versions()
    plain.api_versions()
    assert counted(proxy, tls=True) == cap


@pytest.mark.parametrize("workers", [2, 4])
@pytest.mark.kills_workers
def test_a_killed_workers_connections_stop_counting_and_a_connection_waiting_in_another_worker_is_admitted(
    tansu: TansuBroker, start_proxy: Any, sockets: list[KafkaSocket], workers: int
) -> None:
    proxy = start_workers(
        start_proxy,
        tansu.bootstrap,
        workers,
        mode="sidecar",
        policies={MAX_CONNECTIONS: 1000, "max.connections.wait.ms": 30000},
    )
    topic = unique("empty")
    create_topic(tansu.bootstrap, topic)

    def busy_one() -> KafkaSocket:
        conn = KafkaSocket(proxy.bootstrap)
        sockets.append(conn)
        conn.park_fetch(conn.topic_id(topic), max_wait_ms=25000)
        return conn

    held = on_every_worker(proxy, workers, busy_one)
    cap = len(held)
    proxy.reload(**{MAX_CONNECTIONS: cap})
    waiter = KafkaSocket(proxy.bootstrap)
    sockets.append(waiter)
    waiter.send(api_versions_frame(1))
    at = worker_of(proxy, waiter)
    assert select.select([waiter.sock], [], [], 1.0)[0] == [], "answered while every slot was busy"

    dead = next(w for w in range(workers) if w != at)
    lost = [conn for conn, worker in held.items() if worker == dead]
    os.kill(worker_pids(proxy)[dead], signal.SIGKILL)
    # Its connections end, their slots are given back, and the waiting one (another worker's) is let in.
    assert waiter.read_response(API_VERSIONS, 3).header.correlation_id == 1
    assert all(conn.wait_closed(timeout=5) for conn in lost)
    wait_until(lambda: proxy.metric("kafka_admission_worker_released_total", what="connections") == len(lost))
    wait_until(lambda: counted(proxy) == cap - len(lost) + 1)
    assert closed([conn for conn, worker in held.items() if worker != dead]) == []


@pytest.mark.parametrize("workers", [2, 4])
def test_a_reload_lowering_max_connections_closes_the_lru_idle_excess_in_every_worker(
    tansu: TansuBroker, start_proxy: Any, sockets: list[KafkaSocket], workers: int
) -> None:
    proxy = start_workers(start_proxy, tansu.bootstrap, workers, mode="sidecar", policies={MAX_CONNECTIONS: 1000})

    def idle_one() -> KafkaSocket:
        conn = KafkaSocket(proxy.bootstrap)
        sockets.append(conn)
        conn.api_versions()
        return conn

    held = on_every_worker(proxy, workers, idle_one)
    for _ in range(2):
        conn = idle_one()
        held[conn] = worker_of(proxy, conn)
    # The least recently used: one connection of each worker; then every other one, used later.
    lru = [next(conn for conn, w in held.items() if w == worker) for worker in range(workers)]
    rest = [conn for conn in held if conn not in lru]
    for conn in lru + rest:
        conn.api_versions()
    proxy.reload(**{MAX_CONNECTIONS: len(rest)})

    assert all(conn.wait_closed(timeout=5) for conn in lru), "the LRU excess was not closed"
    for conn in rest:
        conn.api_versions()  # the more recently used stay served
    assert closed(rest) == []
    wait_until(lambda: counted(proxy) == len(rest))


def test_node_port_opens_are_admitted_from_slots_and_the_nodes_per_ip_limit_refuses_exactly_the_one_over(
    tansu: TansuBroker, start_proxy: Any, sockets: list[KafkaSocket], tmp_path: Path
) -> None:
    """Cluster mode, workers: 2, the audit on: connections to a node port, one after another, are
    admitted mostly from the slots the owner lends each worker for that node's pool; the node's
    max.connections.per.ip refuses exactly the one over it; each open event carries the node's
    counts, as one process records them ((n, None, n), node_id)."""
    limit = 20
    audit = tmp_path / "audit"
    proxy = start_workers(
        start_proxy, tansu.bootstrap, 2, policies={MAX_PER_IP: limit}, audit={"path": str(audit), "instance_id": "px"}
    )
    node = f"127.0.0.1:{int(proxy.config['listeners'][0]['node_port_base']) + TansuBroker.NODE_ID}"
    opened = re.compile(rf"listening listener=external bind={re.escape(node)} .*worker=(\d+)")
    learn = KafkaSocket(proxy.bootstrap)  # the brokers are learned from Metadata: every worker opens the node port
    sockets.append(learn)
    learn.send(metadata_frame(1))
    wait_until(lambda: Counter(int(w) for w in opened.findall(proxy.log())) == Counter({0: 1, 1: 1}))
    learn.close()
    wait_until(lambda: counted(proxy) == 0)

    held: dict[KafkaSocket, int] = {}
    addresses = []
    for n in range(1, limit + 1):
        conn = KafkaSocket(node)
        sockets.append(conn)
        conn.api_versions()
        held[conn] = worker_of(proxy, conn)
        addresses.append(client_address(conn))
        wait_until(
            lambda n=n: proxy.metric("kafka_admission_connections_counted", broker=str(TansuBroker.NODE_ID)) == n
        )
    assert set(held.values()) == {0, 1}, held  # 2^-19 that the kernel put all 20 on one worker
    over = KafkaSocket(node)
    sockets.append(over)
    over.send(api_versions_frame(1))
    assert over.wait_closed(timeout=5), f"connection {limit + 1} from one address to the node port was served"
    assert closed(list(held)) == []
    slot = proxy.metric("kafka_admission_worker_connection_opens_total", how="slot")
    asked = proxy.metric("kafka_admission_worker_connection_opens_total", how="asked")
    print(f"node port opens: {slot:g} from slots, {asked:g} asked")
    assert slot > asked, (slot, asked)  # asked: the Metadata connection, each worker's first, the refused one
    for conn in sockets:
        conn.close()
    proxy.signal(signal.SIGTERM)
    assert proxy.wait(timeout=15) == 0
    opens = [e for e in read_events(audit, finished_only=True) if e["type"] == "connection" and e["event"] == "open"]
    by_address = {e["client_address"]: e for e in opens if e.get("node_id") == TansuBroker.NODE_ID}
    assert len(by_address) == limit
    counts = [
        tuple(by_address[a][k] for k in ("open_connections", "open_ssl_connections", "open_ip_connections"))
        for a in addresses
    ]
    assert counts == [(n, None, n) for n in range(1, limit + 1)]  # in the order they were opened
