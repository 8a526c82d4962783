"""Connection admission (Kafka's connection quotas and the KIP-1015 TLS cap)
through the proxy, with real clients, real TLS (trustme certificates) and a
real Tansu broker.

What is checked, at accept and before any TLS handshake: a cap that is full
closes the least recently used *idle* connection of its class (and only that
one); with nothing idle the listener stops accepting until a slot frees, and
gives up after ``max.connections.wait.ms``; ``max.connections.per.ip`` (and its
overrides) closes the new connection at once; ``connections.max.idle.ms``
closes idle connections only; lowering a cap at runtime (by SIGHUP, or by a
ConfigMap update alone) closes the excess LRU-first; observe mode counts all of
it and closes nothing.

The idle connections held by the tests are raw sockets (TLS ones through
``ssl``) that each completed one ApiVersions exchange with the broker through
the proxy, so that the test knows, and controls, which one was used least
recently.

librdkafka (2.16) does not reuse its bootstrap connection: once Metadata names
the brokers it closes it and opens one to the broker it learned, even when the
address is the same (checked in its debug log). Its two connections overlap
for a moment at the proxy, so how many idle connections a producer's arrival
costs would depend on which of them the proxy sees first. Where a test needs
the exact number, the producer bootstraps through a *protected* TLS listener
(not counted by ``max.ssl.connections``) of a sidecar proxy whose broker
advertises the capped TLS listener: its one counted connection is then the one
to the broker, and exactly one idle connection must make room for it.
"""

from __future__ import annotations

import contextlib
import logging
import random
import select
import ssl
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from demo.tansu import TansuBroker, free_port
from policies.api_keys import API_VERSIONS, FETCH, METADATA
from tests.audit_files import read_events
from tests.clients import GROUP_CONF, broker_addresses, consume, create_topic, metadata, produce_values, unique
from tests.conftest import wait_until
from tests.faults import sockets_to
from tests.raw_kafka import RawConnection, api_versions_frame, fetch_frame, metadata_frame

SOCKET_TIMEOUT_S = 10.0
MAX_SSL = "max.ssl.connections"
MAX_CONNECTIONS = "max.connections"


# --- raw connections that the test keeps idle --------------------------------


class KafkaSocket(RawConnection):
    """One client connection through the proxy, plaintext or TLS, optionally
    from a chosen source address; speaks just enough Kafka to be served."""

    def __init__(self, address: str, *, ca_file: str | None = None, source: str | None = None) -> None:
        super().__init__(address, SOCKET_TIMEOUT_S, ca_file=ca_file, source=source)
        self.local = self.sock.getsockname()
        self._correlation_id = 0

    def api_versions(self) -> None:
        """One ApiVersions round trip with the broker: this connection was just active."""
        self._correlation_id += 1
        self.send(api_versions_frame(self._correlation_id))
        response = self.read_response(API_VERSIONS, 3)
        assert response.header.correlation_id == self._correlation_id
        assert response.body.error_code == 0

    def topic_id(self, topic: str) -> Any:
        self._correlation_id += 1
        self.send(metadata_frame(self._correlation_id))
        body = self.read_response(METADATA, 12).body
        return next(t.topic_id for t in body.topics if t.name == topic)

    def park_fetch(self, topic_id: Any, max_wait_ms: int) -> int:
        """Send a Fetch on an empty partition: the broker holds it for ``max_wait_ms``."""
        self._correlation_id += 1
        self.send(fetch_frame(self._correlation_id, topic_id, max_wait_ms=max_wait_ms))
        return self._correlation_id

    def closed_by_peer(self) -> bool:
        """True when the proxy has closed this connection (EOF or reset); never blocks."""
        readable, _, _ = select.select([self.sock], [], [], 0)
        if not readable:
            return False
        self.sock.setblocking(False)
        try:
            data = self.sock.recv(1)
        except (ssl.SSLWantReadError, BlockingIOError):
            return False  # a TLS record that carried no data (a session ticket)
        except (ConnectionResetError, BrokenPipeError, ssl.SSLEOFError, ssl.SSLZeroReturnError):
            return True
        finally:
            self.sock.settimeout(SOCKET_TIMEOUT_S)
        assert not data, f"unexpected bytes from the proxy: {data!r}"
        return True

    def wait_closed(self, timeout: float) -> bool:
        """Block up to ``timeout`` for the proxy to close this connection."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.closed_by_peer():
                return True
            select.select([self.sock], [], [], min(0.05, max(0.0, deadline - time.monotonic())))
        return self.closed_by_peer()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def sockets() -> Iterator[list[KafkaSocket]]:
    """Connections a test opens; all closed when it ends."""
    opened: list[KafkaSocket] = []
    yield opened
    for conn in opened:
        conn.close()


def hold(sockets: list[KafkaSocket], address: str, count: int, **options: Any) -> list[KafkaSocket]:
    """``count`` connections, opened one after the other, each served once (then idle)."""
    held = []
    for _ in range(count):
        conn = KafkaSocket(address, **options)
        sockets.append(conn)
        conn.api_versions()
        held.append(conn)
    return held


def knock(sockets: list[KafkaSocket], address: str) -> bool:
    """A newcomer that asks for one answer; False if it was closed first."""
    conn = KafkaSocket(address)
    sockets.append(conn)
    try:
        conn.api_versions()
    except (ConnectionError, OSError):
        return False
    return True


def closed(conns: list[KafkaSocket]) -> list[int]:
    """Indexes of the connections the proxy has closed."""
    return [i for i, conn in enumerate(conns) if conn.closed_by_peer()]


def not_seen_closed(proxy: Any, conns: list[KafkaSocket]) -> str:
    """Why a test waited in vain for a close: what the proxy says it closed, what the clients saw."""
    return (
        f"the proxy counted {closings(proxy):g} closings "
        f"(connections counted now: {proxy.metric('kafka_admission_connections_counted'):g}), "
        f"but the clients saw {len(closed(conns))} of {len(conns)} connections closed"
    )


@contextlib.contextmanager
def explained(why: Any) -> Iterator[None]:
    """Add ``why()`` to an AssertionError raised inside."""
    try:
        yield
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {why()}") from None


def decisions(proxy: Any) -> list[str]:
    """Every connection decision counted, as text."""
    _, text = proxy.get("/metrics")
    return [
        line
        for line in text.splitlines()
        if line.startswith("kafka_admission_decisions_total") and 'policy="connections"' in line
    ]


def decided(proxy: Any, **labels: str) -> float:
    return float(proxy.metric("kafka_admission_decisions_total", policy="connections", **labels))


def closings(proxy: Any, **labels: str) -> float:
    """Connections the quotas decided to close: LRU evictions, idle expiry, lowered caps."""
    return decided(proxy, action="evict", **labels) + decided(proxy, action="close", **labels)


def tls_listener(certs: Any, name: str = "tls", **extra: Any) -> dict[str, Any]:
    return {"name": name, "tls": {"cert_file": certs.server_cert, "key_file": certs.server_key}, **extra}


def confluent_tls(certs: Any) -> dict[str, Any]:
    return {"security.protocol": "SSL", "ssl.ca.location": certs.ca_file}


def set_policies(proxy: Any, **changes: Any) -> None:
    proxy.reload(**changes)


def broker_connects(stats: dict[str, Any]) -> dict[int, tuple[int, int]]:
    """librdkafka statistics: (connects, disconnects) per broker node id it learned."""
    return {
        int(b["nodeid"]): (int(b["connects"]), int(b["disconnects"]))
        for b in stats["brokers"].values()
        if int(b["nodeid"]) >= 0
    }


# --- 1. the TLS cap evicts exactly the least recently used idle connection ---


def test_full_tls_cap_evicts_exactly_the_least_recently_used_idle_connection_for_a_producer(
    start_proxy: Any,
    certs: Any,
    sockets: list[KafkaSocket],
) -> None:
    tls_port = free_port()
    with TansuBroker(advertised=f"127.0.0.1:{tls_port}") as broker:
        proxy = start_proxy(
            broker.bootstrap,
            mode="sidecar",
            listeners=[
                tls_listener(certs, bind=f"127.0.0.1:{tls_port}"),  # what the broker advertises
                tls_listener(certs, name="entry", protected=True),  # bootstrap only, not capped
                {"name": "plain"},
            ],
            policies={MAX_SSL: 50},
        )
        tls_address, entry = proxy.listener_bind("tls"), proxy.listener_bind("entry")
        ssl_conf = confluent_tls(certs)
        topic = unique("tls-cap")
        create_topic(entry, topic, **ssl_conf)
        wait_until(lambda: proxy.metric("kafka_admission_connections_counted_tls") == 0)

        held = hold(sockets, tls_address, 50, ca_file=certs.ca_file)
        lru = 7  # not the oldest: every other connection is used once more, in order
        for i, conn in enumerate(held):
            if i != lru:
                conn.api_versions()
        assert proxy.metric("kafka_admission_connections_counted_tls") == 50
        accepted_before = proxy.metric("kafka_admission_connections_accepted_total", listener="tls")
        entered_before = proxy.metric("kafka_admission_connections_accepted_total", listener="entry")

        values = [f"v{i}".encode() for i in range(20)]
        result = produce_values(entry, topic, values, acks="all", **ssl_conf)

        assert result.errors == []
        assert sorted(v for _, v in result.delivered) == sorted(values)
        # The producer's one counted connection: to the broker it learned, on the capped listener.
        assert broker_connects(result.stats) == {TansuBroker.NODE_ID: (1, 0)}
        assert proxy.metric("kafka_admission_connections_accepted_total", listener="tls") == accepted_before + 1
        assert proxy.metric("kafka_admission_connections_accepted_total", listener="entry") > entered_before
        # Exactly one connection made room for it: the least recently used one. The 49 others
        # are still served (a closed one would fail its round trip), after the eviction.
        assert held[lru].wait_closed(timeout=5), not_seen_closed(proxy, held)
        for i, conn in enumerate(held):
            if i != lru:
                conn.api_versions()
        assert closed(held) == [lru]
        assert decided(proxy, listener="tls", action="evict", limit=MAX_SSL, mode="enforce") == 1
        assert closings(proxy) == 1
        assert proxy.metric("kafka_admission_tls_handshake_failures_total") == 0

        # The plaintext listener of the same proxy is not behind the TLS cap.
        assert proxy.metric("kafka_admission_connections_counted_tls") == 49  # the producer has left
        plain = KafkaSocket(proxy.listener_bind("plain"))
        sockets.append(plain)
        plain.api_versions()
        assert plain.topic_id(topic) is not None  # Metadata from the broker, through the proxy
        assert decided(proxy, listener="plain") == 0
        assert closed(held) == [lru]


def test_plaintext_listener_serves_real_clients_while_the_tls_cap_is_full(
    tansu: TansuBroker,
    start_proxy: Any,
    certs: Any,
    sockets: list[KafkaSocket],
) -> None:
    proxy = start_proxy(tansu.bootstrap, listeners=[tls_listener(certs), {"name": "plain"}], policies={MAX_SSL: 50})
    held = hold(sockets, proxy.listener_bind("tls"), 50, ca_file=certs.ca_file)
    plain = proxy.listener_bind("plain")

    topic = unique("plain-beside-tls")
    create_topic(plain, topic)
    values = [f"p{i}".encode() for i in range(30)]
    result = produce_values(plain, topic, values, acks="all", **{"enable.idempotence": True})
    consumed = consume(plain, topic, unique("plain-group"), len(values))

    assert result.errors == []
    assert sorted(consumed) == sorted(values)
    assert proxy.metric("kafka_admission_connections_accepted_total", listener="plain") >= 3
    assert closed(held) == []
    assert proxy.metric("kafka_admission_connections_counted_tls") == 50
    assert decided(proxy) == 0
    # And the TLS cap is still enforced: one more TLS connection costs the oldest idle one.
    newcomer = KafkaSocket(proxy.listener_bind("tls"), ca_file=certs.ca_file)
    sockets.append(newcomer)
    newcomer.api_versions()
    assert held[0].wait_closed(timeout=5), not_seen_closed(proxy, held)
    for conn in held[1:]:  # the others are served after it: only the oldest idle one was closed
        conn.api_versions()
    assert closed(held) == [0]
    assert decided(proxy, listener="tls", action="evict", limit=MAX_SSL) == 1


# --- 2. an evicted idempotent producer reconnects; nothing lost or doubled ---


class ClientLog(logging.Handler):
    """librdkafka's own log lines (``logger`` config), as the client saw things."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def count(self, text: str) -> int:
        return sum(text in line for line in self.lines)


def test_evicted_idempotent_producer_reconnects_and_delivers_every_record_exactly_once(
    tansu: TansuBroker,
    start_proxy: Any,
    sockets: list[KafkaSocket],
) -> None:
    proxy = start_proxy(tansu.bootstrap, policies={MAX_CONNECTIONS: 2})
    topic = unique("evicted-producer")
    create_topic(tansu.bootstrap, topic)  # straight at the broker: the proxy's two slots are the test's
    client_log = ClientLog()
    logger = logging.getLogger(unique("rdkafka"))
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(client_log)
    delivered: list[bytes] = []
    errors: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            delivered.append(msg.value())

    producer = Producer(
        {
            "bootstrap.servers": proxy.bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": 30000,
        },
        logger=logger,
    )

    def disconnects() -> int:
        producer.poll(0.1)
        return client_log.count("Disconnected: connection closed by peer")

    batches, per_batch = 3, 50
    sent: list[bytes] = []
    evicted = 0.0
    try:
        for batch in range(batches):
            for i in range(per_batch):
                value = f"b{batch}-r{i}".encode()
                sent.append(value)
                producer.produce(topic, value=value, on_delivery=on_delivery)
                producer.poll(0)
            assert producer.flush(30) == 0
            assert errors == []
            assert len(delivered) == len(sent)
            # The producer is idle now: two newcomers need both slots. (Once evicted, the
            # producer reconnects at once and evicts them in turn: whether they get their
            # answer is not the point here.)
            before = disconnects()
            for _ in range(2):  # to the broker's node port: the producer's connection counts there
                knock(sockets, _node_port(proxy, TansuBroker.NODE_ID))
            evicted_now = decided(proxy, action="evict", limit=MAX_CONNECTIONS)
            assert evicted_now > evicted, f"batch {batch}: nothing was evicted"
            evicted = evicted_now
            # The client saw it: its connection was one of those evicted.
            with explained(lambda: "the producer never saw its connection closed; " + not_seen_closed(proxy, [])):
                wait_until(lambda before=before: disconnects() > before, timeout=10)
        assert producer.flush(30) == 0
    finally:
        producer.flush(5)
        producer = None  # librdkafka closes its connections

    assert errors == []
    assert sorted(delivered) == sorted(sent)
    assert "evicted (LRU idle) to admit a connection" in proxy.log()
    # Read back at the broker itself: every record once, none twice.
    stored = read_partition(tansu.bootstrap, topic, expect=len(sent))
    assert len(stored) == len(sent), f"{len(stored) - len(sent)} more records stored than produced"
    assert sorted(stored) == sorted(sent)


def read_partition(bootstrap: str, topic: str, expect: int, linger: float = 1.5) -> list[bytes]:
    """Every record of partition 0 from its start: until ``expect`` arrived and then
    ``linger`` seconds with nothing more (so duplicates would show)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("reader"), **GROUP_CONF})
    values: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 20
        quiet_until = None
        while time.monotonic() < deadline:
            message = consumer.poll(0.1)
            if message is not None:
                assert message.error() is None, message.error()
                values.append(message.value() or b"")
            if len(values) >= expect:
                quiet_until = quiet_until or time.monotonic() + linger
                if time.monotonic() > quiet_until:
                    break
    finally:
        consumer.close()
    return values


# --- 3. every connection busy: the listener waits, then admits -----------------


def busy_connections(proxy: Any, tansu: TansuBroker, sockets: list[KafkaSocket], n: int, wait_ms: int) -> list[Any]:
    """``n`` connections through the proxy, each with a Fetch parked at the broker."""
    topic = unique("empty")
    create_topic(tansu.bootstrap, topic)
    conns = []
    for _ in range(n):
        conn = KafkaSocket(proxy.bootstrap)
        sockets.append(conn)
        topic_id = conn.topic_id(topic)
        conns.append((conn, conn.park_fetch(topic_id, max_wait_ms=wait_ms)))
    wait_until(lambda: proxy.metric("kafka_admission_connections_counted_busy") == n)
    return conns


def test_with_every_connection_busy_a_new_connection_waits_and_is_admitted_when_one_closes(
    tansu: TansuBroker,
    start_proxy: Any,
    sockets: list[KafkaSocket],
) -> None:
    proxy = start_proxy(tansu.bootstrap, policies={MAX_CONNECTIONS: 2, "max.connections.wait.ms": 20000})
    (first, _), (second, second_fetch) = busy_connections(proxy, tansu, sockets, 2, wait_ms=8000)

    waiting = KafkaSocket(proxy.bootstrap)  # the kernel completes the TCP handshake...
    sockets.append(waiting)
    waiting.send(api_versions_frame(1))  # ...and the proxy decides to wait for a slot
    wait_until(lambda: decided(proxy, action="wait", limit=MAX_CONNECTIONS) == 1)
    seen_waiting = time.monotonic()
    assert proxy.metric("kafka_admission_connections_counted") == 2
    assert closings(proxy) == 0

    first.close()  # a slot frees
    closed_first = time.monotonic()
    response = waiting.read_response(API_VERSIONS, 3)
    assert response.header.correlation_id == 1
    # Admitted at the close, not when a Fetch ended: its answer came before the other Fetch's.
    assert select.select([second.sock], [], [], 0)[0] == [], "the other Fetch was answered first"
    # The acceptor was blocked at least from when the test saw the wait until it closed a connection.
    blocked = proxy.metric("kafka_admission_acceptor_blocked_seconds_total", listener="external")
    assert blocked >= closed_first - seen_waiting
    # The other busy connection was never touched: its Fetch is answered.
    fetched = second.read_response(FETCH, 13)
    assert fetched.header.correlation_id == second_fetch
    assert closings(proxy) == 0


def test_a_connection_that_waits_longer_than_max_connections_wait_ms_is_closed(
    tansu: TansuBroker,
    start_proxy: Any,
    sockets: list[KafkaSocket],
) -> None:
    proxy = start_proxy(tansu.bootstrap, policies={MAX_CONNECTIONS: 2, "max.connections.wait.ms": 1000})
    busy = busy_connections(proxy, tansu, sockets, 2, wait_ms=8000)

    waiting = KafkaSocket(proxy.bootstrap)
    sockets.append(waiting)
    started = time.monotonic()
    waiting.send(api_versions_frame(1))
    # Closed while both Fetches are still held (8 s): a slot freed by their end would admit it
    # (an answer, which wait_closed refuses) instead of the refusal counted below.
    assert waiting.wait_closed(timeout=7), not_seen_closed(proxy, [waiting])
    waited = time.monotonic() - started

    assert waited >= 0.9, waited  # not before max.connections.wait.ms (1 s; 0.1 s for two processes' clocks)
    assert decided(proxy, action="refuse", limit="max.connections.wait.ms") == 1
    for conn, correlation_id in busy:  # the busy ones keep their requests
        assert conn.read_response(FETCH, 13).header.correlation_id == correlation_id


# --- 4. per-IP limit and its override -----------------------------------------


def test_per_ip_limit_closes_the_third_connection_at_once_and_the_override_allows_four(
    tansu: TansuBroker,
    start_proxy: Any,
    sockets: list[KafkaSocket],
) -> None:
    proxy = start_proxy(
        tansu.bootstrap,
        policies={"max.connections.per.ip": 2, "max.connections.per.ip.overrides": "127.0.0.2:4"},
    )
    address = proxy.bootstrap
    assert address.startswith("127.0.0.1:")

    ones = hold(sockets, address, 2, source="127.0.0.1")
    twos = hold(sockets, address, 4, source="127.0.0.2")  # Linux routes all of 127/8 to loopback
    assert [conn.local[0] for conn in ones + twos] == ["127.0.0.1"] * 2 + ["127.0.0.2"] * 4

    for source, limit_key in (
        ("127.0.0.1", "max.connections.per.ip"),
        ("127.0.0.2", "max.connections.per.ip.overrides"),
    ):
        over = KafkaSocket(address, source=source)
        sockets.append(over)
        over.send(api_versions_frame(1))
        # At once: nothing is waited for (a wait would last max.connections.wait.ms, 30 s by default).
        assert over.wait_closed(timeout=5), f"{source}: over its limit but not closed"
        assert decided(proxy, action="refuse", limit=limit_key, mode="enforce") == 1

    # Nobody paid for the refused connections, and they did not count.
    assert closed(ones + twos) == []
    for conn in ones + twos:
        conn.api_versions()
    assert closings(proxy) == 0
    assert proxy.metric("kafka_admission_connections_counted") == 6
    # A freed slot is available to the same address again.
    ones[0].close()
    wait_until(lambda: proxy.metric("kafka_admission_connections_counted") == 5)
    hold(sockets, address, 1, source="127.0.0.1")


# --- 5. lowering the TLS cap at runtime ---------------------------------------


def test_lowering_max_ssl_connections_closes_the_40_least_recently_used_then_newcomers_evict_or_wait(
    tansu: TansuBroker,
    start_proxy: Any,
    certs: Any,
    sockets: list[KafkaSocket],
    configmap: bool,
) -> None:
    proxy = start_proxy(tansu.bootstrap, listeners=[tls_listener(certs)], policies={MAX_SSL: 50}, configmap=configmap)
    held = hold(sockets, proxy.bootstrap, 50, ca_file=certs.ca_file)
    order = list(range(50))
    random.Random(1015).shuffle(order)
    for i in order:  # activity in an order unrelated to the opening order
        held[i].api_versions()

    set_policies(proxy, **{MAX_SSL: 10})  # SIGHUP, or a ConfigMap update alone

    wait_until(lambda: proxy.metric("kafka_admission_connections_counted_tls") == 10, timeout=5)
    expected = sorted(order[:40])
    with explained(lambda: not_seen_closed(proxy, held)):
        wait_until(lambda: len(closed(held)) >= 40, timeout=5)
    assert closed(held) == expected
    assert decided(proxy, action="close", limit=MAX_SSL, mode="enforce") == 40
    for i in order[40:]:  # the ten survivors are served, after the closings
        held[i].api_versions()
    # The new cap holds for newcomers too: one more costs the least recently used survivor.
    newcomer = KafkaSocket(proxy.bootstrap, ca_file=certs.ca_file)
    sockets.append(newcomer)
    newcomer.api_versions()
    assert held[order[40]].wait_closed(timeout=5)
    assert proxy.metric("kafka_admission_connections_counted_tls") == 10

    # With all ten busy (a Fetch parked at the broker on each), nothing is evicted: the next
    # newcomer waits, its TLS handshake too (the decision comes first), until one closes.
    busy = [held[i] for i in order[41:]] + [newcomer]
    topic = unique("tls-busy")
    create_topic(tansu.bootstrap, topic)
    for conn in busy:
        conn.park_fetch(conn.topic_id(topic), max_wait_ms=5000)
    wait_until(lambda: proxy.metric("kafka_admission_connections_counted_busy") == 10, timeout=5)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(hold, sockets, proxy.bootstrap, 1, ca_file=certs.ca_file)
        wait_until(lambda: decided(proxy, action="wait", limit=MAX_SSL) == 1, timeout=5)
        # Decided to wait: nothing can admit it before a slot frees, and none is freed yet.
        assert not waiting.done() and proxy.metric("kafka_admission_connections_counted_tls") == 10
        busy[0].close()
        waiting.result(timeout=5)  # handshake and ApiVersions, once a slot was free
    assert closings(proxy) == 41  # the 40 over the lowered cap, and the one evicted above


# --- 6. observe mode ------------------------------------------------------------


def test_observe_mode_over_the_cap_closes_nothing_and_counts_the_would_be_evictions(
    tansu: TansuBroker,
    start_proxy: Any,
    certs: Any,
    sockets: list[KafkaSocket],
) -> None:
    proxy = start_proxy(
        tansu.bootstrap, listeners=[tls_listener(certs)], policies={MAX_SSL: 2, "connections.mode": "observe"}
    )
    held = hold(sockets, proxy.bootstrap, 3, ca_file=certs.ca_file)
    topic = unique("observe")
    create_topic(tansu.bootstrap, topic)
    values = [f"o{i}".encode() for i in range(10)]
    result = produce_values(proxy.bootstrap, topic, values, **confluent_tls(certs))

    assert result.errors == []
    assert len(result.delivered) == len(values)
    for conn in held:  # each still served, after the producer's connections were admitted
        conn.api_versions()
    assert closed(held) == []
    assert closings(proxy, mode="enforce") == 0
    assert proxy.metric("kafka_admission_connections_counted_tls") >= 3
    # The third held connection, then each of the producer's: what enforce would have evicted.
    would_evict = decided(proxy, listener="tls", action="evict", limit=MAX_SSL, mode="observe")
    assert would_evict >= 2, f"decisions counted: {decisions(proxy)}"
    assert decided(proxy, mode="enforce") == 0

    # A lowered cap in observe mode: counted as closings, nothing closed.
    set_policies(proxy, **{MAX_SSL: 1})
    wait_until(lambda: decided(proxy, action="close", limit=MAX_SSL, mode="observe") == 2)
    for conn in held:  # each still served, after the decisions to close two of them
        conn.api_versions()
    assert closed(held) == []
    assert closings(proxy, mode="enforce") == 0


# --- 7. idle expiry ---------------------------------------------------------------


def test_idle_connection_closes_after_connections_max_idle_ms_but_a_busy_one_stays(
    tansu: TansuBroker,
    start_proxy: Any,
    sockets: list[KafkaSocket],
) -> None:
    proxy = start_proxy(tansu.bootstrap, policies={"connections.max.idle.ms": 1000})
    topic = unique("idle")
    create_topic(tansu.bootstrap, topic)
    busy = KafkaSocket(proxy.bootstrap)
    sockets.append(busy)
    topic_id = busy.topic_id(topic)
    idle = KafkaSocket(proxy.bootstrap)
    sockets.append(idle)

    idle.api_versions()
    last_activity = time.monotonic()
    fetch = busy.park_fetch(topic_id, max_wait_ms=3000)
    assert idle.wait_closed(timeout=5), not_seen_closed(proxy, [idle])
    idle_for = time.monotonic() - last_activity

    # Not before connections.max.idle.ms (1 s) after its last answer, less the time that answer
    # took to reach this process (0.2 s allowed); no upper bound but wait_closed's 5 s.
    assert idle_for >= 0.8, idle_for
    assert not busy.closed_by_peer()
    response = busy.read_response(FETCH, 13)  # held by the broker for 3 s, well past 1 s
    answered = time.monotonic()
    assert response.header.correlation_id == fetch
    assert answered - last_activity >= 2.5
    # Once answered it is idle too, and goes the same way.
    assert busy.wait_closed(timeout=5), not_seen_closed(proxy, [busy])
    assert time.monotonic() - answered >= 0.8
    assert decided(proxy, action="close", limit="connections.max.idle.ms", mode="enforce") == 2


# --- cluster mode: each upstream broker's own caps ---------------------------------------

NODE_IDS = (1, 2, 3)


def _node_port(proxy: Any, node: int) -> str:
    return f"127.0.0.1:{int(proxy.config['listeners'][0]['node_port_base']) + node}"


def _cluster_proxy(start_proxy: Any, mock_cluster: Any, policies: dict[str, Any], **sections: Any) -> Any:
    proxy = start_proxy(mock_cluster.bootstrap_servers, node_ids=NODE_IDS, policies=policies, **sections)
    learn = KafkaSocket(proxy.bootstrap)  # the proxy learns the brokers (opens their ports) from Metadata
    learn.send(metadata_frame(1))
    learn.read_response(METADATA, 12)
    learn.close()
    assert wait_until(lambda: proxy.metric("kafka_admission_brokers_known") == 3)
    assert wait_until(lambda: proxy.metric("kafka_admission_connections_counted") == 0)
    return proxy


def _answered(conn: KafkaSocket) -> None:
    """One ApiVersions round trip with a mock broker (it answers v3 with UNSUPPORTED_VERSION and
    its versions, as brokers do): the connection is served, and was just active."""
    conn._correlation_id += 1
    conn.send(api_versions_frame(conn._correlation_id))
    assert conn.read_response(API_VERSIONS, 3).header.correlation_id == conn._correlation_id


def _hold_mock(sockets: list[KafkaSocket], address: str, count: int) -> list[KafkaSocket]:
    held = []
    for _ in range(count):
        conn = KafkaSocket(address)
        sockets.append(conn)
        _answered(conn)
        held.append(conn)
    return held


def _audit_opens(audit: Any) -> list[tuple[int | None, int]]:
    """(node_id, open_connections) of each connection's open event, by time: with workers the
    events are in each worker's files, read one instance after the other."""
    events = [e for e in read_events(audit) if e["type"] == "connection" and e["event"] == "open"]
    return [(e.get("node_id"), e["open_connections"]) for e in sorted(events, key=lambda e: e["ts"])]


def _upstream_sockets(port: int, *proxies: Any) -> int:
    """TCP sockets these proxies' processes (each one's supervisor and workers) hold to ``port``.
    Only theirs: the mock cluster's own client (its owner Producer, in this test process) connects
    to its brokers when it likes, and once did during a count."""
    return sum(sockets_to(proxy.process.pid, port) for proxy in proxies)


def test_cluster_mode_counts_max_connections_per_upstream_broker(
    mock_cluster: Any, start_proxy: Any, sockets: list[KafkaSocket], tmp_path: Any
) -> None:
    """Cluster mode, max.connections: 2, librdkafka's mock cluster (3 brokers): two idle
    connections to node 1's port and two to node 2's are all admitted (each broker counts its
    own, as Kafka's brokers do; before, the third and fourth evicted node 1's); a third to node
    1's port evicts node 1's least recently used one, and nothing of node 2's. The audit's open
    events and the connection gauges (label ``broker``) carry the counts of the broker that counted
    each connection."""
    audit = tmp_path / "audit"
    proxy = _cluster_proxy(start_proxy, mock_cluster, {MAX_CONNECTIONS: 2}, audit={"path": str(audit)})
    node1 = _hold_mock(sockets, _node_port(proxy, 1), 2)
    node2 = _hold_mock(sockets, _node_port(proxy, 2), 2)
    assert closings(proxy) == 0
    assert not any(conn.closed_by_peer() for conn in node1 + node2)
    # the gauges say which broker counts each connection
    counted = {b: proxy.metric("kafka_admission_connections_counted", broker=b) for b in ("1", "2", "3", "bootstrap")}
    assert counted == {"1": 2, "2": 2, "3": 0, "bootstrap": 0}

    third = _hold_mock(sockets, _node_port(proxy, 1), 1)[0]
    assert decided(proxy, action="evict", limit=MAX_CONNECTIONS) == 1
    assert node1[0].wait_closed(10)
    for conn in (node1[1], third, *node2):
        _answered(conn)  # still served
    assert closings(proxy) == 1

    def opens() -> list[tuple[int | None, int]]:
        return _audit_opens(audit)

    # the bootstrap connection that learned the brokers, then 1, 1, 2, 2, and node 1's third
    # (2 again: the one it evicted has given up its slot)
    wait_until(lambda: len(opens()) == 6)
    assert opens() == [(None, 1), (1, 1), (1, 2), (2, 1), (2, 2), (1, 2)]


def test_two_proxy_replicas_each_admit_their_cap_to_the_same_broker(
    mock_cluster: Any, start_proxy: Any, sockets: list[KafkaSocket]
) -> None:
    """What docs/policies.md says of replicas: each proxy counts on its own, so with
    max.connections: 2 on two proxies broker 1 is reached by 2 x 2 connections, none evicted."""
    proxies = [_cluster_proxy(start_proxy, mock_cluster, {MAX_CONNECTIONS: 2}) for _ in range(2)]
    broker_port = int(broker_addresses(metadata(mock_cluster.bootstrap_servers[0]))[1][1])
    before = _upstream_sockets(broker_port, *proxies)
    held = [conn for proxy in proxies for conn in _hold_mock(sockets, _node_port(proxy, 1), 2)]
    for conn in held:
        _answered(conn)
    assert [closings(proxy) for proxy in proxies] == [0, 0]
    assert _upstream_sockets(broker_port, *proxies) - before >= 4  # each client connection has its own upstream one


def test_cluster_mode_counts_a_bootstrap_port_connection_against_the_broker_it_reaches(
    mock_cluster: Any, start_proxy: Any, sockets: list[KafkaSocket], tmp_path: Any
) -> None:
    """Cluster mode, max.connections: 2: the bootstrap port's first server is broker 1 (the mock
    advertises the addresses it is bootstrapped with), so once the proxy knows the brokers a
    bootstrap-port connection counts against broker 1, as broker 1 counts every connection it gets.
    With broker 1's two slots held through its node port, it evicts broker 1's least recently used
    one exactly as a third connection to node 1's port would (before, it was counted in a pool of
    its own and broker 1 got three); the gauges show one count per broker, none for ``bootstrap``."""
    audit = tmp_path / "audit"
    proxy = _cluster_proxy(start_proxy, mock_cluster, {MAX_CONNECTIONS: 2}, audit={"path": str(audit)})
    broker1_port = int(mock_cluster.bootstrap_servers[0].rsplit(":", 1)[1])
    node1 = _hold_mock(sockets, _node_port(proxy, 1), 2)
    before = _upstream_sockets(broker1_port, proxy)

    boot = _hold_mock(sockets, proxy.bootstrap, 1)[0]
    assert decided(proxy, action="evict", limit=MAX_CONNECTIONS) == 1, f"decisions: {decisions(proxy)}"
    assert node1[0].wait_closed(10)
    for conn in (node1[1], boot):
        _answered(conn)  # still served
    # one in (the bootstrap one), one out (evicted); with workers the victim's worker closes its
    # broker connection on the owner's word, a moment after the admitting worker opened the new one
    assert wait_until(lambda: _upstream_sockets(broker1_port, proxy) == before, timeout=5), _upstream_sockets(
        broker1_port, proxy
    )

    def counted() -> dict[str, float]:
        return {b: proxy.metric("kafka_admission_connections_counted", broker=b) for b in ("1", "2", "3", "bootstrap")}

    assert wait_until(lambda: counted() == {"1": 2, "2": 0, "3": 0, "bootstrap": 0}), counted()

    def opens() -> list[tuple[int | None, int]]:
        return _audit_opens(audit)

    # the connection that learned the brokers (in the bootstrap pool: no broker known yet), node 1's
    # two, then the bootstrap-port one, counted by broker 1 (2: the one it evicted gave up its slot)
    assert wait_until(lambda: len(opens()) == 4)
    assert opens() == [(None, 1), (1, 1), (1, 2), (1, 2)]


def test_cluster_mode_refuses_a_bootstrap_port_connection_over_its_brokers_per_ip_limit(
    mock_cluster: Any, start_proxy: Any, sockets: list[KafkaSocket]
) -> None:
    """max.connections.per.ip: 2 in cluster mode: with two connections from 127.0.0.1 on broker
    1's node port, a bootstrap-port connection (it reaches broker 1) is refused at once, as a third
    on node 1's port is, while broker 2 still admits one from the same address."""
    proxy = _cluster_proxy(start_proxy, mock_cluster, {"max.connections.per.ip": 2})
    _hold_mock(sockets, _node_port(proxy, 1), 2)
    boot = KafkaSocket(proxy.bootstrap)
    sockets.append(boot)
    assert boot.wait_closed(10), f"decisions: {decisions(proxy)}"
    third = KafkaSocket(_node_port(proxy, 1))
    sockets.append(third)
    assert third.wait_closed(10)
    assert decided(proxy, action="refuse", limit="max.connections.per.ip") == 2
    _hold_mock(sockets, _node_port(proxy, 2), 1)
    assert proxy.metric("kafka_admission_connections_counted", broker="2") == 1


def test_a_bootstrap_port_connection_from_before_the_brokers_were_known_moves_to_its_broker(
    mock_cluster: Any, start_proxy: Any, sockets: list[KafkaSocket]
) -> None:
    """A proxy's first client comes before any broker is known, so it is admitted in the
    ``bootstrap`` pool; the Metadata it gets names the broker it reached (broker 1), and from then
    on broker 1 counts it: with max.connections: 2, one more on node 1's port fills broker 1, and a
    third evicts that first connection, broker 1's least recently used (before, it stayed in a pool
    of its own and broker 1 took two more besides)."""
    proxy = start_proxy(mock_cluster.bootstrap_servers, node_ids=NODE_IDS, policies={MAX_CONNECTIONS: 2})
    first = KafkaSocket(proxy.bootstrap)
    sockets.append(first)
    first.send(metadata_frame(1))
    first.read_response(METADATA, 12)
    assert wait_until(lambda: proxy.metric("kafka_admission_brokers_known") == 3)
    assert proxy.metric("kafka_admission_connections_counted", broker="1") == 1
    assert proxy.metric("kafka_admission_connections_counted", broker="bootstrap") == 0

    node1 = _hold_mock(sockets, _node_port(proxy, 1), 2)
    assert decided(proxy, action="evict", limit=MAX_CONNECTIONS) == 1, f"decisions: {decisions(proxy)}"
    assert first.wait_closed(10)
    for conn in node1:
        _answered(conn)


def test_a_bootstrap_server_no_broker_advertises_keeps_the_bootstrap_pool(
    mock_cluster: Any, start_proxy: Any, sockets: list[KafkaSocket]
) -> None:
    """Bootstrapped through ``localhost`` while the brokers advertise ``127.0.0.1`` (as through a
    load balancer), the proxy cannot name the broker a bootstrap-port connection reaches: those
    count in the ``bootstrap`` pool, apart from broker 1's own, as docs/policies.md says. With
    max.connections: 2, two on node 1's port and two on the bootstrap port are all admitted."""
    servers = [f"localhost:{address.rsplit(':', 1)[1]}" for address in mock_cluster.bootstrap_servers]
    proxy = start_proxy(servers, node_ids=NODE_IDS, policies={MAX_CONNECTIONS: 2})
    learn = KafkaSocket(proxy.bootstrap)
    sockets.append(learn)
    learn.send(metadata_frame(1))
    learn.read_response(METADATA, 12)
    assert wait_until(lambda: proxy.metric("kafka_admission_brokers_known") == 3)
    held = [learn, *_hold_mock(sockets, proxy.bootstrap, 1), *_hold_mock(sockets, _node_port(proxy, 1), 2)]
    for conn in held:
        _answered(conn)
    assert closings(proxy) == 0
    counted = {b: proxy.metric("kafka_admission_connections_counted", broker=b) for b in ("1", "bootstrap")}
    assert counted == {"1": 2, "bootstrap": 2}


def test_a_bootstrap_port_connection_waits_for_its_brokers_slot_as_a_node_port_one_does(
    tansu: TansuBroker, start_proxy: Any, sockets: list[KafkaSocket]
) -> None:
    """Cluster mode in front of Tansu (it advertises its bootstrap address), max.connections: 2:
    with the broker's two slots taken by busy connections on its node port, a connection to the
    bootstrap port waits for the broker's slot (before, it was admitted at once, in a pool of its
    own) and is served when a node-port connection closes."""
    proxy = start_proxy(tansu.bootstrap, policies={MAX_CONNECTIONS: 2, "max.connections.wait.ms": 20000})
    learn = KafkaSocket(proxy.bootstrap)  # the proxy learns the broker (opens its port) from Metadata
    learn.send(metadata_frame(1))
    learn.read_response(METADATA, 12)
    learn.close()
    assert wait_until(lambda: proxy.metric("kafka_admission_connections_counted") == 0)
    topic = unique("empty")
    create_topic(tansu.bootstrap, topic)
    busy = []
    for _ in range(2):
        conn = KafkaSocket(_node_port(proxy, TansuBroker.NODE_ID))
        sockets.append(conn)
        busy.append((conn, conn.park_fetch(conn.topic_id(topic), max_wait_ms=8000)))
    assert wait_until(lambda: proxy.metric("kafka_admission_connections_counted_busy") == 2)

    waiting = KafkaSocket(proxy.bootstrap)
    sockets.append(waiting)
    waiting.send(api_versions_frame(1))
    assert wait_until(lambda: decided(proxy, action="wait", limit=MAX_CONNECTIONS) == 1), decisions(proxy)
    node = str(TansuBroker.NODE_ID)
    counted = {b: proxy.metric("kafka_admission_connections_counted", broker=b) for b in (node, "bootstrap")}
    assert counted == {node: 2, "bootstrap": 0}

    busy[0][0].close()  # the broker's slot frees
    assert waiting.read_response(API_VERSIONS, 3).header.correlation_id == 1
    assert busy[1][0].read_response(FETCH, 13).header.correlation_id == busy[1][1]  # never touched
    assert closings(proxy) == 0
