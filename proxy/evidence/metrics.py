"""The one metrics registry of a proxy instance (prometheus-client).

Every name starts with ``kafka_admission_``. Labels stay bounded: listener
names, API names, causes; never client or group ids.
"""

from __future__ import annotations

import platform
import time
from bisect import bisect_left
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from proxy.protocol.wire import api_name

_LATENCY_BUCKETS = (
    0.00005,
    0.0001,
    0.00015,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.1,
    0.5,
)


# Outcomes of a config reload, exported from the start (at 0) so alerts see them.
RELOAD_OUTCOMES = ("success", "invalid", "restart_required", "error")


def package_version() -> str:
    """This distribution's version, as ``--version`` and ``kafka_admission_build_info`` show it."""
    try:
        return version("kafka-admission-proxy")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


class Metrics:
    def traffic_of(self, listener: str) -> TrafficStats:
        """The listener's traffic counters (made once, shared by its connections)."""
        stats = self.traffic.get(listener)
        if stats is None:
            stats = self.traffic[listener] = TrafficStats()
        return stats

    def count_reload(self, outcome: str) -> None:
        """One reload's outcome (RELOAD_OUTCOMES): counted, and the reload gauges set as
        Prometheus sets its own (only ``success`` means all of the file runs)."""
        self.config_reloads.labels(outcome).inc()
        succeeded = outcome == "success"
        self.config_last_reload_successful.set(1 if succeeded else 0)
        if succeeded:
            self.config_last_reload_success.set_to_current_time()

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # Operators' basics: what runs, and the standard process_* metrics (RSS, fds, CPU).
        ProcessCollector(registry=r)
        self.build_info = Gauge(
            "kafka_admission_build_info",
            "Always 1; the labels say which build runs",
            ("version", "python", "trio"),
            registry=r,
        )
        self.build_info.labels(package_version(), platform.python_version(), trio.__version__).set(1)
        self.config_reloads = Counter(
            "kafka_admission_config_reloads",
            "Config reloads (SIGHUP or a changed file), by outcome: success, invalid, restart_required, error",
            ("outcome",),
            registry=r,
        )
        for outcome in RELOAD_OUTCOMES:
            self.config_reloads.labels(outcome)
        self.config_last_reload_success = Gauge(
            "kafka_admission_config_last_reload_success_timestamp_seconds",
            "When the running config was last loaded in full (start, or a reload counted success), Unix time",
            registry=r,
        )
        self.config_last_reload_success.set(time.time())
        # Prometheus' own prometheus_config_last_reload_successful: 0 from a refused reload
        # until one succeeds, so an alert can stay firing while the stale config runs.
        self.config_last_reload_successful = Gauge(
            "kafka_admission_config_last_reload_successful",
            "1 when the last config load (start, or a reload) applied all of the file; 0 while the running "
            "config is older than the file (the last reload was invalid, restart_required or error)",
            registry=r,
        )
        self.config_last_reload_successful.set(1)
        self.certificate_expiry = Gauge(
            "kafka_admission_tls_certificate_expiry_timestamp_seconds",
            "notAfter of the certificate a TLS listener presents (listener 'upstream': the client "
            "certificate presented to brokers), Unix time",
            ("listener",),
            registry=r,
        )
        conn = ("listener", "tls")
        self.connections_active = Gauge(
            "kafka_admission_connections_active", "Client connections open now", conn, registry=r
        )
        self.connections_accepted = Counter(
            "kafka_admission_connections_accepted", "Client connections accepted", conn, registry=r
        )
        self.connections_closed = Counter(
            "kafka_admission_connections_closed", "Client connections closed", conn, registry=r
        )
        self.decisions = Counter(
            "kafka_admission_decisions",
            "Policy decisions other than a plain admit (observe mode: what would have been done), "
            "by policy, action (refuse, throttle, wait, evict, close) and the Kafka property behind it",
            ("listener", "policy", "action", "limit", "mode"),
            registry=r,
        )
        self.acceptor_blocked = Counter(
            "kafka_admission_acceptor_blocked_seconds",
            "Time a listener stopped accepting because a cap was full (Kafka's AcceptorBlockedPercent)",
            ("listener",),
            registry=r,
        )
        self.connection_failures = Counter(
            "kafka_admission_connection_failures",
            "Client connections closed by an error, by cause",
            ("listener", "cause"),
            registry=r,
        )
        self.handshake_failures = Counter(
            "kafka_admission_tls_handshake_failures",
            "TLS handshakes with clients that failed or timed out",
            ("listener",),
            registry=r,
        )
        self.responses_rewritten = Counter(
            "kafka_admission_responses_rewritten",
            "Responses whose broker addresses or API versions were rewritten",
            ("listener", "api"),
            registry=r,
        )
        self.upstream_connect_failures = Counter(
            "kafka_admission_upstream_connect_failures",
            "Failed connections to a broker",
            ("upstream",),
            registry=r,
        )
        self.upstream_identities_minted = Counter(
            "kafka_admission_upstream_identities_minted",
            "Certificates issued by the identity CA for clients (a first connection of a subject, or a renewal)",
            registry=r,
        )
        self.upstream_identity_mint_failures = Counter(
            "kafka_admission_upstream_identity_mint_failures",
            "Certificates the identity CA could not issue (the client connection was closed)",
            registry=r,
        )
        self.upstream_identity_cache_size = Gauge(
            "kafka_admission_upstream_identity_cache_size",
            "Client identities (subjects) whose issued certificate and TLS context are cached",
            registry=r,
        )
        self.brokers_known = Gauge("kafka_admission_brokers_known", "Broker nodes served on a proxy port", registry=r)
        self.traffic: dict[str, TrafficStats] = {}
        r.register(_TrafficCollector(self.traffic))
        r.register(_TaskCollector())
        # sink: file (audit.path), topic (audit.topic) or log (neither): each has its own queue.
        self.audit_events = Counter(
            "kafka_admission_audit_events",
            "Audit events written (file, log) or delivered (topic), by type and sink",
            ("type", "sink"),
            registry=r,
        )
        self.audit_events_dropped = Counter(
            "kafka_admission_audit_events_dropped",
            "Audit events lost, by sink: its queue was full (the writer fell behind), the disk refused the"
            " write, or the topic's brokers did not take it (producer buffer full, delivery failed)",
            ("sink",),
            registry=r,
        )
        self.audit_files_deleted = Counter(
            "kafka_admission_audit_files_deleted",
            "Finished audit files of this instance deleted, oldest first, to stay within audit.max_total_bytes",
            registry=r,
        )
        self.audit_bytes_written = Counter(
            "kafka_admission_audit_bytes_written", "Bytes of audit JSON lines written to files", registry=r
        )
        self.audit_queue_events = Gauge(
            "kafka_admission_audit_queue_events", "Audit events queued for the sink's writer now", ("sink",), registry=r
        )


class TrafficStats:
    """Per-listener request counts, bytes and added latency, kept as plain numbers.

    The request path only adds to ints and a list (no lock, no label lookup);
    :class:`_TrafficCollector` turns them into metrics when Prometheus scrapes.
    Everything runs on the one trio thread, so the scrape sees consistent values.
    """

    __slots__ = ("latency_buckets", "latency_count", "latency_sum", "request_bytes", "requests", "response_bytes")

    def __init__(self) -> None:
        self.requests: dict[int, int] = {}  # api key -> requests read
        self.request_bytes = 0
        self.response_bytes = 0
        self.latency_buckets = [0] * (len(_LATENCY_BUCKETS) + 1)  # the last one is +Inf
        self.latency_count = 0
        self.latency_sum = 0.0

    def observe_latency(self, seconds: float) -> None:
        self.latency_buckets[bisect_left(_LATENCY_BUCKETS, seconds)] += 1
        self.latency_count += 1
        self.latency_sum += seconds


class _TrafficCollector(Collector):
    def __init__(self, stats: dict[str, TrafficStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        requests = CounterMetricFamily(
            "kafka_admission_requests", "Requests read from clients, by API", labels=("listener", "api")
        )
        request_bytes = CounterMetricFamily(
            "kafka_admission_request_bytes", "Request bytes read from clients", labels=("listener",)
        )
        response_bytes = CounterMetricFamily(
            "kafka_admission_response_bytes", "Response bytes written to clients", labels=("listener",)
        )
        latency = HistogramMetricFamily(
            "kafka_admission_proxy_added_latency_seconds",
            "Time a request and its response spent inside the proxy (not at the broker)",
            labels=("listener",),
        )
        for listener, stats in self._stats.items():
            for api_key, count in stats.requests.items():
                requests.add_metric((listener, api_name(api_key)), count)
            request_bytes.add_metric((listener,), stats.request_bytes)
            response_bytes.add_metric((listener,), stats.response_bytes)
            cumulative, buckets = 0, []
            for bound, count in zip((*_LATENCY_BUCKETS, float("inf")), stats.latency_buckets, strict=True):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            latency.add_metric((listener,), buckets, stats.latency_sum)
        yield from (requests, request_bytes, response_bytes, latency)


class _TaskCollector(Collector):
    """``kafka_admission_trio_tasks``: every trio task alive when scraped (a few per
    connection plus a fixed set), so a soak can tell a task leak from traffic."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            root = trio.lowlevel.current_root_task()
        except RuntimeError:  # collected outside the proxy's trio run (e.g. a unit test)
            return
        if root is None:
            return
        tasks, stack = 0, [root]
        while stack:
            task = stack.pop()
            tasks += 1
            for nursery in task.child_nurseries:
                stack.extend(nursery.child_tasks)
        yield GaugeMetricFamily("kafka_admission_trio_tasks", "trio tasks alive in the proxy now", value=tasks)
