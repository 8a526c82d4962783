"""report.html: one self-contained page (inline CSS, plots as SVG data URIs, no
scripts, nothing fetched at view time). A summary up top, then one section per
policy -- what the traffic looked like, the recommended limit, and who each
candidate limit would have refused or evicted, how often and when -- then the
decisions the proxies recorded, the inputs that were not valid events, and how
long the run took."""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .coverage import MIN_SPAN_SECONDS, MIN_WINDOWS, Coverage, nice_duration
from .events import InputProblem
from .impact import TOP_SUBJECTS, Impact
from .limits import LIMITS
from .plain_text import printable
from .plots import Plot, impact_timeline
from .recommend import Recommendation, provisional, rules, when
from .traffic import Traffic, nice_bytes

__all__ = ["SECTIONS", "PolicySection", "render"]

MAX_PROBLEM_FILES = 50
MAX_GAPS = 50


@dataclass(frozen=True)
class PolicySection:
    id: str
    title: str
    policies: tuple[str, ...]  # the audit events' policy names shown here
    about: str


SECTIONS = (
    PolicySection(
        "sizes",
        "Request and response sizes (KIP-498, socket.request.max.bytes, max.response.size)",
        ("request_size", "response_size"),
        "The largest request and response per client id, API and observation window. A request over "
        "socket.request.max.bytes closes its connection; a response over max.response.size is not forwarded.",
    ),
    PolicySection(
        "memory-pool",
        "Memory pool (KIP-72, queued.max.request.bytes)",
        ("memory_pool",),
        "Bytes of requests read and not yet answered, per proxy: the high-water mark of each window. Over "
        "queued.max.request.bytes, connections stop being read until memory is released (they wait).",
    ),
    PolicySection(
        "connections",
        "Connections and the TLS cap (KIP-1015, max.connections, max.ssl.connections, max.connections.per.ip)",
        ("connections",),
        "Connections open at once per proxy, TLS and plaintext. At a cap the least recently used idle "
        "connection is evicted or the new one waits/is refused; over the per-IP limit it is closed at once.",
    ),
    PolicySection(
        "group-size",
        "Consumer group size (KIP-389/KIP-848, group.max.size, group.consumer.max.size)",
        ("group_size",),
        "Members per group, the largest per window. Joins beyond the limit are answered GROUP_MAX_SIZE_REACHED (81).",
    ),
    PolicySection(
        "identifiers",
        "Identifier lengths (KIP-1233, resource.identifier.max.length and friends)",
        ("identifier_limits",),
        "The longest identifier of each kind per client id and window, in UTF-16 code units as Java counts. "
        "Requests carrying a longer one are refused.",
    ),
)

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1200px;color:#222;
line-height:1.4;padding:0 1rem}
h1{font-size:1.6rem}h2{font-size:1.25rem;border-bottom:2px solid #2e86c1;padding-bottom:.2rem;margin-top:2.5rem}
h3{font-size:1.05rem;margin-top:1.4rem}
table{border-collapse:collapse;margin:.5rem 0 1rem;font-size:.85rem}
th,td{border:1px solid #ccc;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#eef4fa}td.n{text-align:right;font-variant-numeric:tabular-nums}
figure.plot{margin:1rem 0}figure.plot img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.85rem;color:#555}.muted{color:#666}.warn{color:#a04000}
code{background:#f4f4f4;padding:0 .2rem}nav a{margin-right:1rem}
"""


def _e(value: Any) -> str:
    return html.escape(printable("" if value is None else str(value)))


def _cell(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return f"<td>{_e(value if value is not None else '')}</td>"
    if isinstance(value, int):
        return f'<td class="n">{value:,}</td>'
    if isinstance(value, float):
        return f'<td class="n">{value:,.2f}</td>'
    return f"<td>{_e(value)}</td>"


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]], cls: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _figure(plot: Plot) -> str:
    return (
        f'<figure class="plot" data-plot="{_e(plot.name)}"><img alt="{_e(plot.title)}" src="{plot.data_uri}">'
        f"<figcaption>{_e(plot.title)}</figcaption></figure>"
    )


def _short(text: Any, width: int = 60) -> str:
    value = "" if text is None else str(text)
    return value if len(value) <= width else value[: width - 1] + "…"


def _recs_table(recs: Sequence[Recommendation], warning: str | None) -> str:
    """Key, value and reason; a limit too thin for a number says so in place of one."""
    rows = [
        (
            r.key,
            "left out" if r.value is None else r.value,
            "too thin" if r.value is None else "provisional" if warning else "",
            r.reason,
        )
        for r in recs
    ]
    return _table(["key", "value", "status", "reason"], rows, "recommended")


def _few(items: Iterable[str], shown: int = 20) -> str:
    """The first ``shown`` items, and how many more (a fleet of hundreds of proxies)."""
    listed = list(items)
    more = f", … and {len(listed) - shown:,} more" if len(listed) > shown else ""
    return ", ".join(listed[:shown]) + more


def _coverage(coverage: Coverage, warning: str | None, min_span_seconds: float) -> str:
    """What the evidence covers: span, proxies, windows, gaps; and the provisional warning."""
    shortest, longest = min(coverage.periods.values(), default=0.0), max(coverage.periods.values(), default=0.0)
    period = (
        nice_duration(shortest) if shortest == longest else f"{nice_duration(shortest)} to {nice_duration(longest)}"
    )
    rows = [
        (
            "time span",
            f"{nice_duration(coverage.span_seconds)}: {when(coverage.first)} to {when(coverage.last)} "
            f"(--min-span {nice_duration(min_span_seconds)})",
        ),
        ("proxies", f"{len(coverage.windows):,}: {_few(_short(i, 40) for i in coverage.windows)}"),
        (
            "observation windows",
            f"{coverage.total_windows:,} (per proxy: "
            + _few(f"{_short(i, 40)} {n:,}" for i, n in coverage.windows.items())
            + f"; every {period})",
        ),
        ("gaps (proxies silent)", f"{len(coverage.gaps):,}: {coverage.gap_rule()}"),
    ]
    parts = ['<h3 id="coverage">What the evidence covers</h3>']
    if warning:
        parts.append(f'<p class="warn provisional"><strong>{_e(warning)}</strong></p>')
    parts.append(_table(["", ""], rows, "coverage"))
    if coverage.gaps:
        shown = coverage.gaps[:MAX_GAPS]
        parts.append(
            _table(
                ["proxy silent", "from", "to", "for", "windows missed"],
                [(g.instance, when(g.start), when(g.end), nice_duration(g.seconds), g.windows_missed) for g in shown],
                "gaps",
            )
        )
        if len(coverage.gaps) > MAX_GAPS:
            parts.append(f'<p class="muted">… and {len(coverage.gaps) - MAX_GAPS:,} shorter gaps.</p>')
    return "".join(parts)


def _summary(
    traffic: Traffic,
    recs: list[Recommendation],
    impact: Impact,
    problems: Sequence[InputProblem],
    inputs: str,
    yaml_name: str,
    min_span_seconds: float,
    min_windows: int,
    headroom_pct: float,
) -> str:
    warning = provisional(traffic, min_span_seconds)
    seen = traffic.overview
    bad = sum(p.lines for p in problems)
    parts = [
        '<section id="summary"><h2>Summary</h2>',
        f"<p>{seen.events:,} valid audit events (schema version 2) from {len(seen.instances)} "
        f"prox{'y' if len(seen.instances) == 1 else 'ies'}, "
        f"{_e(when(seen.first_ts))} to {_e(when(seen.last_ts))}, read from {_e(inputs)}. ",
        (
            f'<span class="warn">{bad:,} lines were not valid events ({len({p.file for p in problems})} files): '
            f'see <a href="#inputs">Inputs</a>.</span>'
            if problems
            else "Every line was a valid event."
        ),
        "</p>",
        _table(["events", "count"], sorted(seen.by_kind.items())),
        _coverage(traffic.coverage, warning, min_span_seconds),
        f"<h3>Recommended settings (<code>{_e(yaml_name)}</code>)</h3>",
        '<ul class="rules">' + "".join(f"<li>{_e(rule)}</li>" for rule in rules(headroom_pct, min_windows)) + "</ul>",
        _recs_table(recs, warning) if recs else '<p class="muted">No evidence to recommend from.</p>',
        "<h3>Candidate limits: what each would have done</h3>",
        _impact_table([r for r in impact.summary if r["occurrences"]]),
        _quiet(impact.summary),
        "</section>",
    ]
    return "".join(parts)


_WHO = (
    ("client_ids", "client id"),
    ("client_addresses", "client host"),
    ("groups", "group"),
    ("identifiers", "identifier"),
    ("proxies", "proxy"),
)


def _who(row: dict[str, Any]) -> str:
    parts = []
    for column, noun in _WHO:
        n = row[column]
        if n:
            plural = "proxies" if noun == "proxy" else f"{noun}s"
            parts.append(f"{n:,} {noun if n == 1 else plural}")
    return ", ".join(parts)


def _span(first: Any, last: Any) -> str:
    if not first:
        return ""
    return str(first) if first == last else f"{first} to {last}"


def _impact_table(rows: Sequence[dict[str, Any]]) -> str:
    """One row per candidate and kind of evidence: how often, whom, when."""
    if not rows:
        return '<p class="muted">No candidate limits.</p>'
    return _table(
        ["candidate", "origin", "action", "evidence", "occurrences", "who", "when (UTC)", "worst seen"],
        [
            (
                r["candidate"],
                r["origin"],
                r["action"],
                r["evidence"],
                r["occurrences"],
                _who(r),
                _span(r["first_seen"], r["last_seen"]),
                r["worst"],
            )
            for r in rows
        ],
        "impact",
    )


def _quiet(rows: Sequence[dict[str, Any]]) -> str:
    """The candidates that would have acted on nothing, in one line."""
    quiet = [r["candidate"] for r in rows if not r["occurrences"]]
    if not quiet:
        return ""
    return f'<p class="quiet">Would have acted on nothing seen: {_e(", ".join(quiet))}.</p>'


def _policy_section(
    section: PolicySection,
    traffic: Traffic,
    recs: list[Recommendation],
    impact: Impact,
    plots: list[Plot],
    warning: str | None,
) -> str:
    keys = [k for k, limit in LIMITS.items() if limit.policy in section.policies]
    parts = [
        f'<section id="policy-{section.id}" class="policy" data-policy="{_e(section.id)}">',
        f"<h2>{_e(section.title)}</h2><p>{_e(section.about)}</p>",
    ]
    parts += [_figure(p) for p in plots]
    parts.append(_facts(section.id, traffic))
    mine = [r for r in recs if r.key in keys]
    parts.append("<h3>Recommended</h3>")
    parts.append(
        _recs_table(mine, warning)
        if mine
        else '<p class="muted">Nothing to recommend from (no evidence for these limits).</p>'
    )
    summary = [r for r in impact.summary if r["key"] in keys]
    parts.append("<h3>Candidate limits</h3>")
    parts.append(_impact_table(summary))
    labels = list(dict.fromkeys(r["candidate"] for r in summary))
    series = {label: impact.timeline.get(label, []) for label in labels}
    if any(series.values()):
        seen = traffic.overview
        parts.append(_figure(impact_timeline(section.id, series, seen.first_ts, seen.last_ts, traffic.bucket_seconds)))
    for label in labels:
        subjects = impact.top_subjects.get(label, [])
        if subjects:
            parts.append(f'<h3 class="who">Who {_e(label)} would have acted on</h3>')
            parts.append(_subjects_table(subjects))
    parts.append("</section>")
    return "".join(parts)


def _subjects_table(subjects: Sequence[dict[str, Any]]) -> str:
    """Per evidence and kind of subject, the subjects acted on most (all of them: impact/subjects)."""
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for s in subjects:
        grouped.setdefault((s["evidence"], s["subject_kind"]), []).append(s)
    rows = [
        (
            evidence,
            kind,
            "; ".join(f"{_short(s['subject'], 70)} ({s['occurrences']:,}x, worst {s['worst']:,})" for s in items),
        )
        for (evidence, kind), items in grouped.items()
    ]
    return _table(
        ["evidence", "kind", f"most often (up to {TOP_SUBJECTS}; every one in impact/subjects)"], rows, "subjects"
    )


def _facts(section: str, t: Traffic) -> str:
    """The numbers behind a section's plots."""
    if section == "sizes":
        largest = [("request", r) for r in t.largest_requests[:5]] + [("response", r) for r in t.largest_responses[:5]]
        return _table(
            ["largest", "client id", "API", "bytes", ""],
            [(what, _short(r["client_id"]), r["api"], r["bytes"], nice_bytes(r["bytes"])) for what, r in largest],
        )
    if section == "memory-pool":
        pool: list[tuple[str, int, str]] = [(k, v, nice_bytes(v)) for k, v in t.pool_percentiles.items()]
        pool.append(("requests that waited", t.pool_waits, ""))
        if t.pool_capacity:
            pool.append(("configured capacity", t.pool_capacity, nice_bytes(t.pool_capacity)))
        return _table(["in-flight high-water mark per proxy and window", "bytes", ""], pool)
    if section == "connections":
        peaks = [
            (name, p.value, p.where, when(p.ts))
            for name, p in (
                ("peak per proxy", t.peak_connections),
                ("peak TLS per proxy", t.peak_tls),
                ("peak per client host", t.peak_per_ip),
            )
            if p is not None
        ]
        closes = _table(["close reason", "connections"], t.close_reasons) if t.close_reasons else ""
        uncounted = (
            f"<p>{t.uncounted_opens:,} connection opens carry no counts (written before proxies recorded"
            " them): no connection limit is judged on them.</p>"
            if t.uncounted_opens
            else ""
        )
        return _table(["", "connections", "where", "when"], peaks) + uncounted + closes
    if section == "group-size":
        return f"<p>{t.groups:,} groups.</p>" + _table(
            ["largest groups", "kind", "members", "when"],
            [(g["group_id"], g["kind"], g["peak"], when(g["ts"])) for g in t.largest_groups],
        )
    return _table(
        ["kind", "longest", "limit key", "client id", "identifier"],
        [
            (k, v["length"], v["key"], _short(v["client_id"]), _short(v["identifier"], 80))
            for k, v in sorted(t.longest.items())
        ],
    )


def _decisions(traffic: Traffic) -> str:
    rows = [
        (
            d["policy"],
            d["limit_key"],
            d["limit"],
            d["mode"],
            d["action"],
            d["count"],
            d["client_ids"],
            when(d["first"]),
            when(d["last"]),
        )
        for d in traffic.decisions
    ]
    return (
        '<section id="decisions"><h2>Decisions the proxies recorded</h2>'
        "<p>Every non-admit decision, and in observe mode every decision a limit would have taken.</p>"
        + (
            _table(
                [
                    "policy",
                    "limit key",
                    "limit",
                    "mode",
                    "action",
                    "decisions",
                    "client ids (approx.)",
                    "first",
                    "last",
                ],
                rows,
            )
            if rows
            else '<p class="muted">None.</p>'
        )
        + "</section>"
    )


def _inputs(problems: Sequence[InputProblem]) -> str:
    if not problems:
        return '<section id="inputs"><h2>Inputs</h2><p>Every line read was a valid version-2 event.</p></section>'
    totals: dict[str, int] = {}
    for p in problems:
        totals[p.problem] = totals.get(p.problem, 0) + p.lines
    files = sorted({p.file for p in problems})
    shown = [p for p in problems if p.file in files[:MAX_PROBLEM_FILES]]
    more = (
        f'<p class="muted">… and {len(files) - MAX_PROBLEM_FILES} more files.</p>'
        if len(files) > MAX_PROBLEM_FILES
        else ""
    )
    return (
        '<section id="inputs"><h2>Inputs that were not valid events</h2>'
        "<p>Counted and skipped; the report is made from the valid events only.</p>"
        + _table(["problem", "lines"], sorted(totals.items()))
        + _table(
            ["file", "problem", "detail", "lines", "sample"],
            [(p.file, p.problem, p.detail, p.lines, _short(p.sample, 80)) for p in shown],
        )
        + more
        + "</section>"
    )


def render(
    *,
    traffic: Traffic,
    recs: list[Recommendation],
    impact: Impact,
    plots: dict[str, list[Plot]],
    problems: Sequence[InputProblem],
    inputs: str,
    timings: Sequence[tuple[str, float]],
    run: dict[str, str],
    yaml_name: str = "recommended-policies.yaml",
    min_span_seconds: float = MIN_SPAN_SECONDS,
    min_windows: int = MIN_WINDOWS,
    headroom_pct: float = 20.0,
) -> str:
    warning = provisional(traffic, min_span_seconds)
    nav = "".join(f'<a href="#policy-{s.id}">{_e(s.title.split(" (")[0])}</a>' for s in SECTIONS)
    body = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>kafka-admission-proxy policy impact report</title>',
        f"<style>{_CSS}</style></head><body>",
        "<h1>Policy impact report</h1>",
        f"<nav>{nav}</nav>",
        _summary(traffic, recs, impact, problems, inputs, yaml_name, min_span_seconds, min_windows, headroom_pct),
        *[_policy_section(s, traffic, recs, impact, plots.get(s.id, []), warning) for s in SECTIONS],
        _decisions(traffic),
        _inputs(problems),
        '<section id="run"><h2>This run</h2>',
        _table(["", ""], sorted(run.items())),
        _table(["step", "seconds"], [(name, round(sec, 2)) for name, sec in timings]),
        "</section></body></html>",
    ]
    return "\n".join(body)
