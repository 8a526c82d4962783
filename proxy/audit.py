"""The one audit interface: every decision that is not a plain admit becomes
one JSON line (versioned schema) in ``audit.path``, or in the log when unset."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, TextIO

from .metrics import Metrics

SCHEMA_VERSION = 1
_log = logging.getLogger("kafka_admission_proxy.audit")


class AuditSink:
    def __init__(self, settings: Any, metrics: Metrics) -> None:
        self._metrics = metrics
        self._file: TextIO | None = None
        path = settings.path
        self.writes_files = path is not None
        if path is not None:
            self._file = Path(path).open("a", buffering=1, encoding="utf-8")

    def emit(self, event_type: str, **fields: Any) -> None:
        event = {"schema_version": SCHEMA_VERSION, "ts": time.time(), "type": event_type, **fields}
        line = json.dumps(event, separators=(",", ":"), default=str)
        if self._file is not None:
            self._file.write(line + "\n")
        else:
            _log.info("audit %s", line)
        self._metrics.audit_events.labels(event_type).inc()

    def record(self, event: dict[str, Any]) -> None:
        # Transitional (the v2 sink replaces this module): one event of schema version 2.
        event = {"schema_version": 2, "ts": time.time(), "instance": "proxy", **event}
        line = json.dumps(event, separators=(",", ":"), default=str)
        if self._file is not None:
            self._file.write(line + "\n")
        else:
            _log.info("audit %s", line)
        self._metrics.audit_events.labels(event["type"]).inc()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
