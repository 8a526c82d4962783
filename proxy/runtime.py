"""What every connection of a running proxy shares: the current config generation
(swapped by one reference on reload), the connection gate, the memory pool, the
upstream connector, the decision recorder and the evidence sinks. Built once by
the server; connections only read it."""

from __future__ import annotations

from dataclasses import dataclass

from .audit import AuditSink
from .connection_gate import ConnectionGate
from .decisions import DecisionRecorder
from .generation import Generation
from .memory import PoolGate
from .metrics import Metrics
from .observation_window import ObservationWindow
from .upstream import UpstreamConnector


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
