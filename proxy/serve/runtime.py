"""What every connection of a running proxy shares: the current config generation
(swapped by one reference on reload), the connection gate, the memory pool, the
upstream connector, the decision recorder and the evidence sinks. Built once by
the server; connections only read it."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.evidence.audit import AuditSink
from proxy.evidence.decisions import DecisionRecorder
from proxy.evidence.metrics import Metrics
from proxy.evidence.observation_window import ObservationWindow
from proxy.hooks.generation import Generation
from proxy.links.upstream import UpstreamConnector
from proxy.serve.connection_gate import ConnectionGate
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
