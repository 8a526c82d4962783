"""The broker directory's index of advertised addresses: how a bootstrap server is known to be
a broker (policies.connections.bootstrap_broker asks it)."""

from __future__ import annotations

import trio

from proxy.evidence.metrics import Metrics
from proxy.links.brokers import BrokerDirectory
from proxy.protocol.rewrite import BrokerAddress


def learned(*brokers: BrokerAddress) -> BrokerDirectory:
    directory = BrokerDirectory(Metrics())
    trio.run(directory.learn, brokers)
    return directory


def test_a_bootstrap_server_is_the_node_that_advertises_its_address() -> None:
    directory = learned(BrokerAddress(1, "Kafka-0.example", 9092), BrokerAddress(2, "kafka-1.example", 9092))
    assert directory.node_at("kafka-0.example", 9092) == 1  # host names are not case-sensitive
    assert directory.node_at("kafka-1.example", 9092) == 2
    assert directory.node_at("kafka-1.example", 9093) is None
    assert directory.node_at("kafka-lb.example", 9092) is None


def test_an_address_two_nodes_advertise_is_no_one_broker() -> None:
    directory = learned(BrokerAddress(1, "kafka", 9092), BrokerAddress(2, "kafka", 9092))
    assert directory.node_at("kafka", 9092) is None


def test_a_broker_that_moves_leaves_its_old_address() -> None:
    directory = learned(BrokerAddress(1, "kafka-0", 9092))
    trio.run(directory.learn, [BrokerAddress(1, "kafka-0", 9093)])
    assert directory.node_at("kafka-0", 9092) is None
    assert directory.node_at("kafka-0", 9093) == 1


def test_when_one_of_two_nodes_at_an_address_moves_the_other_is_that_address_broker() -> None:
    directory = learned(BrokerAddress(1, "kafka", 9092), BrokerAddress(2, "kafka", 9092))
    trio.run(directory.learn, [BrokerAddress(2, "kafka", 9093)])
    assert directory.node_at("kafka", 9092) == 1
    assert directory.node_at("kafka", 9093) == 2
    trio.run(directory.learn, [BrokerAddress(1, "kafka", 9093)])  # and it joins the other at its new one
    assert directory.node_at("kafka", 9092) is None
    assert directory.node_at("kafka", 9093) is None


def test_placing_a_node_is_told_before_its_ports_open_and_only_for_an_address_it_alone_advertises() -> None:
    directory = BrokerDirectory(Metrics())
    events: list[object] = []
    directory.on_placed(lambda node_id, address: events.append((node_id, address)))

    async def open_node_port(node_id: int) -> None:
        events.append(f"port {node_id}")

    directory.on_new_node(open_node_port)
    trio.run(directory.learn, [BrokerAddress(1, "Kafka-0", 9092), BrokerAddress(2, "kafka-0", 9092)])
    assert events == [(1, "kafka-0:9092"), "port 1", "port 2"]  # 2 shares 1's address: neither is it
    assert directory.node_at("kafka-0", 9092) is None


def test_what_a_learn_found_new_or_moved_is_told_once_and_nothing_else() -> None:
    directory = BrokerDirectory(Metrics())
    told: list[list[BrokerAddress]] = []

    async def learned(brokers: list[BrokerAddress]) -> list[tuple[str, int]]:
        told.append(brokers)
        return []

    directory.on_learned(learned)
    first, second = BrokerAddress(1, "kafka-0", 9092), BrokerAddress(2, "kafka-1", 9092)
    trio.run(directory.learn, [first, second])
    trio.run(directory.learn, [first, second])  # known: nothing to tell (an echo from another worker ends here)
    moved = BrokerAddress(2, "kafka-1", 9093)
    trio.run(directory.learn, [first, moved])
    assert told == [[first, second], [moved]]
