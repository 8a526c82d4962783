"""Apache Kafka as a cluster of three: KRaft in combined mode, each node a broker and
one of three controller voters, node ids 1, 2, 3, on 127.0.0.1. Small JVMs (256 MiB
heap each) on this 2-core machine: start it once per module, and only in tests that need
more than one broker (the address rewriting ones)."""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

import pytest
from confluent_kafka.admin import AdminClient

from demo.tansu import free_port
from tests.apache_kafka.broker import ApacheKafkaBroker, JavaParts, fetch_java_parts, new_cluster_id

NODE_IDS = (1, 2, 3)
CLUSTER_JVM = ("-Xms64m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto")
CLUSTER_PROPERTIES = {
    "num.network.threads": "1",
    "num.io.threads": "1",
    "background.threads": "2",
    "log.cleaner.enable": "false",
}


def java_parts_or_skip() -> JavaParts:
    """The jars (fetched once), or a skip saying what to install."""
    if shutil.which("java") is None or shutil.which("mvn") is None:
        pytest.skip("java or mvn not installed (apt-get install default-jre-headless maven)")
    return fetch_java_parts()


class ApacheKafkaCluster:
    """``with ApacheKafkaCluster(parts, workdir) as cluster:`` three nodes serving, each
    advertising its own PLAINTEXT address, until the block ends."""

    def __init__(self, parts: JavaParts, workdir: Path) -> None:
        controllers = {node: free_port() for node in NODE_IDS}
        voters = {node: f"127.0.0.1:{port}" for node, port in controllers.items()}
        cluster_id = new_cluster_id()
        self.nodes = [
            ApacheKafkaBroker(
                parts,
                workdir / f"node{node}",
                properties=CLUSTER_PROPERTIES,
                jvm_options=CLUSTER_JVM,
                ports={"CONTROLLER": controllers[node]},
                node_id=node,
                voters=voters,
                cluster_id=cluster_id,
            )
            for node in NODE_IDS
        ]

    @property
    def bootstrap_servers(self) -> list[str]:
        return [node.bootstrap for node in self.nodes]

    @property
    def ports(self) -> set[int]:
        return {node.port for node in self.nodes}

    def start(self, timeout: float = 120.0) -> ApacheKafkaCluster:
        # Side by side: a node serves only once a majority of the voters runs.
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            started = [pool.submit(node.start, timeout) for node in self.nodes]
        try:
            for future in started:
                future.result()
            self._wait_for_every_broker(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_for_every_broker(self, timeout: float) -> None:
        admin = AdminClient({"bootstrap.servers": ",".join(self.bootstrap_servers), "log_level": 0})
        deadline = time.monotonic() + timeout
        while len(admin.list_topics(timeout=10).brokers) < len(self.nodes):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Apache Kafka cluster did not list {len(self.nodes)} brokers in {timeout}s")
            time.sleep(0.5)

    def stop(self) -> None:
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(ApacheKafkaBroker.stop, self.nodes))

    def __enter__(self) -> ApacheKafkaCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
