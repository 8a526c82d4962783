"""What the evidence covers, and whether it is enough to recommend from.

The proxies' observation windows are the unit of evidence: every proxy writes a
``pool`` window row each ``audit.window.seconds`` (``proxy/evidence/observation_window.py``),
busy or idle, plus a row per section that saw something in that window. From the
windows of each proxy this module works out the time covered, how many windows
measured each limit, and the gaps: stretches longer than :data:`GAP_WINDOWS` of a
proxy's window periods in which it wrote no window (down, cut off from its audit
sink, or not yet started), between the fleet's first window and its last.

Two judgements follow, stated on the report's page and in the recommended YAML:
evidence spanning less than ``--min-span`` makes every recommendation
*provisional*, and a limit measured by fewer than ``--min-windows`` windows gets
no number at all (too thin).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from policies.properties import (
    GROUP_CONSUMER_MAX_SIZE,
    GROUP_MAX_SIZE,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_IP,
    MAX_RESPONSE_SIZE,
    MAX_SSL_CONNECTIONS,
    QUEUED_MAX_REQUEST_BYTES,
    RESOURCE_IDENTIFIER_LIMIT_ENABLE,
    SOCKET_REQUEST_MAX_BYTES,
)

from .events import SECTIONS, Evidence, local_frame, proxy_of
from .limits import IDENTIFIER_KEYS

__all__ = [
    "GAP_WINDOWS",
    "MIN_SPAN_SECONDS",
    "MIN_WINDOWS",
    "Coverage",
    "DurationError",
    "Gap",
    "measure_coverage",
    "nice_duration",
    "parse_duration",
    "parse_instant",
]

GAP_WINDOWS: Final = 3  # silent for more than this many window periods: a gap (one late roll is not)
MIN_SPAN_SECONDS: Final = 7 * 86400.0  # a week: every weekday, the weekend and a weekly batch job
# A limit needs this many windows that measured it: the next window exceeds the largest of n alike
# windows with probability 1/(n+1), about 3% at 30, a third at 2.
MIN_WINDOWS: Final = 30

# What measured each limit: the kind of window (section; group per kind, connections per TLS).
_MEASURED_BY: Final[dict[str, tuple[str, str]]] = {
    GROUP_MAX_SIZE: ("group/classic", "with a classic group"),
    GROUP_CONSUMER_MAX_SIZE: ("group/consumer", "with a consumer (KIP-848) group"),
    MAX_CONNECTIONS: ("connections", "with connections"),
    MAX_SSL_CONNECTIONS: ("connections/tls", "with TLS connections"),
    MAX_CONNECTIONS_PER_IP: ("connections", "with connections"),
    QUEUED_MAX_REQUEST_BYTES: ("pool", "of the memory pool"),
    SOCKET_REQUEST_MAX_BYTES: ("client_api", "with requests"),
    MAX_RESPONSE_SIZE: ("client_api", "with requests"),
    RESOURCE_IDENTIFIER_LIMIT_ENABLE: ("identifier", "with identifiers checked"),
    **{key: ("identifier", "with identifiers checked") for key in IDENTIFIER_KEYS},
}

_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>[smhdw]?)")


class DurationError(ValueError):
    """A duration option the report cannot read; the message names the option and the rule."""


def parse_duration(text: str, option: str = "--min-span") -> float:
    """``7d``, ``12h``, ``30m``, ``45s``, ``2w`` or plain seconds (``3600``, ``1.5``) -> seconds."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None:
        raise DurationError(f"{option} {text}: a duration such as 7d, 12h, 30m, 45s or plain seconds")
    return float(match["n"]) * _UNITS[match["unit"] or "s"]


def parse_instant(text: str, option: str, now: float) -> float:
    """An ISO 8601 time (``2026-11-20``, ``2026-11-20T08:00Z``; UTC when it names no offset) or a
    duration before ``now`` (``7d``, ``12h``, as :func:`parse_duration`) -> Unix seconds."""
    try:
        return now - parse_duration(text, option)
    except DurationError:
        pass
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise DurationError(
            f"{option} {text}: an ISO time such as 2026-11-20T08:00Z (UTC unless it says), or a duration"
            " before now such as 7d, 12h, 30m"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def nice_duration(seconds: float) -> str:
    """90 -> '1.5 min', 36 hours -> '1.5 d'; to a tenth, whole units without one ('7 d', '30 min')."""
    unit, size = next(((u, s) for u, s in (("d", 86400), ("h", 3600), ("min", 60)) if seconds >= s), ("s", 1))
    return f"{seconds / size:.1f}".removesuffix(".0") + f" {unit}"


@dataclass(frozen=True)
class Gap:
    """A proxy silent from ``start`` to ``end`` (Unix seconds): no window of it began in between."""

    instance: str
    start: float
    end: float
    period: float  # the proxy's window period

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def windows_missed(self) -> int:
        return int(self.seconds // self.period)


@dataclass(frozen=True)
class Coverage:
    """The fleet's windows: when, from which proxies, how many of each kind, and the gaps."""

    first: float | None = None  # the first window's start
    last: float | None = None  # the last window's end
    windows: dict[str, int] = field(default_factory=dict)  # proxy -> windows it wrote
    periods: dict[str, float] = field(default_factory=dict)  # proxy -> its window period (median)
    by_kind: dict[str, int] = field(default_factory=dict)  # _MEASURED_BY's kinds -> windows
    gaps: tuple[Gap, ...] = ()

    @property
    def span_seconds(self) -> float:
        return 0.0 if self.first is None or self.last is None else self.last - self.first

    @property
    def total_windows(self) -> int:
        return sum(self.windows.values())

    def windows_for(self, key: str) -> int:
        """How many windows measured what ``key`` limits."""
        return self.by_kind.get(_MEASURED_BY[key][0], 0)

    def thin(self, key: str, min_windows: int) -> str | None:
        """Why ``key`` is too thin to recommend from, or None when its windows are enough."""
        n = self.windows_for(key)
        if n >= min_windows:
            return None
        return (
            f"too thin to recommend: {n} observation window{'' if n == 1 else 's'} {_MEASURED_BY[key][1]}, "
            f"at least {min_windows} needed (--min-windows)"
        )

    @staticmethod
    def of(rows: Iterable[Any]) -> Coverage:
        """From rows of ``instance``, ``kind``, ``window_start``, ``seconds``: one per proxy, window and kind
        of row it wrote (:func:`_kinds`)."""
        starts: dict[str, dict[float, float]] = {}
        seen: dict[str, set[tuple[str, float]]] = {}
        for r in rows:
            instance, start = str(r["instance"]), float(r["window_start"])
            windows = starts.setdefault(instance, {})
            windows[start] = max(windows.get(start, 0.0), float(r["seconds"] or 0.0))
            kind = str(r["kind"])
            seen.setdefault(kind, set()).add((instance, start))
            if kind.startswith("connections/"):  # a window with TLS or plaintext connections has connections
                seen.setdefault("connections", set()).add((instance, start))
        by_kind = {kind: len(windows) for kind, windows in seen.items()}
        if not starts:
            return Coverage()
        first = min(min(s) for s in starts.values())
        last = max(start + seconds for s in starts.values() for start, seconds in s.items())
        periods = {i: statistics.median(s.values()) or 1.0 for i, s in starts.items()}
        gaps: list[Gap] = []
        for instance, windows in sorted(starts.items()):
            period = periods[instance]
            edge = first  # the end of the last window seen (the fleet's first window, at the start)
            for start in sorted(windows):
                if start - edge > GAP_WINDOWS * period:
                    gaps.append(Gap(instance, edge, start, period))
                edge = max(edge, start + windows[start])
            if last - edge > GAP_WINDOWS * period:
                gaps.append(Gap(instance, edge, last, period))
        return Coverage(
            first=first,
            last=last,
            windows={i: len(s) for i, s in sorted(starts.items())},
            periods=dict(sorted(periods.items())),
            by_kind=dict(sorted(by_kind.items())),
            gaps=tuple(sorted(gaps, key=lambda g: (-g.seconds, g.instance, g.start))),
        )

    def gap_rule(self) -> str:
        return (
            f"a gap is a stretch longer than {GAP_WINDOWS} of a proxy's window periods in which it wrote no "
            "observation window, between the fleet's first window and its last"
        )


def _kind(section: str, group_kind: str | None, tls: bool | None) -> str:
    """The kind of window a row is: its section; ``group/<kind>``; connections as ``connections/tls`` or
    ``connections/plain`` (a window with both is one window with connections, in :meth:`Coverage.of`)."""
    if section == "group":
        return f"group/{group_kind or 'classic'}"
    if section == "connections":
        return "connections/tls" if tls else "connections/plain"
    return section


def measure_coverage(evidence: Evidence) -> Coverage:
    """One query over the windows of every section: a row per proxy, window and the columns that say its
    kind, named here (1 million events: 0.7-0.8 s of JVM CPU; naming the kind in Spark, a string made per
    row to group by, 0.9-1.0 s). The proxy is grouped by a 64-bit hash of its name, named again from the
    overview's proxies: a text key was a third of the query (10 million events, warm: 2.9 -> 2.1 s of JVM
    CPU). Two of those names with one hash (none seen): grouped by name."""
    windows = evidence.windows(*SECTIONS)
    keys = ["section", "window_start", "group_kind", "tls"]
    seconds = F.max("window_seconds").alias("seconds")
    rows = windows.groupBy(F.xxhash64(proxy_of()).alias("instance"), *keys).agg(seconds).collect()
    names = _names_by_hash(windows.sparkSession, evidence.overview.instances) if rows else {}
    if any(r["instance"] not in names for r in rows):
        rows = windows.groupBy(proxy_of().alias("instance"), *keys).agg(seconds).collect()
        names = {}
    return Coverage.of(
        {
            "instance": names.get(r["instance"], r["instance"]),
            "kind": _kind(r["section"], r["group_kind"], r["tls"]),
            "window_start": r["window_start"],
            "seconds": r["seconds"],
        }
        for r in rows
    )


_NAME_SCHEMA = StructType([StructField("name", StringType())])


def _names_by_hash(spark: SparkSession, names: Sequence[str]) -> dict[int, str]:
    """Spark's ``xxhash64`` of each of ``names`` -> the name; a hash two names share is left out."""
    hashed = local_frame(spark, [(n,) for n in names], _NAME_SCHEMA).select(F.xxhash64("name").alias("h"), "name")
    by_hash: dict[int, list[str]] = {}
    for r in hashed.collect():
        by_hash.setdefault(int(r["h"]), []).append(str(r["name"]))
    return {h: found[0] for h, found in by_hash.items() if len(found) == 1}
