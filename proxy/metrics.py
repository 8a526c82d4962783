"""The one metrics registry of a proxy instance (prometheus-client).

Every name starts with ``kafka_admission_``. Labels stay bounded: listener
names, API names, causes; never client or group ids.
"""

from __future__ import annotations

import platform
import time
from importlib.metadata import PackageNotFoundError, version

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

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
RELOAD_OUTCOMES = ("success", "invalid", "restart_required")
# The label of the client certificate presented to brokers (upstream.tls.cert_file).
UPSTREAM_CERTIFICATE = "upstream"


def package_version() -> str:
    """This distribution's version, as ``--version`` and ``kafka_admission_build_info`` show it."""
    try:
        return version("kafka-admission-proxy")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


class Metrics:
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
            "Config reloads (SIGHUP or a changed file), by outcome: success, invalid, restart_required",
            ("outcome",),
            registry=r,
        )
        for outcome in RELOAD_OUTCOMES:
            self.config_reloads.labels(outcome)
        self.config_last_reload_success = Gauge(
            "kafka_admission_config_last_reload_success_timestamp_seconds",
            "When the running config was last loaded successfully (start or reload), Unix time",
            registry=r,
        )
        self.config_last_reload_success.set(time.time())
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
        self.connections_rejected = Counter(
            "kafka_admission_connections_rejected",
            "Connection admission decisions other than admit: refuse, wait, evict (by the limit key behind them)",
            ("listener", "decision", "limit", "mode"),
            registry=r,
        )
        self.connections_evicted = Counter(
            "kafka_admission_connections_evicted",
            "Connections closed by the quotas: LRU eviction, idle expiry, lowered limits",
            ("listener", "limit", "mode"),
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
        self.frames_rejected = Counter(
            "kafka_admission_frames_rejected",
            "Request frames refused at their length prefix (too_large, invalid_size)",
            ("listener", "direction", "kind"),
            registry=r,
        )
        self.protocol_mismatches = Counter(
            "kafka_admission_protocol_mismatches",
            "A peer speaking the other protocol (TLS vs plaintext, HTTP), by direction (client, upstream) and kind",
            ("direction", "kind"),
            registry=r,
        )
        self.responses_oversized = Counter(
            "kafka_admission_responses_oversized",
            "Broker responses over max.response.size (enforce: connection closed; observe: forwarded)",
            ("listener", "mode"),
            registry=r,
        )
        self.memory_pool_waits = Counter(
            "kafka_admission_memory_pool_waits",
            "Requests that waited (enforce) or would have waited (observe) for pool memory, by reason",
            ("reason", "mode"),
            registry=r,
        )
        self.group_refusals = Counter(
            "kafka_admission_group_refusals",
            "Group joins refused (GROUP_MAX_SIZE_REACHED) or throttled, by API",
            ("api", "decision", "mode"),
            registry=r,
        )
        self.identifier_breaches = Counter(
            "kafka_admission_identifier_breaches",
            "Identifiers over their KIP-1233 limit, by API and identifier kind",
            ("api", "kind", "mode"),
            registry=r,
        )
        self.requests = Counter(
            "kafka_admission_requests", "Requests forwarded, by API", ("listener", "api"), registry=r
        )
        self.request_bytes = Counter(
            "kafka_admission_request_bytes",
            "Request bytes forwarded to brokers",
            ("listener",),
            registry=r,
        )
        self.response_bytes = Counter(
            "kafka_admission_response_bytes",
            "Response bytes returned to clients",
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
        self.proxy_latency = Histogram(
            "kafka_admission_proxy_added_latency_seconds",
            "Time a request and its response spent inside the proxy (not at the broker)",
            ("listener",),
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.brokers_known = Gauge("kafka_admission_brokers_known", "Broker nodes served on a proxy port", registry=r)
        self.audit_events = Counter(
            "kafka_admission_audit_events", "Audit events written, by type", ("type",), registry=r
        )
