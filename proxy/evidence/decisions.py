"""The one decision recorder: every policy decision that is not a plain admit
becomes exactly one metric increment (``kafka_admission_decisions_total``), one
audit event (``decision``, schema version 2) and one log line, rate-limited per
kind of decision so that a flood costs a few lines.

Observe-mode decisions are recorded the same way, with ``mode="observe"``; the
caller then lets the traffic through (``Decision.enforced``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from policies.decision import Decision
from proxy.evidence.audit import AuditSink
from proxy.evidence.logs import RateLimitedLog
from proxy.evidence.metrics import Metrics
from proxy.protocol.wire import api_name

log = logging.getLogger("kafka_admission_proxy.decisions")


@dataclass(frozen=True, slots=True)
class Where:
    """The connection a decision was taken on (the audit event's context fields)."""

    listener: str | None = None
    client_address: str | None = None
    conn_id: str | None = None
    tls: bool | None = None


NOWHERE = Where()


class DecisionRecorder:
    def __init__(self, metrics: Metrics, audit: AuditSink) -> None:
        self._counter = metrics.decisions
        self._audit = audit
        self._log = RateLimitedLog(log)

    def record(
        self,
        decision: Decision,
        where: Where = NOWHERE,
        *,
        client_id: str | None = None,
        api_key: int | None = None,
        api_version: int | None = None,
        correlation_id: int | None = None,
        **about: Any,
    ) -> None:
        """One decision: counted, audited, logged. ``about`` adds schema fields such as
        ``size``, ``upstream`` or ``direction`` to those the decision carries."""
        policy, action, mode = decision.policy.value, decision.action.value, decision.mode.value
        self._counter.labels(where.listener or "", policy, action, decision.limit_key, mode).inc()
        api = api_name(api_key) if api_key is not None else None
        event: dict[str, Any] = {
            "type": "decision",
            "policy": policy,
            "action": action,
            "mode": mode,
            "reason": decision.reason,
            "limit_key": decision.limit_key,
            "limit": decision.limit,
            "listener": where.listener,
            "client_address": where.client_address,
            "conn_id": where.conn_id,
            "tls": where.tls,
            "client_id": client_id,
            "api": api,
            "api_key": api_key,
            "api_version": api_version,
            "correlation_id": correlation_id,
            "error_code": decision.error_code,
            **decision.subject,
            **about,
        }
        self._audit.record(event)
        verb = action if decision.enforced else f"would {action}"
        what = f" {api}" if api else ""
        self._log.log(
            logging.WARNING if decision.enforced else logging.INFO,
            (policy, action, decision.limit_key, where.listener),
            time.monotonic(),
            "%s%s: %s%s",
            verb,
            what,
            decision.reason,
            "" if decision.enforced else " (observe mode)",
            extra={"peer": where.client_address, "listener": where.listener, "policy": policy},
        )
