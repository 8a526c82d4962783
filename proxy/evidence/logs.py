"""Structured logging: ``key=value`` text or one JSON object per line.

Context goes in ``extra=`` (peer, listener, cause, ...) so both formats carry it.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def _context(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_context(record),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = " ".join(f"{k}={v}" for k, v in _context(record).items())
        return f"{line} {extra}" if extra else line


def setup_logging(fmt: str = "text", level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The first matplotlib import on a machine (`report`) builds its font cache and says so at INFO: not
    # the operator's business (a `report` stopped by a bad option must print that one line only).
    logging.getLogger("matplotlib").setLevel(max(root.level, logging.WARNING))


class RateLimitedLog:
    """At most one line per key every ``interval`` seconds; the lines held back are
    counted and named on the next line that goes out. A flood (a client reconnecting
    in a loop, a broker that is down) then costs a few lines, not thousands."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0, max_keys: int = 1024) -> None:
        self._logger = logger
        self._interval = interval
        self._max_keys = max_keys
        self._next: dict[object, float] = {}
        self._held: dict[object, int] = {}

    def log(
        self, level: int, key: object, now: float, msg: str, *args: Any, extra: dict[str, Any] | None = None
    ) -> None:
        if now < self._next.get(key, float("-inf")):
            self._held[key] = self._held.get(key, 0) + 1
            return
        if len(self._next) >= self._max_keys:  # bounded: forget the oldest key
            oldest = next(iter(self._next))
            del self._next[oldest]
            self._held.pop(oldest, None)
        self._next.pop(key, None)  # re-inserted last: the dict stays in order of last line
        self._next[key] = now + self._interval
        held = self._held.pop(key, 0)
        if held:
            msg += f" ({held} more like this in the last {self._interval:g}s not logged)"
        self._logger.log(level, msg, *args, extra=extra)
