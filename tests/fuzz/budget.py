"""How much each fuzz target runs: ``FUZZ_PROFILE=ci`` (the default suite: a
few seconds per target, the same cases every run) or ``FUZZ_PROFILE=million``
(``make fuzz``: over a million cases in all, new ones every run). The
hypothesis targets take their settings from a hypothesis profile of the same
name; the loops (wire decoders in forked children, frames over sockets) take
their counts from here too, so one switch sizes the whole suite."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, settings


@dataclass(frozen=True)
class Budget:
    examples: int  # per hypothesis target
    config_examples: int  # the config loader (YAML, validation and a round trip: ~5 ms a case)
    wire_cases: int  # mutated frames decoded, over every API and version
    socket_frames: int  # hostile frames sent to a running proxy


PROFILE = os.environ.get("FUZZ_PROFILE", "ci")
BUDGETS = {
    "ci": Budget(examples=300, config_examples=200, wire_cases=6_000, socket_frames=300),
    "million": Budget(examples=20_000, config_examples=10_000, wire_cases=1_000_000, socket_frames=10_000),
}
BUDGET = BUDGETS[PROFILE]

for _name, _budget in BUDGETS.items():
    settings.register_profile(
        f"fuzz-{_name}",
        max_examples=_budget.examples,
        deadline=None,
        derandomize=_name == "ci",  # CI: the same cases every run; `make fuzz`: new ones
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )

FUZZ_SETTINGS = settings.get_profile(f"fuzz-{PROFILE}")
CONFIG_FUZZ_SETTINGS = settings(FUZZ_SETTINGS, max_examples=BUDGET.config_examples)


ROWS: dict[str, list[Any]] = {}  # target -> [cases, seconds, notes]


class Counter:
    """Counts the cases of one target (hypothesis examples, shrinking included) and
    the time from its first case to its last."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.cases = 0
        self.first = self.last = 0.0

    def __call__(self) -> None:
        self.last = time.monotonic()
        if not self.cases:
            self.first = self.last
        self.cases += 1

    def done(self, cases: int | None = None, seconds: float | None = None, note: str = "") -> None:
        row = ROWS.setdefault(self.target, [0, 0.0, []])
        row[0] += self.cases if cases is None else cases
        row[1] += self.last - self.first if seconds is None else seconds
        if note:
            row[2].append(note)
