"""What every connection of a running proxy shares: the current config generation
(swapped by one reference on reload), the connection gate, the memory pool, the
upstream connector, the decision recorder, the evidence sinks, the I/O driver and
the log of connection closes. Built once by the server; connections only read it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import trio

from policies.close_cause import Closing
from proxy.evidence.audit import AuditSink
from proxy.evidence.decisions import DecisionRecorder
from proxy.evidence.logs import RateLimitedLog
from proxy.evidence.metrics import Metrics
from proxy.evidence.observation_window import ObservationWindow
from proxy.hooks.generation import Generation
from proxy.links.upstream import UpstreamConnector
from proxy.serve.connection_gate import ConnectionGate
from proxy.serve.driver import IODriver
from proxy.serve.pool_gate import PoolGate


@dataclass(eq=False, slots=True)
class Runtime:
    generation: Generation
    gate: ConnectionGate
    pool: PoolGate
    connector: UpstreamConnector
    recorder: DecisionRecorder
    metrics: Metrics
    audit: AuditSink
    window: ObservationWindow | None  # the audit's observation windows (audit to files only)
    driver: IODriver = field(default_factory=IODriver)  # serves every established connection's sockets
    # Why connections closed, at most a line per cause and listener every few seconds.
    closes: RateLimitedLog = field(
        default_factory=lambda: RateLimitedLog(logging.getLogger("kafka_admission_proxy.connection"))
    )

    def send_stall_s(self) -> float:
        """How long a send may wait for a client to take a byte (connections.max.idle.ms), as the
        current generation says: a send that waits asks again, so that a reload reaches it."""
        return self.generation.send_stall_s

    def count_failure(self, listener: str, peer: str, closing: Closing) -> None:
        """A connection ended by a failure (``closing.failure``): counted by cause, and logged at
        most once per listener, cause and kind of line every few seconds. Other ends are not."""
        if not closing.failure:
            return
        self.metrics.connection_failures.labels(listener, closing.label).inc()
        self.closes.log(
            logging.WARNING,
            (listener, closing.label, closing.detail),
            trio.current_time(),
            "connection closed: %s",
            closing.reason,
            extra={"peer": peer, "listener": listener, "cause": closing.label},
        )
