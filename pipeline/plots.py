"""The report's plots: matplotlib figures rendered to SVG and embedded as data
URIs, so report.html needs no network and no files beside it."""

from __future__ import annotations

import base64
import functools
import io
import threading
from collections.abc import Sequence
from datetime import UTC
from typing import TYPE_CHECKING

from policies.properties import (
    GROUP_MAX_SIZE,
    MAX_RESPONSE_SIZE,
    MAX_SSL_CONNECTIONS,
    QUEUED_MAX_REQUEST_BYTES,
    RESOURCE_IDENTIFIER_MAX_LENGTH,
    SOCKET_REQUEST_MAX_BYTES,
    int_default,
)

from .plain_text import printable
from .traffic import Traffic, nice_bytes

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["Plot", "impact_timeline", "load_in_background", "plots_for"]


@functools.cache
def _figure_class() -> type[Figure]:
    """matplotlib, set up once. Importing it is 0.4 s of Python: :func:`load_in_background` does it
    while Spark's JVM starts, not before."""
    import matplotlib

    matplotlib.use("Agg")  # no display; must precede any pyplot import anywhere in the process
    # Labels carry identifiers from the wire (group ids): plain text, never mathtext or TeX, so a
    # group named `$\bad$` is drawn as it is instead of aborting the report (and see printable()).
    matplotlib.rcParams.update(
        {"svg.hashsalt": "kafka-admission-proxy", "font.size": 9, "text.usetex": False, "text.parse_math": False}
    )
    from matplotlib.figure import Figure

    return Figure


def load_in_background() -> None:
    """Import matplotlib in a thread of its own (the first plot waits for it)."""
    threading.Thread(target=_figure_class, name="matplotlib import", daemon=True).start()


class Plot:
    """One rendered figure: a title and an ``<img>``-ready data URI."""

    def __init__(self, name: str, title: str, figure: Figure) -> None:
        self.name = name
        self.title = title
        buffer = io.BytesIO()
        figure.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
        self.data_uri = "data:image/svg+xml;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _figure(width: float = 8.0, height: float = 3.2) -> Figure:
    return _figure_class()(figsize=(width, height), layout="constrained")


def _times(ts: Sequence[float]) -> list[float]:
    """Unix seconds as matplotlib's date numbers (days since its 1970 epoch)."""
    return [t / 86400.0 for t in ts]


def _time_axis(ax: Axes) -> None:
    ax.xaxis_date(UTC)
    ax.tick_params(axis="x", labelrotation=20)
    ax.grid(alpha=0.3)


def _nothing(ax: Axes, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} in the evidence", ha="center", va="center", transform=ax.transAxes, color="#666")
    ax.set_xticks([])
    ax.set_yticks([])


def _limit_line(ax: Axes, value: int | None, label: str, horizontal: bool = True) -> None:
    if value is None:
        return
    if horizontal:
        ax.axhline(value, color="#c0392b", linestyle="--", linewidth=1, label=label)
    else:
        ax.axvline(value, color="#c0392b", linestyle="--", linewidth=1, label=label)


def _log_counts(ax: Axes) -> None:
    """A log-scale count axis labelled 1, 10, 1,000 (matplotlib typesets its own labels as TeX:
    about a tenth of drawing the report's plots)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}" if value >= 1 else f"{value:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _size_hist(ax: Axes, hist: list[tuple[int, int]], what: str, limit: int | None) -> None:
    if not hist:
        _nothing(ax, f"{what} sizes")
        return
    ks = [k for k, _ in hist]
    ax.bar(ks, [n for _, n in hist], width=0.8, color="#2e86c1")
    _log_counts(ax)
    ax.set_xticks(ks, [nice_bytes(2 ** (k - 1)) if k > 0 else "0" for k in ks], rotation=60, fontsize=7)
    ax.set_xlabel(f"largest {what} per client id, API and window (from, log2 bins)")
    ax.set_ylabel("windows")
    if limit is not None and limit > 0:
        _limit_line(ax, limit.bit_length(), f"recommended: {nice_bytes(limit)}", horizontal=False)
        ax.legend(loc="upper right")


def sizes(traffic: Traffic, limits: dict[str, int]) -> Plot:
    fig = _figure(9, 3.4)
    left, right = fig.subplots(1, 2)
    _size_hist(left, traffic.request_size_hist, "request", limits.get(SOCKET_REQUEST_MAX_BYTES))
    _size_hist(right, traffic.response_size_hist, "response", limits.get(MAX_RESPONSE_SIZE))
    return Plot("sizes", "Request and response sizes", fig)


def pool(traffic: Traffic, limits: dict[str, int]) -> Plot:
    fig = _figure()
    ax = fig.subplots()
    if not traffic.pool_series:
        _nothing(ax, "pool windows")
    else:
        t = _times([p[0] for p in traffic.pool_series])
        mib = 1024 * 1024
        ax.plot(t, [p[1] / mib for p in traffic.pool_series], label="busiest proxy", color="#c0392b", linewidth=1)
        ax.plot(t, [p[2] / mib for p in traffic.pool_series], label="median proxy", color="#2e86c1", linewidth=1)
        if traffic.pool_capacity:
            ax.axhline(traffic.pool_capacity / mib, color="#7f8c8d", linestyle=":", label="configured capacity")
        rec = limits.get(QUEUED_MAX_REQUEST_BYTES)
        if rec:
            ax.axhline(rec / mib, color="#27ae60", linestyle="--", linewidth=1, label="recommended")
        ax.set_ylabel("in-flight request MiB (high-water mark)")
        _time_axis(ax)
        ax.legend(loc="upper right", fontsize=7)
    return Plot("pool-depth", "Memory pool depth over time", fig)


def connections(traffic: Traffic, limits: dict[str, int]) -> Plot:
    fig = _figure(9, 3.4)
    fleet, busiest = fig.subplots(1, 2)
    if not traffic.connection_series:
        _nothing(fleet, "connection windows")
        _nothing(busiest, "connection windows")
    else:
        for tls, name, color in ((True, "TLS", "#8e44ad"), (False, "plaintext", "#2e86c1")):
            rows = [r for r in traffic.connection_series if r[1] == tls]
            if rows:
                t = _times([r[0] for r in rows])
                fleet.plot(t, [r[2] for r in rows], label=name, color=color, linewidth=1)
                busiest.plot(t, [r[3] for r in rows], label=f"{name}, busiest proxy", color=color, linewidth=1)
        rec = limits.get(MAX_SSL_CONNECTIONS)
        if rec:
            busiest.axhline(
                rec, color="#27ae60", linestyle="--", linewidth=1, label=f"recommended {MAX_SSL_CONNECTIONS}"
            )
        fleet.set_ylabel("connections open, whole fleet")
        busiest.set_ylabel("connections open, one proxy")
        for ax in (fleet, busiest):
            _time_axis(ax)
            ax.legend(loc="upper right", fontsize=7)
    return Plot("connections", "Connections over time, TLS and plaintext", fig)


def groups(traffic: Traffic, limits: dict[str, int]) -> Plot:
    fig = _figure(9, 3.4)
    over_time, spread = fig.subplots(1, 2, width_ratios=(3, 2))
    if not traffic.group_series:
        _nothing(over_time, "group windows")
        _nothing(spread, "groups")
    else:
        lines = []
        for group, points in traffic.group_series.items():
            t, members = _times([p[0] for p in points]), [p[1] for p in points]
            lines += over_time.plot(t, members, label=printable(group[:30]), linewidth=1)
        rec = limits.get(GROUP_MAX_SIZE)
        if rec:
            lines.append(
                over_time.axhline(
                    rec, color="#c0392b", linestyle="--", linewidth=1, label=f"recommended {GROUP_MAX_SIZE}"
                )
            )
        over_time.set_ylabel("members (largest in bucket)")
        _time_axis(over_time)
        # Handles named, or matplotlib would leave out a group whose id starts with "_".
        over_time.legend(lines, [str(line.get_label()) for line in lines], loc="upper left", fontsize=6)
        spread.bar([p for p, _ in traffic.group_peak_hist], [n for _, n in traffic.group_peak_hist], color="#2e86c1")
        spread.set_xlabel("largest member count of a group")
        spread.set_ylabel("groups")
        _log_counts(spread)
    return Plot("group-sizes", "Group sizes over time (largest groups) and their spread", fig)


def identifiers(traffic: Traffic, limits: dict[str, int]) -> Plot:
    fig = _figure()
    ax = fig.subplots()
    if not traffic.identifier_hist:
        _nothing(ax, "identifier windows")
    else:
        for kind, points in sorted(traffic.identifier_hist.items()):
            ax.step([p[0] for p in points], [p[1] for p in points], where="mid", label=kind, linewidth=1)
        kafka = int_default(RESOURCE_IDENTIFIER_MAX_LENGTH)
        ax.axvline(
            kafka,
            color="#c0392b",
            linestyle="--",
            linewidth=1,
            label=f"{kafka}: Kafka's {RESOURCE_IDENTIFIER_MAX_LENGTH}",
        )
        _log_counts(ax)
        ax.set_xlabel("longest identifier per client id and window (UTF-16 code units)")
        ax.set_ylabel("windows")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=7)
    return Plot("identifier-lengths", "Identifier lengths per kind", fig)


def impact_timeline(
    name: str, series: dict[str, list[tuple[float, int]]], first: float | None, last: float | None, bucket_seconds: int
) -> Plot:
    """Occurrences per time bucket of each candidate that would have acted, over the whole evidence span."""
    fig = _figure(8, 2.8)
    ax = fig.subplots()
    shown = {label: points for label, points in series.items() if points}
    if not shown:
        _nothing(ax, "occurrences of these candidate limits")
    else:
        for label, points in shown.items():
            ax.plot(
                _times([p[0] for p in points]),
                [p[1] for p in points],
                marker="o",
                markersize=3,
                linewidth=1,
                drawstyle="steps-mid",
                label=label,
            )
        if first is not None and last is not None:
            pad = bucket_seconds
            ax.set_xlim(*_times([first - pad, last + pad]))
        ax.set_ylabel(f"occurrences per {bucket_seconds} s")
        ax.set_ylim(bottom=0)
        _time_axis(ax)
        ax.legend(loc="upper right", fontsize=7)
    return Plot(f"impact-{name}", "When the candidate limits would have acted", fig)


def plots_for(traffic: Traffic, limits: dict[str, int]) -> dict[str, list[Plot]]:
    """The plots of each policy section (by section id)."""
    return {
        "sizes": [sizes(traffic, limits)],
        "memory-pool": [pool(traffic, limits)],
        "connections": [connections(traffic, limits)],
        "group-size": [groups(traffic, limits)],
        "identifiers": [identifiers(traffic, limits)],
    }
