"""The one metrics registry of a proxy instance (prometheus-client).

Every name starts with ``kafka_admission_``. Labels stay bounded: listener
names, API names, causes; never client or group ids.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
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
        self.audit_events_dropped = Counter(
            "kafka_admission_audit_events_dropped",
            "Audit events lost: the queue was full (the writer fell behind) or the disk refused the write",
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
            "kafka_admission_audit_queue_events", "Audit events queued for the writer now", registry=r
        )
