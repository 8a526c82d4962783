"""Real Kafka clients (confluent-kafka, kafka-python) driven through the proxy,
and the external processes the integration tests need (librdkafka's mock
cluster, stunnel). Plain functions: imported by the test modules."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import re
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ClusterMetadata, NewTopic  # type: ignore[attr-defined]

from proxy.tansu import free_port, wait_for_port

# Short client timeouts: a broken proxy shows as a failure in seconds, not minutes.
CLIENT_TIMEOUT_S = 10.0
# Tansu joins classic consumer groups quickly only with this session timeout.
SESSION_TIMEOUT_MS = 6000


def unique(prefix: str) -> str:
    """A topic or group name no other test (the Tansu broker is shared) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


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
        operation_timeout=CLIENT_TIMEOUT_S, request_timeout=CLIENT_TIMEOUT_S,
    )
    futures[topic].result(timeout=CLIENT_TIMEOUT_S)

    def ready() -> bool:
        md = admin.list_topics(topic, timeout=CLIENT_TIMEOUT_S).topics.get(topic)
        return (
            md is not None and md.error is None and len(md.partitions) == partitions
            and all(p.leader >= 0 for p in md.partitions.values())
        )

    wait_until(ready, timeout=CLIENT_TIMEOUT_S, interval=0.2)


class ProduceResult:
    def __init__(self) -> None:
        self.delivered: list[tuple[int, bytes]] = []  # (partition, value)
        self.errors: list[KafkaError] = []
        self.stats: dict[str, Any] = {}


def produce(
    bootstrap: str, topic: str, values: list[bytes], *, partitions: list[int] | None = None,
    **config: Any,
) -> ProduceResult:
    """Produce ``values`` (round-robin over ``partitions`` if given) and flush.

    The result carries the delivery reports and the client's last statistics
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

    producer = Producer({
        "bootstrap.servers": bootstrap,
        "message.timeout.ms": int(CLIENT_TIMEOUT_S * 1000),
        "linger.ms": 5,
        "statistics.interval.ms": 100,
        "stats_cb": on_stats,
        **config,
    })
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
    bootstrap: str, topic: str, group: str, count: int, *, timeout: float = 15.0, **config: Any,
) -> list[bytes]:
    """Join ``group``, read ``count`` records from the start of ``topic``, commit, leave."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": SESSION_TIMEOUT_MS,
        "enable.auto.commit": False,
        **config,
    })
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


# --- kafka-python ------------------------------------------------------------


def kafka_python_roundtrip(
    bootstrap: str, topic: str, group: str, values: list[bytes], **config: Any,
) -> list[bytes]:
    """kafka-python: produce ``values`` (acks=all), then read them back in ``group``."""
    from kafka import KafkaConsumer, KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=10000, **config)
    try:
        for value in values:
            producer.send(topic, value).get(timeout=CLIENT_TIMEOUT_S)
        producer.flush(timeout=CLIENT_TIMEOUT_S)
    finally:
        producer.close(timeout=5)
    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
        session_timeout_ms=SESSION_TIMEOUT_MS, heartbeat_interval_ms=1000,
        consumer_timeout_ms=15000, enable_auto_commit=False, **config,
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


# --- librdkafka's mock cluster -----------------------------------------------


class MockCluster:
    """librdkafka's built-in mock cluster: real broker sockets on 127.0.0.1
    that live as long as the client object that created them.

    Node ids are 1..n. Topics are auto-created (4 partitions) or made with
    CreateTopics; partition leaders are spread over the brokers.
    """

    def __init__(self, brokers: int = 3) -> None:
        lines: queue.Queue[str] = queue.Queue()

        class _Collect(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                lines.put(record.getMessage())

        self._logger = logging.getLogger(f"mock-cluster-{id(self)}")
        self._logger.propagate = False
        self._logger.addHandler(_Collect())
        self._logger.setLevel(logging.DEBUG)
        self._owner: Producer | None = Producer(
            {"test.mock.num.brokers": brokers, "debug": "mock", "logger": self._logger}
        )
        self.bootstrap_servers: list[str] = []
        deadline = time.monotonic() + 10
        while not self.bootstrap_servers and time.monotonic() < deadline:
            self._owner.poll(0.05)
            while not lines.empty():
                found = re.search(r"bootstrap\.servers=(\S+)", lines.get())
                if found:
                    self.bootstrap_servers = found.group(1).split(",")
        if not self.bootstrap_servers:
            raise AssertionError("librdkafka mock cluster did not log its bootstrap.servers")
        for address in self.bootstrap_servers:
            wait_for_port(*host_port(address))

    @property
    def ports(self) -> set[int]:
        return {host_port(a)[1] for a in self.bootstrap_servers}

    def close(self) -> None:
        self._owner = None  # the mock brokers go with their client


# --- stunnel: TLS in front of a plaintext broker -----------------------------


def stunnel_binary() -> str | None:
    return shutil.which("stunnel4") or shutil.which("stunnel")


class Stunnel:
    """``stunnel`` terminating TLS on ``accept`` and forwarding to ``connect``."""

    def __init__(
        self, binary: str, workdir: Path, *, connect: str, cert_file: str, key_file: str,
        accept_port: int | None = None,
    ) -> None:
        self.port = accept_port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_path = workdir / f"stunnel-{self.port}.log"
        self.config_path = workdir / f"stunnel-{self.port}.conf"
        self.output_path = workdir / f"stunnel-{self.port}.out"
        self.config_path.write_text(
            "foreground = yes\n"
            "pid =\n"
            f"output = {self.log_path}\n"
            "debug = info\n"
            "[kafka]\n"
            f"accept = {self.address}\n"
            f"connect = {connect}\n"
            f"cert = {cert_file}\n"
            f"key = {key_file}\n"
        )
        self._binary = binary
        self._process: subprocess.Popen[bytes] | None = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def accepted_connections(self) -> int:
        return len(re.findall(r"accepted connection from", self.log()))

    def start(self) -> Stunnel:
        with self.output_path.open("wb") as output:
            self._process = subprocess.Popen(
                [self._binary, str(self.config_path)], stdout=output, stderr=subprocess.STDOUT,
            )
        try:
            wait_for_port("127.0.0.1", self.port, timeout=10)
        except TimeoutError:
            printed = self._stop()
            raise AssertionError(
                f"stunnel did not listen on {self.address}:\n{printed}\n{self.log()}"
            ) from None
        return self

    def _stop(self) -> str:
        if self._process is None:
            return ""
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None
        return self.output_path.read_text(errors="replace")

    def stop(self) -> None:
        self._stop()

    def __enter__(self) -> Stunnel:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


# --- a broker address only the proxy may use ---------------------------------


def _socket_inode(local_port: int, remote_port: int) -> int | None:
    """The inode of the TCP socket ``127.0.0.1:local_port -> ...:remote_port``."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], fields[9]
            if int(local.rsplit(":", 1)[1], 16) == local_port and int(
                remote.rsplit(":", 1)[1], 16
            ) == remote_port:
                return int(inode)
    return None


def _process_owns_socket(pid: int, inode: int) -> bool:
    target = f"socket:[{inode}]"
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:  # the process is gone
        return False
    for fd in fds:
        try:
            if os.readlink(fd) == target:
                return True
        except OSError:
            continue
    return False


class ProxyOnlyGate:
    """A TCP forwarder standing at a broker's advertised address that serves
    one process only (the proxy): a connection from anyone else is recorded in
    ``refused`` and closed. A client that ever used an address the proxy did
    not rewrite would show up there, and fail."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self.address = f"127.0.0.1:{self.port}"
        self.allowed_pid: int | None = None  # None: refuse everyone
        self.open = False  # True: forward everyone (a plain forwarder)
        self.forwarded: list[int] = []  # client ports of the proxy's connections
        self.refused: list[int] = []  # client ports of anyone else's
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, (_, peer_port) = self._listener.accept()
            except OSError:
                return
            inode = _socket_inode(peer_port, self.port)
            pid = self.allowed_pid
            admitted = self.open or (
                pid is not None and inode is not None and _process_owns_socket(pid, inode)
            )
            if not admitted:
                self.refused.append(peer_port)
                conn.close()
                continue
            try:
                upstream = socket.create_connection(self._upstream, timeout=5)
            except OSError:
                conn.close()
                continue
            upstream.settimeout(None)
            self.forwarded.append(peer_port)
            self._sockets += [conn, upstream]
            threading.Thread(target=self._pipe, args=(conn, upstream), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, conn), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()
