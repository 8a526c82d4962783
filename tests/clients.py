"""Real Kafka clients for the tests: confluent-kafka (librdkafka) and
kafka-python workloads, and Apache Kafka's Java client tools, pointed at the
proxy or straight at a broker. The one
home of every client helper; the external processes the integration tests run
(mock cluster, stunnel, gate) live in tests/integration/kafka_helpers.py."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ClusterMetadata, NewTopic  # type: ignore[attr-defined]

from tests.apache_kafka.broker import JavaParts
from tests.conftest import wait_until

# Short client timeouts: a broken proxy shows as a failure in seconds, not minutes.
CLIENT_TIMEOUT_S = 10.0
# Tansu finishes a classic group's first join fast only with a short session timeout.
SESSION_TIMEOUT_MS = 6000
GROUP_CONF = {"session.timeout.ms": SESSION_TIMEOUT_MS, "auto.offset.reset": "earliest"}


def unique(prefix: str) -> str:
    """A topic or group name no other test (the Tansu broker is shared) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# --- confluent-kafka ---------------------------------------------------------


def metadata(bootstrap: str, *, timeout: float = CLIENT_TIMEOUT_S, **config: Any) -> ClusterMetadata:
    admin = AdminClient({"bootstrap.servers": bootstrap, **config})
    return admin.list_topics(timeout=timeout)


def broker_addresses(md: ClusterMetadata) -> dict[int, tuple[str, int]]:
    return {b.id: (str(b.host), int(b.port)) for b in md.brokers.values()}


def create_topic(bootstrap: str, topic: str, partitions: int = 1, **config: Any) -> None:
    """Create ``topic`` and wait until every partition has a leader."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **config})
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1)],
        operation_timeout=CLIENT_TIMEOUT_S,
        request_timeout=CLIENT_TIMEOUT_S,
    )
    futures[topic].result(timeout=CLIENT_TIMEOUT_S)

    def ready() -> bool:
        md = admin.list_topics(topic, timeout=CLIENT_TIMEOUT_S).topics.get(topic)
        return (
            md is not None
            and md.error is None
            and len(md.partitions) == partitions
            and all(p.leader >= 0 for p in md.partitions.values())
        )

    wait_until(ready, timeout=CLIENT_TIMEOUT_S, interval=0.2)


def produce(bootstrap: str, topic: str, count: int, **conf: Any) -> int:
    """Produce ``count`` keyed records ``record-<i>`` with an idempotent producer;
    returns how many the broker acknowledged. See ``produce_values`` for chosen
    values and the delivery reports."""
    delivered = 0
    errors: list[Any] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        nonlocal delivered
        if err is None:
            delivered += 1
        else:
            errors.append(err)

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, **conf})
    for i in range(count):
        producer.produce(topic, key=str(i).encode(), value=f"record-{i}".encode(), on_delivery=on_delivery)
        producer.poll(0)
    remaining = producer.flush(30)
    assert remaining == 0, f"{remaining} records still queued; errors: {errors[:3]}"
    return delivered


class ProduceResult:
    def __init__(self) -> None:
        self.delivered: list[tuple[int, bytes]] = []  # (partition, value)
        self.errors: list[KafkaError] = []
        self.stats: dict[str, Any] = {}


def produce_values(
    bootstrap: str,
    topic: str,
    values: list[bytes],
    *,
    partitions: list[int] | None = None,
    **config: Any,
) -> ProduceResult:
    """Produce ``values`` (round-robin over ``partitions`` if given) and flush.

    Unlike ``produce``, delivery errors are returned, not counted away: the
    result carries the delivery reports and the client's last statistics
    (which broker connections carried which requests).
    """
    result = ProduceResult()

    def on_delivery(err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            result.errors.append(err)
        else:
            result.delivered.append((msg.partition(), msg.value()))

    def on_stats(text: str) -> None:
        result.stats = json.loads(text)

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "message.timeout.ms": int(CLIENT_TIMEOUT_S * 1000),
            "linger.ms": 5,
            "statistics.interval.ms": 100,
            "stats_cb": on_stats,
            **config,
        }
    )
    for i, value in enumerate(values):
        kwargs: dict[str, Any] = {}
        if partitions is not None:
            kwargs["partition"] = partitions[i % len(partitions)]
        producer.produce(topic, value=value, on_delivery=on_delivery, **kwargs)
        producer.poll(0)
    left = producer.flush(CLIENT_TIMEOUT_S + 5)
    assert left == 0, f"{left} messages still undelivered after flush"
    # One statistics report after the last delivery, so it counts every Produce.
    seen = result.stats.get("ts")

    def fresh_stats() -> bool:
        producer.poll(0.1)
        return result.stats.get("ts") != seen

    wait_until(fresh_stats, timeout=5)
    return result


def consume(
    bootstrap: str,
    topic: str,
    group: str,
    count: int,
    *,
    timeout: float = 30.0,
    **config: Any,
) -> list[bytes]:
    """Join ``group``, read ``count`` records from the start of ``topic``, commit, leave."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            **GROUP_CONF,
            "enable.auto.commit": False,
            **config,
        }
    )
    values: list[bytes] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error() is not None:
                raise KafkaException(message.error())
            values.append(message.value() or b"")
        if values:
            consumer.commit(asynchronous=False)
            committed = consumer.committed(
                [TopicPartition(topic, p) for p in range(_partition_count(consumer, topic))],
                timeout=CLIENT_TIMEOUT_S,
            )
            assert sum(max(tp.offset, 0) for tp in committed) == len(values), committed
    finally:
        consumer.close()
    return values


def _partition_count(consumer: Consumer, topic: str) -> int:
    return len(consumer.list_topics(topic, timeout=CLIENT_TIMEOUT_S).topics[topic].partitions)


# --- consumer group members ------------------------------------------------


class Member:
    """A confluent-kafka consumer polling in its own thread."""

    def __init__(self, bootstrap: str, topic: str, group: str, **conf: object) -> None:
        config = {"bootstrap.servers": bootstrap, "group.id": group, **GROUP_CONF, **conf}
        if config.get("group.protocol") == "consumer":  # KIP-848: the broker sets the session timeout
            del config["session.timeout.ms"]
        self.consumer = Consumer(config)
        # Assignment is recorded by callbacks on the polling thread: a confluent-kafka
        # consumer must not be called from two threads at once.
        self.consumer.subscribe(
            [topic],
            on_assign=self._assigned,
            on_revoke=self._revoked,
            on_lost=self._revoked,
        )
        self.records = 0
        self.errors: list[KafkaError] = []
        # (topic, partition) held: eager rebalances hand over the whole assignment,
        # cooperative and KIP-848 ones only what changes.
        self.partitions: set[tuple[str, int]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            message = self.consumer.poll(0.2)
            if message is None:
                continue
            if message.error():
                self.errors.append(message.error())
                if message.error().fatal():
                    break
                continue
            self.records += 1
        self.consumer.close()

    def _assigned(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.partitions |= {(p.topic, p.partition) for p in partitions}

    def _revoked(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.partitions -= {(p.topic, p.partition) for p in partitions}

    @property
    def assigned(self) -> bool:
        return bool(self.partitions)

    def has_assignment(self) -> bool:
        return self.assigned

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def wait_for(predicate, timeout: float = 30.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def refused(member: Member) -> bool:
    return any(e.code() == KafkaError.GROUP_MAX_SIZE_REACHED for e in member.errors)


# --- kafka-python ------------------------------------------------------------


def kafka_python_roundtrip(
    bootstrap: str,
    topic: str,
    group: str,
    values: list[bytes],
    **config: Any,
) -> list[bytes]:
    """kafka-python: produce ``values`` (acks=all, kafka-python's default),
    then read them back in ``group``."""
    from kafka import KafkaConsumer, KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", request_timeout_ms=10000, **config)
    try:
        for value in values:
            producer.send(topic, value).get(timeout=CLIENT_TIMEOUT_S)
        producer.flush(timeout=CLIENT_TIMEOUT_S)
    finally:
        producer.close(timeout=5)
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=1000,
        consumer_timeout_ms=20000,
        enable_auto_commit=False,
        **config,
    )
    got: list[bytes] = []
    try:
        for message in consumer:
            got.append(message.value)
            if len(got) == len(values):
                break
        if got:
            consumer.commit()
    finally:
        consumer.close()
    return got


def kafka_python_brokers(bootstrap: str, **config: Any) -> dict[int, tuple[str, int]]:
    """The brokers kafka-python learns from Metadata (DescribeCluster not used)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000, **config)
    try:
        cluster = admin.describe_cluster()
    finally:
        admin.close()
    return {b["broker_id"]: (b["host"], b["port"]) for b in cluster["brokers"]}


# --- the Java client (Apache Kafka's own tools, run with java -cp) ----------

# The Java client logs every broker it connects to at DEBUG (NetworkClient).
_JAVA_LOG4J2 = """\
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = err
appender.err.type = Console
appender.err.name = err
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = %p %m (%c)%n
logger.net.name = org.apache.kafka.clients.NetworkClient
logger.net.level = DEBUG
"""


@dataclass(frozen=True)
class JavaRun:
    returncode: int
    stdout: str
    stderr: str

    @property
    def connected_to(self) -> set[str]:
        """Every ``host:port`` the Java client opened a connection to, from its own log."""
        return set(re.findall(r"Initiating connection to node (\S+:\d+) ", self.stderr))


def java_tool(parts: JavaParts, workdir: Path, main_class: str, *args: str, timeout: float = 90) -> JavaRun:
    """Run one of Apache Kafka's Java client tools (``org.apache.kafka.tools...``) to completion."""
    config = workdir / "java-client-log4j2.properties"
    config.write_text(_JAVA_LOG4J2)
    argv = parts.tool(main_class, *args)
    argv.insert(1, f"-Dlog4j2.configurationFile={config}")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    return JavaRun(done.returncode, done.stdout, done.stderr)
