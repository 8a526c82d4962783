"""Fuzz suite plumbing: every target counts the cases it ran and the time it
took, and the run ends with that table (``make fuzz`` also writes it to
``.fuzz-report.json``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fuzz.budget import PROFILE, ROWS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not ROWS:
        return
    total = int(sum(row[0] for row in ROWS.values()))
    seconds = sum(row[1] for row in ROWS.values())
    terminalreporter.section(f"fuzz cases (FUZZ_PROFILE={PROFILE})")
    for target, (cases, secs, notes) in sorted(ROWS.items()):
        noted = f"  ({'; '.join(notes)})" if notes else ""
        terminalreporter.line(f"{int(cases):>12,}  {secs:8.1f} s  {target}{noted}")
    terminalreporter.line(f"{total:>12,}  {seconds:8.1f} s  total")
    if PROFILE != "ci":
        rows = {t: {"cases": int(c), "seconds": round(s, 1), "notes": n} for t, (c, s, n) in ROWS.items()}
        Path(".fuzz-report.json").write_text(
            json.dumps({"profile": PROFILE, "total": total, "seconds": round(seconds, 1), "targets": rows}, indent=1)
        )
