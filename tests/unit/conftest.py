"""Every AuditSink a unit test makes is closed when the test ends: its writer thread would
otherwise outlive the test (several hundred by the end of tests/unit), and a later test that
looks at threads would see them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from proxy.evidence.audit import AuditSink


@pytest.fixture(autouse=True)
def _close_audit_sinks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    made: list[AuditSink] = []
    init = AuditSink.__init__

    def record(self: AuditSink, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(AuditSink, "__init__", record)
    yield
    for sink in made:
        sink.close(timeout=1.0)
