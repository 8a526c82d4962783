"""Recommended limits from the observed traffic, as a ``policies:`` section the
proxy itself accepts (checked with :class:`proxy.config.Policies`, the parser
``check-config`` uses), each value with a one-line reason.

The headroom rule: a limit is the observed peak plus ``headroom`` percent,
rounded up (byte sizes to whole KiB), so that nothing seen would have been
refused. Two exceptions follow Kafka's own rules: ``queued.max.request.bytes``
comes from the 99th percentile of in-flight high-water marks and is at least
``socket.request.max.bytes`` (KIP-72's pool must fit the largest request);
identifier limits (KIP-1233) stay at Kafka's defaults unless a longer identifier
was seen, since they bound names, not load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

import yaml

from proxy.config import Policies

from .limits import IDENTIFIER_KEYS, KAFKA_DEFAULTS
from .plain_text import printable
from .traffic import Peak, Traffic, nice_bytes

__all__ = ["Recommendation", "policies_yaml", "recommend", "with_headroom"]


@dataclass(frozen=True)
class Recommendation:
    key: str
    value: int | bool
    reason: str


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


def recommend(traffic: Traffic, headroom_pct: float) -> list[Recommendation]:
    """The limits the traffic supports, each with its reason; keys without evidence are left out."""
    h = headroom_pct
    plus = f"+ {h:g}%"
    recs: list[Recommendation] = []
    for key, kind in (("group.max.size", "classic"), ("group.consumer.max.size", "consumer")):
        peak = traffic.largest_by_kind.get(kind)
        if peak is not None and peak.value > 0:
            recs.append(
                Recommendation(
                    key,
                    with_headroom(peak.value, h),
                    f"largest {kind} group seen: {peak.value} members ({_at(peak)}) {plus}",
                )
            )
    for key, peak, what in (
        ("max.connections", traffic.peak_connections, "connections open at once on one proxy"),
        ("max.ssl.connections", traffic.peak_tls, "TLS connections open at once on one proxy"),
        ("max.connections.per.ip", traffic.peak_per_ip, "connections at once from one client host"),
    ):
        if peak is not None and peak.value > 0:
            recs.append(
                Recommendation(key, with_headroom(peak.value, h), f"peak {what}: {peak.value} ({_at(peak)}) {plus}")
            )
    request_limit = KAFKA_DEFAULTS["socket.request.max.bytes"]
    for key, largest, what in (
        ("socket.request.max.bytes", traffic.largest_requests, "request"),
        ("max.response.size", traffic.largest_responses, "response"),
    ):
        if largest:
            top = largest[0]
            value = with_headroom(top["bytes"], h, kib=True)
            if key == "socket.request.max.bytes":
                request_limit = value
            recs.append(
                Recommendation(
                    key,
                    value,
                    f"largest {what} seen: {top['bytes']:,} B ({nice_bytes(top['bytes'])}, {top['api']} from client id "
                    f"{_short(top['client_id'])!r}) {plus}, whole KiB",
                )
            )
    p = traffic.pool_percentiles
    if p:
        from_p99 = with_headroom(p["p99"], h, kib=True)
        value = max(from_p99, request_limit)
        floor = " -> socket.request.max.bytes, the least Kafka allows" if value > from_p99 else ""
        recs.append(
            Recommendation(
                "queued.max.request.bytes",
                value,
                f"in-flight request bytes per proxy and window: p50 {nice_bytes(p['p50'])}, "
                f"p99 {nice_bytes(p['p99'])}, max {nice_bytes(p['max'])}; p99 {plus}{floor}",
            )
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
        recs.append(
            Recommendation(
                "resource.identifier.limit.enable", True, "KIP-1233 checks on, with the limits below (identifiers seen)"
            )
        )
        recs += identifier_recs
    return recs


def policies_yaml(recs: list[Recommendation], traffic: Traffic, headroom_pct: float) -> str:
    """The ``policies:`` section, commented; validated by the proxy's own config model first."""
    section = {r.key: r.value for r in recs}
    Policies.model_validate(section)  # raises (naming the key) if the proxy would refuse it
    seen = traffic.overview
    lines = [
        "# Recommended policies for kafka-admission-proxy (Kafka property names), made by",
        f"# `kafka-admission-proxy report` from {seen.events:,} audit events of {len(seen.instances)} proxies,",
        f"# {when(seen.first_ts)} to {when(seen.last_ts)}.",
        f"# Rule: the observed peak + {headroom_pct:g}% headroom, rounded up (sizes to whole KiB);",
        "# queued.max.request.bytes from the p99 of in-flight bytes; identifier limits at Kafka's",
        "# defaults unless a longer identifier was seen. Paste into the proxy's config file;",
        "# `kafka-admission-proxy check-config` accepts it. Keys not listed keep their defaults.",
        "policies:" if recs else "policies: {}",
    ]
    for r in recs:
        scalar = yaml.safe_dump(r.value, default_flow_style=True).removesuffix("\n...\n").strip()
        # One line, and nothing YAML's reader refuses (a group id in it may hold a control character).
        lines.append(f"  {r.key}: {scalar}  # {printable(' '.join(r.reason.split()))}")
    return "\n".join(lines) + "\n"
