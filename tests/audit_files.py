"""Reading the proxy's audit directory in tests: the events in it, in order, and
their check against the v2 JSON Schema (schema/audit-event-v2.schema.json)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "schema" / "audit-event-v2.schema.json").read_text())
_VALIDATOR = Draft202012Validator(SCHEMA)
_NAME = re.compile(r"^(?P<instance>.+)-\d{8}T\d{6}Z-(?P<seq>\d{6,})\.jsonl(?P<open>\.open)?$")


def audit_files(directory: Path | str, *, finished_only: bool = False) -> list[Path]:
    """The audit files in ``directory``, ordered by instance and sequence number."""
    found = []
    for path in Path(directory).iterdir():
        match = _NAME.match(path.name)
        if match is None or (finished_only and match["open"]):
            continue
        found.append((match["instance"], int(match["seq"]), path))
    return [path for _, _, path in sorted(found)]


def read_events(directory: Path | str, *, finished_only: bool = False) -> list[dict[str, Any]]:
    """Every event in ``directory`` (the file being written too, unless
    ``finished_only``), oldest first per instance."""
    events = []
    for path in audit_files(directory, finished_only=finished_only):
        text = path.read_text()
        if path.suffix == ".open":
            text = text[: text.rfind("\n") + 1]  # a batch may be half written
        events.extend(json.loads(line) for line in text.splitlines())
    return events


def schema_errors(event: dict[str, Any]) -> list[str]:
    """Why ``event`` is not a valid v2 event (empty when it is)."""
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in _VALIDATOR.iter_errors(event)]


def assert_valid(events: list[dict[str, Any]]) -> None:
    assert events, "no events to check"
    for event in events:
        errors = schema_errors(event)
        assert not errors, f"{event}: {errors}"
