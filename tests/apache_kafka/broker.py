"""Apache Kafka itself, from the jars ``tools/fetch-apache-kafka`` puts in
``.cache/apache-kafka/``: a single-node KRaft broker (combined controller and
broker) on 127.0.0.1 for the tests and benchmarks, and the Java client tools'
command lines. The broker is the reference the proxy's policies are held against."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from demo.tansu import free_port, stop_process

ROOT = Path(__file__).resolve().parents[2]
FETCH_SCRIPT = ROOT / "tools" / "fetch-apache-kafka"
KROXYLICIOUS_MAIN = ROOT / "tools" / "apache-kafka" / "KroxyliciousMain.java"
# A small, quick JVM: the tests run two brokers on a 2-core machine.
SMALL_JVM = ("-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto")
LOG4J2 = """\
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
logger.clients.name = org.apache.kafka.clients
logger.clients.level = WARN
"""


@dataclass(frozen=True)
class JavaParts:
    """Where the fetched jars are: one directory of jars per classpath."""

    kafka_version: str
    kafka_lib: Path  # the broker, its server modules, kafka-clients
    tools_lib: Path  # kafka-tools (perf tests, console consumer) and its kafka-clients
    kroxylicious_lib: Path

    def tool(self, main_class: str, *args: str) -> list[str]:
        """A command line running one of the Java client tools' main classes."""
        return ["java", "-Xmx256m", "-cp", f"{self.tools_lib}/*", main_class, *args]


def fetch_java_parts() -> JavaParts:
    """Run the fetch script (quick when the cache is filled) and read where it put the jars."""
    done = subprocess.run([str(FETCH_SCRIPT)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{FETCH_SCRIPT.relative_to(ROOT)} failed: {done.stderr.strip()}")
    values = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    return JavaParts(
        values["KAFKA_VERSION"],
        Path(values["KAFKA_LIB"]),
        Path(values["KAFKA_TOOLS_LIB"]),
        Path(values["KROXYLICIOUS_LIB"]),
    )


def new_cluster_id() -> str:
    """A KRaft cluster id, as the storage tool's ``random-uuid`` makes one."""
    cluster_id = "-"
    while cluster_id.startswith("-"):  # read as an option by the storage tool (Kafka's Uuid avoids it too)
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
    return cluster_id


@dataclass(frozen=True)
class BrokerTls:
    """The SSL listener's key and certificate (one PEM file, PKCS#8 key first) and the CA."""

    keystore_pem: Path
    ca_pem: Path


@dataclass
class ApacheKafkaBroker:
    """``with ApacheKafkaBroker(parts, workdir) as broker:`` runs one KRaft node until the
    block ends. Listeners: PLAINTEXT always; SSL with ``tls``; SASL_PLAINTEXT
    (SCRAM-SHA-512, credentials written at format time) with ``scram_users``.
    ``properties`` are added to (and override) server.properties; ``advertised`` is the
    ``host:port`` the PLAINTEXT listener names in metadata (default: its own). One node of
    a cluster: its ``node_id``, every node's controller address in ``voters`` (its own in
    ``ports["CONTROLLER"]``) and the ``cluster_id`` they share (default: a cluster of one)."""

    NODE_ID = 1

    parts: JavaParts
    workdir: Path
    properties: dict[str, str] = field(default_factory=dict)
    tls: BrokerTls | None = None
    scram_users: dict[str, str] = field(default_factory=dict)
    jvm_options: tuple[str, ...] = SMALL_JVM
    host: str = "127.0.0.1"
    advertised: str | None = None
    ports: dict[str, int] = field(default_factory=dict)  # listener name -> port
    node_id: int = NODE_ID
    voters: dict[int, str] = field(default_factory=dict)  # node id -> controller host:port
    cluster_id: str | None = None
    log4j: str = LOG4J2  # log4j2.properties (e.g. with the authorizer's logger turned up)
    _process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return self.address("PLAINTEXT")

    @property
    def port(self) -> int:
        return self.ports["PLAINTEXT"]

    def address(self, listener: str) -> str:
        return f"{self.host}:{self.ports[listener]}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "server.log"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def server_properties(self) -> dict[str, str]:
        names = ["PLAINTEXT"] + ["SSL"] * (self.tls is not None) + ["SASL_PLAINTEXT"] * bool(self.scram_users)
        for name in [*names, "CONTROLLER"]:
            self.ports.setdefault(name, free_port(self.host))
        data = [f"{n}://{self.address(n)}" for n in names]
        advertised = [f"PLAINTEXT://{self.advertised}", *data[1:]] if self.advertised else data
        voters = self.voters or {self.node_id: self.address("CONTROLLER")}
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": ",".join(f"{node}@{address}" for node, address in voters.items()),
            "controller.listener.names": "CONTROLLER",
            "listeners": ",".join([*data, f"CONTROLLER://{self.address('CONTROLLER')}"]),
            "advertised.listeners": ",".join(advertised),
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,"
            "CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.workdir / "data"),
            # one node, quick to start: small internal topics, no rebalance delay
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "group.consumer.heartbeat.interval.ms": "1000",  # KIP-848 rebalances in seconds
            "group.consumer.min.heartbeat.interval.ms": "1000",
            "num.partitions": "1",
            "num.network.threads": "2",
            "num.io.threads": "2",
        }
        if self.tls is not None:
            props |= {
                "ssl.keystore.type": "PEM",
                "ssl.keystore.location": str(self.tls.keystore_pem),
                "ssl.truststore.type": "PEM",
                "ssl.truststore.location": str(self.tls.ca_pem),
            }
        if self.scram_users:
            props |= {
                "sasl.enabled.mechanisms": "SCRAM-SHA-512",
                "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": (
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;"
                ),
            }
        return props | self.properties

    def _java(self, main_class: str, *args: str) -> list[str]:
        return [
            "java",
            *self.jvm_options,
            f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
            "-cp",
            f"{self.parts.kafka_lib}/*",
            main_class,
            *args,
        ]

    def start(self, timeout: float = 60.0) -> ApacheKafkaBroker:
        """Format fresh storage and run the broker until it serves."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in self.server_properties().items()))
        (self.workdir / "log4j2.properties").write_text(self.log4j)
        cluster_id = self.cluster_id or new_cluster_id()
        scram = [
            arg
            for user, password in self.scram_users.items()
            for arg in ("--add-scram", f"SCRAM-SHA-512=[name={user},password={password}]")
        ]
        formatted = subprocess.run(
            self._java("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(config), *scram),
            capture_output=True,
            text=True,
            check=False,
        )
        if formatted.returncode != 0:
            raise RuntimeError(f"kafka.tools.StorageTool format failed: {formatted.stdout}{formatted.stderr}")
        return self.launch(timeout)

    def launch(self, timeout: float = 60.0) -> ApacheKafkaBroker:
        """Run the broker on the storage it has (formatted by ``start``): after a stop or a
        kill this is a restart on the same ports, with every record it had written."""
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                self._java("kafka.Kafka", str(self.workdir / "server.properties")),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "LOG_DIR": str(self.workdir)},
            )
        try:
            self.wait_until_serving(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_until_serving(self, timeout: float) -> None:
        """Until the broker answers Metadata naming itself (its listeners open before that).

        A fresh client each try: one that learnt an ``advertised`` address nobody serves yet
        (a proxy started after the broker) would keep trying that address instead."""
        assert self._process is not None
        deadline = time.monotonic() + timeout
        while True:
            if self._process.poll() is not None:
                raise RuntimeError(f"Apache Kafka exited with {self._process.returncode}:\n{self.log()[-3000:]}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    pass
                admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
                if admin.list_topics(timeout=2).brokers:
                    return
            except (OSError, KafkaException):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"Apache Kafka did not serve on {self.bootstrap} within {timeout}s")
            time.sleep(0.2)

    def stop(self) -> None:
        if self._process is not None:
            stop_process(self._process, timeout=30)
            self._process = None

    def __enter__(self) -> ApacheKafkaBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
