"""Broker address rewriting with real brokers and real clients.

Cluster mode: every broker address a client can learn (Metadata,
FindCoordinator, DescribeCluster) names the proxy's port for that node, so
clients reach brokers only through the proxy: a broker whose own advertised
address refuses every client but the proxy still serves them all. Sidecar
mode: addresses pass through untouched.

The three-broker tests run twice: against librdkafka's mock cluster
(``[librdkafka-mock]``) and against Apache Kafka's 3-node KRaft cluster
(``[apache-kafka]``, marked ``apache_kafka``; tests/apache_kafka/cluster.py).
The single-broker ones run against Tansu.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import KafkaError
from kafka_helpers import ProxyOnlyGate

from demo.tansu import TansuBroker, free_port
from tests.apache_kafka.cluster import ApacheKafkaCluster, java_parts_or_skip
from tests.clients import (
    broker_addresses,
    consume,
    create_topic,
    kafka_python_brokers,
    kafka_python_roundtrip,
    metadata,
    produce_values,
    unique,
)
from tests.conftest import wait_until

NODE_IDS = (1, 2, 3)
# ApiVersions v0, correlation id 1, no client id
API_VERSIONS_V0 = b"\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\xff\xff"
# The librdkafka mock cluster speaks older protocol versions than kafka-python probes.
KAFKA_PYTHON_VS_MOCK = {"api_version": (2, 3, 0)}


def node_port_base(proxy: Any) -> int:
    return int(proxy.config["listeners"][0]["node_port_base"])


# --- three brokers: librdkafka's mock cluster, and Apache Kafka's ------------


@dataclass
class ThreeBrokers:
    """Three real brokers, node ids 1, 2, 3, each advertising its own address: librdkafka's
    mock cluster (``librdkafka-mock``) or Apache Kafka's 3-node KRaft cluster (``apache-kafka``)."""

    kind: str
    bootstrap_servers: list[str]
    ports: set[int]  # the brokers' own ports, which no client of the proxy may learn
    kafka_python: dict[str, Any]  # what kafka-python needs to talk to them

    def topic_led_by_several_brokers(self, bootstrap: str) -> tuple[str, dict[int, int]]:
        """A topic whose partition leaders are on at least two brokers: partition -> leader."""
        if self.kind == "librdkafka-mock":
            return _mock_topic_led_by_several_brokers(bootstrap)
        topic = unique("spread")
        create_topic(bootstrap, topic, partitions=6)  # Kafka spreads the leaders round-robin
        leaders = {p.id: p.leader for p in metadata(bootstrap).topics[topic].partitions.values()}
        assert set(leaders.values()) == set(NODE_IDS), leaders
        return topic, leaders


@pytest.fixture(scope="module")
def apache_kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheKafkaCluster]:
    """Apache Kafka's 3-node cluster, started once for this module (three small JVMs)."""
    with ApacheKafkaCluster(java_parts_or_skip(), tmp_path_factory.mktemp("apache-kafka-cluster")) as cluster:
        yield cluster


@pytest.fixture(params=["librdkafka-mock", pytest.param("apache-kafka", marks=pytest.mark.apache_kafka)])
def three_brokers(request: pytest.FixtureRequest) -> ThreeBrokers:
    """Each three-broker test runs against both clusters (the Apache Kafka one is marked
    ``apache_kafka``, so it runs in the JVM-backed xdist group)."""
    if request.param == "apache-kafka":
        cluster = request.getfixturevalue("apache_kafka_cluster")
        return ThreeBrokers("apache-kafka", cluster.bootstrap_servers, cluster.ports, {})
    mock = request.getfixturevalue("mock_cluster")
    return ThreeBrokers("librdkafka-mock", mock.bootstrap_servers, mock.ports, KAFKA_PYTHON_VS_MOCK)


def test_metadata_through_proxy_lists_only_proxy_node_ports(three_brokers: ThreeBrokers, start_proxy: Any) -> None:
    """Against librdkafka's mock cluster and Apache Kafka's 3-node cluster: both clients
    learn the proxy's three node ports, and none of the brokers' own."""
    proxy = start_proxy(three_brokers.bootstrap_servers, node_ids=NODE_IDS)
    base = node_port_base(proxy)
    expected = {node: ("127.0.0.1", base + node) for node in NODE_IDS}

    direct = broker_addresses(metadata(three_brokers.bootstrap_servers[0]))
    assert {port for _, port in direct.values()} == three_brokers.ports  # what the brokers say

    via_confluent = broker_addresses(metadata(proxy.bootstrap))
    via_kafka_python = kafka_python_brokers(proxy.bootstrap, **three_brokers.kafka_python)

    for seen in (via_confluent, via_kafka_python):
        assert seen == expected
        assert not {port for _, port in seen.values()} & three_brokers.ports
    assert proxy.metric("kafka_admission_responses_rewritten_total", api="metadata") >= 2
    assert proxy.metric("kafka_admission_brokers_known") == 3


def _mock_topic_led_by_several_brokers(bootstrap: str) -> tuple[str, dict[int, int]]:
    """A topic auto-created by the mock cluster whose partition leaders are on
    at least two brokers (the mock picks each leader at random)."""
    for _ in range(8):
        topic = unique("spread")
        md = _topic_metadata(bootstrap, topic)
        leaders = {p.id: p.leader for p in md.partitions.values()}
        if len(set(leaders.values())) >= 2:
            return topic, leaders
    raise AssertionError("the mock cluster put every partition of 8 topics on one broker")


def _topic_metadata(bootstrap: str, topic: str) -> Any:
    from confluent_kafka.admin import AdminClient

    # Asking for an unknown topic makes the mock cluster create it (4 partitions).
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    found = md.topics[topic]
    assert found.error is None, found.error
    return found


def test_produce_reaches_every_partition_leader_through_its_node_port(
    three_brokers: ThreeBrokers,
    start_proxy: Any,
) -> None:
    """Against librdkafka's mock cluster and Apache Kafka's 3-node cluster: confluent-kafka
    sends each partition's records to its leader, through that leader's node port."""
    proxy = start_proxy(three_brokers.bootstrap_servers, node_ids=NODE_IDS)
    base = node_port_base(proxy)
    topic, leaders = three_brokers.topic_led_by_several_brokers(proxy.bootstrap)
    partitions = sorted(leaders)

    values = [f"record-{i}".encode() for i in range(len(partitions) * 5)]
    result = produce_values(proxy.bootstrap, topic, values, partitions=partitions, acks="all")

    assert result.errors == []
    assert sorted(result.delivered) == sorted((partitions[i % len(partitions)], v) for i, v in enumerate(values))
    # The client's own view: which broker connections carried Produce requests.
    produce_requests = {
        b["nodeid"]: (b["nodename"], b["req"].get("Produce", 0))
        for b in result.stats["brokers"].values()
        if b["nodeid"] >= 0
    }
    used = {node for node, (_, count) in produce_requests.items() if count > 0}
    assert used == set(leaders.values())
    assert len(used) >= 2
    for node in used:
        assert produce_requests[node][0] == f"127.0.0.1:{base + node}"
    assert not any(name.endswith(f":{port}") for name, _ in produce_requests.values() for port in three_brokers.ports)
    # The proxy's view: it forwarded at least one Produce per leader.
    assert proxy.metric("kafka_admission_requests_total", api="produce") >= len(used)


def test_kafka_python_produces_to_a_three_broker_cluster_through_the_proxy(
    three_brokers: ThreeBrokers,
    start_proxy: Any,
) -> None:
    """Against librdkafka's mock cluster and Apache Kafka's 3-node cluster: kafka-python
    produces to every partition, and knows the brokers only by the proxy's node ports."""
    from kafka import KafkaProducer

    proxy = start_proxy(three_brokers.bootstrap_servers, node_ids=NODE_IDS)
    topic, leaders = three_brokers.topic_led_by_several_brokers(proxy.bootstrap)
    producer = KafkaProducer(
        bootstrap_servers=proxy.bootstrap,
        acks="all",
        request_timeout_ms=10000,
        **three_brokers.kafka_python,
    )
    try:
        sent = [producer.send(topic, f"kp-{p}".encode(), partition=p).get(timeout=10) for p in sorted(leaders)]
        cluster_brokers = {b.node_id: (b.host, b.port) for b in producer._metadata.brokers()}
    finally:
        producer.close(timeout=5)
    assert [m.partition for m in sent] == sorted(leaders)
    base = node_port_base(proxy)
    assert cluster_brokers == {node: ("127.0.0.1", base + node) for node in NODE_IDS}
    assert proxy.metric("kafka_admission_requests_total", api="produce") >= len(set(leaders.values()))


# --- a broker whose own address only the proxy may use ------------------------


@dataclass
class GatedBroker:
    broker: TansuBroker
    gate: ProxyOnlyGate

    @property
    def advertised(self) -> tuple[str, int]:
        return ("127.0.0.1", self.gate.port)

    def admit_only(self, proxy: Any) -> None:
        assert proxy.process is not None
        self.gate.allowed_pid = proxy.process.pid
        self.gate.open = False


@pytest.fixture
def gated_broker(gated_broker_process: GatedBroker) -> GatedBroker:
    gated_broker_process.gate.allowed_pid = None  # each test says whom to admit
    gated_broker_process.gate.open = False
    return gated_broker_process


@pytest.fixture(scope="module")
def gated_broker_process() -> Iterator[GatedBroker]:
    """Tansu advertising the address of a gate that forwards to it only the
    proxy's connections: a client that followed any address the proxy did not
    rewrite is refused there (and recorded)."""
    broker_port = free_port()
    gate = ProxyOnlyGate(("127.0.0.1", broker_port))
    try:
        with TansuBroker(port=broker_port, advertised=gate.address) as broker:
            yield GatedBroker(broker, gate)
    finally:
        gate.close()


def test_clients_following_the_brokers_own_address_are_refused_without_the_proxy(
    gated_broker: GatedBroker,
) -> None:
    """The control: without the proxy, clients learn the gate's address and fail."""
    broker = gated_broker.broker
    assert broker_addresses(metadata(broker.bootstrap)) == {TansuBroker.NODE_ID: gated_broker.advertised}
    refused_before = len(gated_broker.gate.refused)
    short: dict[str, Any] = {"message.timeout.ms": 2000}
    result = produce_values(broker.bootstrap, unique("direct"), [b"lost"], **short)
    assert result.delivered == []
    assert [e.code() for e in result.errors] == [KafkaError._MSG_TIMED_OUT]
    assert len(gated_broker.gate.refused) > refused_before


def test_confluent_kafka_never_uses_a_broker_address_the_proxy_did_not_rewrite(
    gated_broker: GatedBroker,
    start_proxy: Any,
) -> None:
    proxy = start_proxy(gated_broker.broker.bootstrap)
    gated_broker.admit_only(proxy)
    refused_before = len(gated_broker.gate.refused)
    forwarded_before = len(gated_broker.gate.forwarded)
    base = node_port_base(proxy)
    assert broker_addresses(metadata(proxy.bootstrap)) == {
        TansuBroker.NODE_ID: ("127.0.0.1", base + TansuBroker.NODE_ID)
    }
    topic = unique("gated")
    create_topic(proxy.bootstrap, topic, partitions=3)
    values = [f"v{i}".encode() for i in range(30)]
    result = produce_values(proxy.bootstrap, topic, values, acks="all")
    assert result.errors == []
    assert len(result.delivered) == len(values)

    consumed = consume(proxy.bootstrap, topic, unique("group"), len(values))

    assert sorted(consumed) == sorted(values)
    assert len(gated_broker.gate.refused) == refused_before  # no client used it
    assert len(gated_broker.gate.forwarded) > forwarded_before  # the proxy did
    # The group coordinator's address was rewritten too (FindCoordinator).
    assert proxy.metric("kafka_admission_responses_rewritten_total", api="find_coordinator") >= 1
    assert proxy.metric("kafka_admission_requests_total", api="join_group") >= 1
    assert proxy.metric("kafka_admission_requests_total", api="fetch") >= 1


def test_kafka_python_never_uses_a_broker_address_the_proxy_did_not_rewrite(
    gated_broker: GatedBroker,
    start_proxy: Any,
) -> None:
    proxy = start_proxy(gated_broker.broker.bootstrap)
    gated_broker.admit_only(proxy)
    refused_before = len(gated_broker.gate.refused)
    base = node_port_base(proxy)
    assert kafka_python_brokers(proxy.bootstrap) == {TansuBroker.NODE_ID: ("127.0.0.1", base + TansuBroker.NODE_ID)}
    topic = unique("gated-kp")
    create_topic(proxy.bootstrap, topic, partitions=2)
    values = [f"kp{i}".encode() for i in range(20)]

    consumed = kafka_python_roundtrip(proxy.bootstrap, topic, unique("kp-group"), values)

    assert sorted(consumed) == sorted(values)
    assert len(gated_broker.gate.refused) == refused_before
    assert proxy.metric("kafka_admission_responses_rewritten_total", api="find_coordinator") >= 1
    assert proxy.metric("kafka_admission_requests_total", api="sync_group") >= 1


def test_a_broker_advertising_an_address_nothing_listens_on_still_serves_clients(
    start_proxy: Any,
) -> None:
    """Literal form of the proof: the only address the broker ever advertises is
    dead, so any client that used an unrewritten address would fail. The proxy
    reaches the sole broker through its bootstrap server."""
    nowhere = free_port()
    with TansuBroker(advertised=f"127.0.0.1:{nowhere}") as broker:
        proxy = start_proxy(broker.bootstrap)
        topic = unique("nowhere")
        create_topic(proxy.bootstrap, topic, partitions=2)
        values = [f"n{i}".encode() for i in range(20)]
        assert produce_values(proxy.bootstrap, topic, values, acks="all").errors == []
        assert sorted(consume(proxy.bootstrap, topic, unique("g"), len(values))) == sorted(values)
        kp_topic = unique("nowhere-kp")
        create_topic(proxy.bootstrap, kp_topic)
        kp_values = [f"k{i}".encode() for i in range(10)]
        assert sorted(kafka_python_roundtrip(proxy.bootstrap, kp_topic, unique("kg"), kp_values)) == sorted(kp_values)
        assert f"advertises 127.0.0.1:{nowhere}, which does not answer" in proxy.log()


def test_a_sole_broker_that_is_down_is_not_said_to_advertise_an_address_that_does_not_answer(
    start_proxy: Any,
) -> None:
    """A sole broker advertising its own bootstrap address, then stopped: a client of its node port
    is refused as upstream unavailable, and the log does not say the broker "advertises an address
    which does not answer; reaching it through the bootstrap servers" (that address is the bootstrap
    server: the broker is down, not misadvertised)."""
    with TansuBroker() as broker:
        proxy = start_proxy(broker.bootstrap)
        assert broker_addresses(metadata(proxy.bootstrap)) == {
            TansuBroker.NODE_ID: ("127.0.0.1", node_port_base(proxy) + TansuBroker.NODE_ID)
        }
    node_port = node_port_base(proxy) + TansuBroker.NODE_ID
    with socket.create_connection(("127.0.0.1", node_port), timeout=10) as sock:
        sock.sendall(API_VERSIONS_V0)  # the first request makes the proxy connect upstream
        assert sock.recv(100) == b""  # closed: no broker
    wait_until(lambda: proxy.metric("kafka_admission_connection_failures_total", cause="upstream_unavailable") >= 1)
    assert "which does not answer" not in proxy.log()


# --- sidecar mode: addresses pass through ------------------------------------


def test_sidecar_mode_passes_broker_addresses_through_unchanged(
    gated_broker: GatedBroker,
    start_proxy: Any,
) -> None:
    proxy = start_proxy(gated_broker.broker.bootstrap, mode="sidecar")
    gated_broker.gate.open = True  # in sidecar mode clients do follow the broker's address

    assert broker_addresses(metadata(proxy.bootstrap)) == {TansuBroker.NODE_ID: gated_broker.advertised}
    assert proxy.metric("kafka_admission_requests_total", api="metadata") >= 1
    assert proxy.metric("kafka_admission_responses_rewritten_total") == 0
    # No node port is opened in sidecar mode.
    assert proxy.metric("kafka_admission_brokers_known") == 0


def test_sidecar_in_front_of_a_broker_that_advertises_the_proxy_carries_all_traffic(
    start_proxy: Any,
) -> None:
    """The sidecar deployment: the broker advertises the proxy's listener."""
    listener_port = free_port()
    with TansuBroker(advertised=f"127.0.0.1:{listener_port}") as broker:
        proxy = start_proxy(
            broker.bootstrap,
            mode="sidecar",
            listeners=[{"name": "sidecar", "bind": f"127.0.0.1:{listener_port}"}],
        )
        assert broker_addresses(metadata(proxy.bootstrap)) == {TansuBroker.NODE_ID: ("127.0.0.1", listener_port)}
        topic = unique("sidecar")
        create_topic(proxy.bootstrap, topic)
        values = [f"s{i}".encode() for i in range(10)]
        assert produce_values(proxy.bootstrap, topic, values).errors == []
        consumed = consume(proxy.bootstrap, topic, unique("sidecar-group"), len(values))

        assert sorted(consumed) == sorted(values)
        assert proxy.metric("kafka_admission_requests_total", listener="sidecar", api="produce") >= 1
        assert proxy.metric("kafka_admission_requests_total", listener="sidecar", api="fetch") >= 1
        assert proxy.metric("kafka_admission_responses_rewritten_total") == 0
