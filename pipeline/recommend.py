"""Recommended limits from the observed traffic, as a ``policies:`` section the
proxy itself accepts (each value checked against its property in :mod:`policies.properties`,
and the memory pool's rule over several keys), each value with a one-line reason.

The headroom rule (:func:`rules`, stated on the page and in the YAML): a limit is
never tighter than what the evidence shows the cluster using -- the largest value
the proxies let through, observe-mode decisions included -- plus ``headroom``
percent, rounded up (byte sizes to whole KiB), so that nothing seen would have been
refused, closed or made to wait. ``queued.max.request.bytes`` is also at least
``socket.request.max.bytes`` (KIP-72's pool must fit the largest request);
identifier limits (KIP-1233) stay at Kafka's defaults unless a longer identifier
was seen, since they bound names, not load. A limit measured by too few
observation windows gets no number (:meth:`pipeline.coverage.Coverage.thin`), and
evidence spanning less than ``--min-span`` makes every number provisional.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import yaml

from policies.memory_pool import validate_settings as validate_pool_settings
from policies.properties import (
    GROUP_CONSUMER_MAX_SIZE,
    GROUP_MAX_SIZE,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_IP,
    MAX_RESPONSE_SIZE,
    MAX_SSL_CONNECTIONS,
    QUEUED_MAX_REQUEST_BYTES,
    QUEUED_MAX_REQUEST_BYTES_PER_CONNECTION,
    RESOURCE_IDENTIFIER_LIMIT_ENABLE,
    SOCKET_REQUEST_MAX_BYTES,
    check_values,
    int_default,
)

from .coverage import MIN_SPAN_SECONDS, MIN_WINDOWS, nice_duration
from .limits import IDENTIFIER_KEYS, KAFKA_DEFAULTS
from .plain_text import printable
from .traffic import Peak, Traffic, nice_bytes

__all__ = ["Recommendation", "policies_yaml", "provisional", "recommend", "rules", "with_headroom"]


@dataclass(frozen=True)
class Recommendation:
    key: str
    value: int | bool | None  # None: the evidence is too thin for a number; the reason says why
    reason: str

    @property
    def limit(self) -> int | None:
        """The recommended number (not a switch, not withheld)."""
        return None if isinstance(self.value, bool) else self.value


def rules(headroom_pct: float, min_windows: int = MIN_WINDOWS) -> list[str]:
    """The rules the recommendations follow, one sentence each (the page's and the YAML's words)."""
    return [
        "Never tighter than the evidence: each limit is the largest value the proxies let through "
        f"(observe-mode decisions included) + {headroom_pct:g}% headroom, rounded up (byte sizes to whole KiB), "
        "so nothing seen would have been refused, closed or made to wait.",
        "queued.max.request.bytes is at least socket.request.max.bytes (KIP-72); identifier limits stay at "
        "Kafka's defaults unless a longer identifier was seen (then its length).",
        "What enforce-mode decisions held back (refused, closed, made to wait) is not counted: it was not seen.",
        f"A limit measured by fewer than {min_windows} observation windows (--min-windows) is left out: "
        "too thin for a number.",
    ]


def provisional(traffic: Traffic, min_span_seconds: float = MIN_SPAN_SECONDS) -> str | None:
    """Why every recommendation is provisional (the evidence spans less than ``--min-span``), or None."""
    span = traffic.coverage.span_seconds
    if span >= min_span_seconds:
        return None
    return (
        f"PROVISIONAL: the evidence spans {nice_duration(span)}, less than the {nice_duration(min_span_seconds)} "
        "asked for (--min-span): peaks not seen yet (a busy day, a weekly job, a rebalance storm) would be "
        "refused. Gather more before enforcing these."
    )


def with_headroom(peak: int, headroom_pct: float, *, kib: bool = False) -> int:
    """``peak`` plus ``headroom_pct`` percent, rounded up (to whole KiB with ``kib``); at least ``peak`` + 1
    when the headroom is positive."""
    value = math.ceil(peak * (1 + headroom_pct / 100))
    if headroom_pct > 0:
        value = max(value, peak + 1)
    if kib:
        value = -(-value // 1024) * 1024
    return value


def when(ts: float | None) -> str:
    return "" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _short(text: object, width: int = 40) -> str:
    value = " ".join(str(text).split())
    return value if len(value) <= width else value[: width - 1] + "…"


def _at(peak: Peak) -> str:
    stamp = when(peak.ts)
    return f"{_short(peak.where)}{', ' + stamp if stamp else ''}"


def _enforced(traffic: Traffic, key: str) -> str:
    """A note on decisions taken in enforce mode under ``key``: what they held back is not in the evidence."""
    enforced = [d for d in traffic.decisions if d["limit_key"] == key and d["mode"] == "enforce"]
    n = sum(int(d["count"]) for d in enforced)
    if not n:
        return ""
    limits = sorted({int(d["limit"]) for d in enforced if d["limit"] is not None})
    at = f" at {', '.join(map(str, limits))}" if limits else ""
    return f"; {n:,} enforced decisions{at} (what they held back is not counted)"


def recommend(traffic: Traffic, headroom_pct: float, min_windows: int = MIN_WINDOWS) -> list[Recommendation]:
    """The limits the traffic supports, each with its reason; keys without evidence are left out, keys
    with too little (fewer than ``min_windows`` windows measured them) have no value and say why."""
    h = headroom_pct
    plus = f"+ {h:g}%"
    coverage = traffic.coverage
    recs: list[Recommendation] = []

    def add(key: str, value: int | bool, reason: str) -> None:
        thin = coverage.thin(key, min_windows)
        recs.append(
            Recommendation(key, None, thin) if thin else Recommendation(key, value, reason + _enforced(traffic, key))
        )

    for key, kind in ((GROUP_MAX_SIZE, "classic"), (GROUP_CONSUMER_MAX_SIZE, "consumer")):
        peak = traffic.largest_by_kind.get(kind)
        if peak is not None and peak.value > 0:
            add(
                key,
                with_headroom(peak.value, h),
                f"largest {kind} group seen: {peak.value} members ({_at(peak)}) {plus}",
            )
    for key, peak, what in (
        (MAX_CONNECTIONS, traffic.peak_connections, "connections open at once on one proxy"),
        (MAX_SSL_CONNECTIONS, traffic.peak_tls, "TLS connections open at once on one proxy"),
        (MAX_CONNECTIONS_PER_IP, traffic.peak_per_ip, "connections at once from one client host"),
    ):
        if peak is not None and peak.value > 0:
            add(key, with_headroom(peak.value, h), f"peak {what}: {peak.value} ({_at(peak)}) {plus}")
    request_limit = KAFKA_DEFAULTS[SOCKET_REQUEST_MAX_BYTES]
    for key, largest, what in (
        (SOCKET_REQUEST_MAX_BYTES, traffic.largest_requests, "request"),
        (MAX_RESPONSE_SIZE, traffic.largest_responses, "response"),
    ):
        if largest:
            top = largest[0]
            value = with_headroom(top["bytes"], h, kib=True)
            if key == SOCKET_REQUEST_MAX_BYTES and not coverage.thin(key, min_windows):
                request_limit = value
            add(
                key,
                value,
                f"largest {what} seen: {top['bytes']:,} B ({nice_bytes(top['bytes'])}, {top['api']} from client id "
                f"{_short(top['client_id'])!r}) {plus}, whole KiB",
            )
    p = traffic.pool_percentiles
    if p:
        from_max = with_headroom(p["max"], h, kib=True)
        value = max(from_max, request_limit)
        floor = " -> socket.request.max.bytes, the least Kafka allows" if value > from_max else ""
        add(
            QUEUED_MAX_REQUEST_BYTES,
            value,
            f"in-flight request bytes per proxy and window: p50 {nice_bytes(p['p50'])}, "
            f"p99 {nice_bytes(p['p99'])}, max {nice_bytes(p['max'])}; max {plus}, whole KiB{floor}",
        )
    identifier_recs = []
    for key in IDENTIFIER_KEYS:
        longest = traffic.longest_for(key)
        if longest is None:
            continue
        default = KAFKA_DEFAULTS[key]
        if longest.value <= default:
            reason = f"longest seen {longest.value} ({_short(longest.where, 60)}) fits Kafka's default"
            value = default
        else:
            reason = (
                f"longest seen {longest.value} ({_short(longest.where, 60)}) is over Kafka's {default}: "
                f"raised to let it pass; shorten it, then return to {default}"
            )
            value = longest.value
        identifier_recs.append(Recommendation(key, value, reason))
    if identifier_recs:
        # The checks go on only with every limit they apply: thin evidence leaves the switch out too.
        thin = coverage.thin(RESOURCE_IDENTIFIER_LIMIT_ENABLE, min_windows)
        if thin:
            recs.append(Recommendation(RESOURCE_IDENTIFIER_LIMIT_ENABLE, None, thin))
            recs += [Recommendation(r.key, None, thin) for r in identifier_recs]
        else:
            recs.append(
                Recommendation(
                    RESOURCE_IDENTIFIER_LIMIT_ENABLE,
                    True,
                    "KIP-1233 checks on, with the limits below (identifiers seen)",
                )
            )
            recs += identifier_recs
    return recs


def _check(section: Mapping[str, object]) -> None:
    """Raise ``ValueError`` naming the key if the proxy would refuse the section (its own
    ``check-config`` is run on it by the tests)."""
    check_values(section)

    def value(key: str) -> int:
        given = section.get(key)
        return given if isinstance(given, int) and not isinstance(given, bool) else int_default(key)

    validate_pool_settings(
        value(QUEUED_MAX_REQUEST_BYTES), value(SOCKET_REQUEST_MAX_BYTES), value(QUEUED_MAX_REQUEST_BYTES_PER_CONNECTION)
    )


def _comment(text: str) -> str:
    """One line of text that YAML's reader takes as it is (a group id in it may hold a control character)."""
    return printable(" ".join(text.split()))


def policies_yaml(
    recs: list[Recommendation],
    traffic: Traffic,
    headroom_pct: float,
    min_span_seconds: float = MIN_SPAN_SECONDS,
    min_windows: int = MIN_WINDOWS,
) -> str:
    """The ``policies:`` section, commented; each value checked against its property first. Keys too thin
    for a number are comments (the proxy keeps its default for them); provisional ones say so."""
    given = [r for r in recs if r.value is not None]
    section = {r.key: r.value for r in given}
    _check(section)
    seen, coverage = traffic.overview, traffic.coverage
    warning = provisional(traffic, min_span_seconds)
    lines = [
        "# Recommended policies for kafka-admission-proxy (Kafka property names), made by",
        f"# `kafka-admission-proxy report` from {seen.events:,} audit events of {len(seen.instances)} "
        f"prox{'y' if len(seen.instances) == 1 else 'ies'},",
        f"# {when(seen.first_ts)} to {when(seen.last_ts)}: {coverage.total_windows:,} observation windows over "
        f"{nice_duration(coverage.span_seconds)}, {len(coverage.gaps)} gaps (proxies silent).",
    ]
    if warning:
        lines += [f"# {line}" for line in textwrap.wrap(warning, 100, break_on_hyphens=False)]
    for rule in rules(headroom_pct, min_windows):
        lines += [f"# {line}" for line in textwrap.wrap(rule, 100, break_on_hyphens=False)]
    lines += [
        "# Paste into the proxy's config file; `kafka-admission-proxy check-config` accepts it.",
        "# Keys not listed, or commented out below as left out, keep the proxy's defaults.",
        "policies:" if given else "policies: {}",
    ]
    mark = " (provisional)" if warning else ""
    for r in recs:
        if r.value is None:
            lines.append(f"  # {r.key}: left out, {_comment(r.reason)}")
            continue
        scalar = yaml.safe_dump(r.value, default_flow_style=True).removesuffix("\n...\n").strip()
        lines.append(f"  {r.key}: {scalar}  # {_comment(r.reason)}{mark}")
    return "\n".join(lines) + "\n"
