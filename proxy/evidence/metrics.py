"""The one metrics registry of a proxy instance (prometheus-client).

Every name starts with ``kafka_admission_``. Labels stay bounded: listener
names, API names, causes; never client or group ids.

With ``workers: N`` (N > 1) every process writes its counters and gauges to
prometheus-client's multiprocess files and the supervisor serves one
``/metrics`` from them (proxy/workers/metrics.py). Each gauge says how the
processes' values combine (``multiprocess_mode``); a single process ignores it.
"""

from __future__ import annotations

import platform
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Literal

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from proxy.protocol.wire import api_name
from proxy.version import package_version

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

# single: the one process of workers: 1, as ever. With workers: N, the supervisor and
# each worker write multiprocess files: the supervisor alone loads the config and
# counts reloads; a worker's traffic reaches the files when it flushes.
Role = Literal["single", "supervisor", "worker"]


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

    def __init__(self, role: Role = "single") -> None:
        self.role = role
        self.registry = CollectorRegistry()
        r = self.registry
        # Operators' basics: what runs, and the standard process_* metrics (RSS, fds, CPU).
        ProcessCollector(registry=r)
        self.build_info = Gauge(
            "kafka_admission_build_info",
            "Always 1; the labels say which build runs",
            ("version", "python", "trio"),
            registry=r,
            multiprocess_mode="max",
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
            multiprocess_mode="mostrecent",
        )
        # Prometheus' own prometheus_config_last_reload_successful: 0 from a refused reload
        # until one succeeds, so an alert can stay firing while the stale config runs.
        self.config_last_reload_successful = Gauge(
            "kafka_admission_config_last_reload_successful",
            "1 when the last config load (start, or a reload) applied all of the file; 0 while the running "
            "config is older than the file (the last reload was invalid, restart_required or error)",
            registry=r,
            multiprocess_mode="mostrecent",
        )
        if role != "worker":  # the supervisor loads the config and sets both; a worker leaves them unset
            self.config_last_reload_success.set(time.time())
            self.config_last_reload_successful.set(1)
        self.certificate_expiry = Gauge(
            "kafka_admission_tls_certificate_expiry_timestamp_seconds",
            "notAfter of the certificate a TLS listener presents (listener 'upstream': the client "
            "certificate presented to brokers), Unix time",
            ("listener",),
            registry=r,
            multiprocess_mode="livemin",  # the soonest expiry any live process presents
        )
        conn = ("listener", "tls")
        self.connections_active = Gauge(
            "kafka_admission_connections_active",
            "Client connections open now",
            conn,
            registry=r,
            multiprocess_mode="livesum",
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
            multiprocess_mode="livesum",  # each worker caches its own
        )
        self.brokers_known = Gauge(
            "kafka_admission_brokers_known",
            "Broker nodes served on a proxy port",
            registry=r,
            multiprocess_mode="livemax",  # every worker learns the same brokers
        )
        self.traffic: dict[str, TrafficStats] = {}
        # Read at scrape time in one process; with workers, folded into the files by flush().
        self._files = _FileExport(r) if role != "single" else None
        if self._files is None:
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
            "kafka_admission_audit_queue_events",
            "Audit events queued for the sink's writer now",
            ("sink",),
            registry=r,
            multiprocess_mode="livesum",
        )

    def watch_audit_queue(self, sink: str, depth: Callable[[], int]) -> None:
        """``kafka_admission_audit_queue_events{sink}`` reads ``depth`` when scraped (with
        workers: when flushed, since the files hold only values that were set)."""
        if self._files is None:
            self.audit_queue_events.labels(sink).set_function(depth)
        else:
            self._files.queues[sink] = depth

    def watch_gauge(
        self,
        name: str,
        help_text: str,
        read: Callable[[], float | dict[str, float]],
        *,
        label: str | None = None,
        combine: Literal["livesum", "livemax"] = "livesum",
    ) -> None:
        """A gauge of state this process keeps, from ``read()`` (a value, or with ``label`` one per
        label value): one process reads it when scraped; with workers each flush sets it (a label
        value gone since is set to 0) and the scrape combines the live processes' (``combine``)."""
        watched = _Watched(name, help_text, read, label, combine)
        if self._files is None:
            self.registry.register(watched)
        else:
            self._files.watched.append(watched)

    def flush(self) -> None:
        """With workers: fold this process's traffic since the last flush, its trio tasks and
        its audit queues into the multiprocess files (a worker does it every few seconds and
        when the supervisor asks before a scrape: nothing is written per request). A single
        process has nothing to flush."""
        if self._files is not None:
            self._files.flush(self.traffic, self.audit_queue_events)


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


# The traffic families, served from TrafficStats by one process or flushed into files by each worker.
_REQUESTS = ("kafka_admission_requests", "Requests read from clients, by API")
_REQUEST_BYTES = ("kafka_admission_request_bytes", "Request bytes read from clients")
_RESPONSE_BYTES = ("kafka_admission_response_bytes", "Response bytes written to clients")
_ADDED_LATENCY = (
    "kafka_admission_proxy_added_latency_seconds",
    "Time a request and its response spent inside the proxy (not at the broker)",
)
_TASKS = ("kafka_admission_trio_tasks", "trio tasks alive in the proxy now")
# How each process's process_* gauge combines across the supervisor and its workers: memory
# summed over the live processes; the fds of the fullest process against the lowest limit
# (the alert on open / max fds is per process); the start of the oldest (the supervisor).
_PROCESS_MODES: dict[str, Literal["livesum", "livemax", "livemin", "min"]] = {
    "process_virtual_memory_bytes": "livesum",
    "process_resident_memory_bytes": "livesum",
    "process_start_time_seconds": "min",
    "process_open_fds": "livemax",
    "process_max_fds": "livemin",
}


class _TrafficCollector(Collector):
    def __init__(self, stats: dict[str, TrafficStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        requests = CounterMetricFamily(*_REQUESTS, labels=("listener", "api"))
        request_bytes = CounterMetricFamily(*_REQUEST_BYTES, labels=("listener",))
        response_bytes = CounterMetricFamily(*_RESPONSE_BYTES, labels=("listener",))
        latency = HistogramMetricFamily(*_ADDED_LATENCY, labels=("listener",))
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
        tasks = _trio_tasks()
        if tasks is not None:
            yield GaugeMetricFamily(*_TASKS, value=tasks)


def _trio_tasks() -> int | None:
    """Every trio task alive in this process (None outside a trio run, e.g. a unit test)."""
    try:
        root = trio.lowlevel.current_root_task()
    except RuntimeError:
        return None
    if root is None:
        return None
    tasks, stack = 0, [root]
    while stack:
        task = stack.pop()
        tasks += 1
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return tasks


class _Flushed:
    """What of one listener's TrafficStats is already in the files."""

    __slots__ = ("latency_buckets", "latency_sum", "request_bytes", "requests", "response_bytes")

    def __init__(self) -> None:
        self.requests: dict[int, int] = {}
        self.request_bytes = 0
        self.response_bytes = 0
        self.latency_buckets = [0] * (len(_LATENCY_BUCKETS) + 1)
        self.latency_sum = 0.0


class _Watched(Collector):
    """A gauge read from a process's state: by ``collect`` when one process is scraped, or written
    to the multiprocess files by ``flush`` (the Gauge is made at the first flush)."""

    def __init__(
        self,
        name: str,
        help_text: str,
        read: Callable[[], float | dict[str, float]],
        label: str | None,
        combine: Literal["livesum", "livemax"],
    ) -> None:
        self._family = (name, help_text, label, combine)
        self._read = read
        self._gauge: Gauge | None = None
        self._set: set[str] = set()

    def _values(self) -> dict[str, float]:
        value = self._read()
        return value if isinstance(value, dict) else {"": value}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        name, help_text, label, _ = self._family
        family = GaugeMetricFamily(name, help_text, labels=() if label is None else (label,))
        for key, value in self._values().items():
            family.add_metric(() if label is None else (key,), value)
        yield family

    def flush(self) -> None:
        name, help_text, label, combine = self._family
        if self._gauge is None:
            labels = () if label is None else (label,)
            self._gauge = Gauge(name, help_text, labels, registry=None, multiprocess_mode=combine)
        gauge, values = self._gauge, self._values()
        if label is None:
            gauge.set(values[""])
            return
        for gone in self._set - values.keys():
            gauge.labels(gone).set(0)
        for key, value in values.items():
            gauge.labels(key).set(value)
        self._set = set(values)


class _FileExport:
    """A worker's traffic, trio tasks and audit queue depths as multiprocess metrics, written
    at each flush: the request path keeps adding to plain numbers (TrafficStats), and a
    flush adds what they gained since the last one, a few writes per listener and API."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(*_REQUESTS, ("listener", "api"), registry=registry)
        self.request_bytes = Counter(*_REQUEST_BYTES, ("listener",), registry=registry)
        self.response_bytes = Counter(*_RESPONSE_BYTES, ("listener",), registry=registry)
        self.latency = Histogram(*_ADDED_LATENCY, ("listener",), registry=registry, buckets=_LATENCY_BUCKETS)
        self.tasks = Gauge(*_TASKS, registry=registry, multiprocess_mode="livesum")
        # prometheus-client's multiprocess mode has no process_* metrics: each process writes
        # its own at a flush, and they combine as _PROCESS_MODES says.
        self._process = ProcessCollector(registry=None)
        self._process_metrics: dict[str, Gauge] = {}
        self._cpu = Counter("process_cpu_seconds", "Total user and system CPU time spent in seconds.", registry=None)
        self._cpu_flushed = 0.0
        self.queues: dict[str, Callable[[], int]] = {}
        self.watched: list[_Watched] = []
        self._flushed: dict[str, _Flushed] = {}

    def flush(self, traffic: dict[str, TrafficStats], queue_gauge: Gauge) -> None:
        for listener, stats in traffic.items():
            done = self._flushed.get(listener)
            if done is None:
                done = self._flushed[listener] = _Flushed()
            for api_key, count in stats.requests.items():
                if count != done.requests.get(api_key, 0):
                    self.requests.labels(listener, api_name(api_key)).inc(count - done.requests.get(api_key, 0))
                    done.requests[api_key] = count
            if stats.request_bytes != done.request_bytes:
                self.request_bytes.labels(listener).inc(stats.request_bytes - done.request_bytes)
                done.request_bytes = stats.request_bytes
            if stats.response_bytes != done.response_bytes:
                self.response_bytes.labels(listener).inc(stats.response_bytes - done.response_bytes)
                done.response_bytes = stats.response_bytes
            if stats.latency_buckets != done.latency_buckets:
                # Histogram.observe adds one observation; a flush adds many per bucket, so it
                # adds to the child's bucket and sum values (the ones observe writes) directly.
                child = self.latency.labels(listener)
                for i, (now, before) in enumerate(zip(stats.latency_buckets, done.latency_buckets, strict=True)):
                    if now != before:
                        child._buckets[i].inc(now - before)
                child._sum.inc(stats.latency_sum - done.latency_sum)
                done.latency_buckets = list(stats.latency_buckets)
                done.latency_sum = stats.latency_sum
        tasks = _trio_tasks()
        if tasks is not None:
            self.tasks.set(tasks)
        for family in self._process.collect():
            value = family.samples[0].value
            if family.type == "counter":  # process_cpu_seconds: every process's, the dead ones' too
                self._cpu.inc(value - self._cpu_flushed)
                self._cpu_flushed = value
                continue
            gauge = self._process_metrics.get(family.name)
            if gauge is None:
                gauge = self._process_metrics[family.name] = Gauge(
                    family.name, family.documentation, registry=None, multiprocess_mode=_PROCESS_MODES[family.name]
                )
            gauge.set(value)
        for sink, depth in self.queues.items():
            queue_gauge.labels(sink).set(depth())
        for watched in self.watched:
            watched.flush()
