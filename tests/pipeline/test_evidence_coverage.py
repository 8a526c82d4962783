"""Honest evidence, without Spark: what the windows cover (span, proxies, windows, gaps), when
a limit is too thin to recommend, ``--min-span``'s durations, and the recommended YAML --
provisional, with keys left out -- accepted by ``check-config`` as the operator runs it. The
same rules on real report runs: test_report_cli.py (the fleet, spanning ten days),
test_demo_report.py and test_report_end_to_end.py (seconds of traffic)."""

from __future__ import annotations

import html
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import check_recommended

from pipeline.coverage import GAP_WINDOWS, Coverage, DurationError, nice_duration, parse_duration
from pipeline.events import Overview
from pipeline.impact import Impact
from pipeline.recommend import Recommendation, policies_yaml, provisional, recommend
from pipeline.report_html import render
from pipeline.traffic import Peak, Traffic

DAY = 86400.0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("7d", 7 * DAY), ("12h", 43200), ("30m", 1800), ("45s", 45), ("2w", 14 * DAY), ("3600", 3600), ("1.5h", 5400)],
)
def test_min_span_reads_durations_and_plain_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["7 days", "-1", "", "7x", "d", "1e3"])
def test_a_bad_duration_is_one_line_naming_the_option_and_the_rule(text: str) -> None:
    with pytest.raises(DurationError) as raised:
        parse_duration(text)
    assert str(raised.value) == f"--min-span {text}: a duration such as 7d, 12h, 30m, 45s or plain seconds"


def test_nice_duration() -> None:
    assert [nice_duration(s) for s in (12, 90, 1800, 5400, 7 * DAY, 10.5 * DAY)] == [
        "12 s",
        "1.5 min",
        "30 min",
        "1.5 h",
        "7 d",
        "10.5 d",
    ]


def rows(
    instance: str, starts: range | list[int], seconds: float = 60.0, kinds: tuple[str, ...] = ("pool",)
) -> list[dict[str, Any]]:
    return [
        {"instance": instance, "kind": k, "window_start": float(s), "seconds": seconds} for s in starts for k in kinds
    ]


def test_gaps_are_stretches_of_more_than_three_window_periods_without_a_window() -> None:
    minute = range(0, 3600, 60)  # an hour of one-minute windows, 0 to 3600
    steady = rows("steady", minute, kinds=("pool", "connections/tls", "connections/plain"))
    # silent from 600 to 1800 (20 periods); then a late roll of 3 periods (not a gap) at 2400
    flaky = rows("flaky", [s for s in minute if not 600 <= s < 1800 and s not in (2400, 2460)])
    late = rows("late", range(1200, 3600, 60))  # started 20 minutes after the fleet
    early = rows("early", range(0, 3000 - 60 * GAP_WINDOWS, 60))  # stopped 4 periods before the end
    coverage = Coverage.of([*steady, *flaky, *late, *early])
    assert (coverage.first, coverage.last, coverage.span_seconds) == (0.0, 3600.0, 3600.0)
    assert coverage.windows == {"early": 47, "flaky": 38, "late": 40, "steady": 60}
    assert coverage.periods == {"early": 60.0, "flaky": 60.0, "late": 60.0, "steady": 60.0}
    gaps = {(g.instance, g.start, g.end, g.windows_missed) for g in coverage.gaps}
    assert gaps == {("flaky", 600.0, 1800.0, 20), ("late", 0.0, 1200.0, 20), ("early", 2820.0, 3600.0, 13)}
    assert [g.instance for g in coverage.gaps] == ["flaky", "late", "early"]  # longest first
    # A window with TLS and plaintext connections counts once as a window with connections.
    assert coverage.by_kind == {"connections": 60, "connections/plain": 60, "connections/tls": 60, "pool": 185}
    assert coverage.windows_for("max.connections") == coverage.windows_for("max.ssl.connections") == 60
    assert coverage.thin("max.connections", 60) is None
    assert coverage.thin("max.connections", 61) == (
        "too thin to recommend: 60 observation windows with connections, at least 61 needed (--min-windows)"
    )
    assert coverage.thin("group.max.size", 1) == (
        "too thin to recommend: 0 observation windows with a classic group, at least 1 needed (--min-windows)"
    )
    assert Coverage.of([]).span_seconds == 0.0 and Coverage.of([]).gaps == ()


def traffic_over(span: float, windows: int) -> Traffic:
    """Traffic with a group, connections and a long client id, its windows spread evenly over ``span``."""
    step = span / windows
    starts = [int(n * step) for n in range(windows)]
    coverage = Coverage.of(
        rows("p1", starts, step, ("pool", "group/classic", "connections/plain"))
        + rows("p1", starts[:2], step, ("identifier",))  # identifiers checked in two windows only
    )
    longest = {
        "client_id": {
            "length": 250,
            "client_id": "x" * 250,
            "identifier": "x" * 250,
            "key": "resource.identifier.max.length",
        }
    }
    return Traffic(
        overview=Overview(events=100, instances=("p1",), first_ts=0.0, last_ts=span),
        bucket_seconds=60,
        coverage=coverage,
        largest_by_kind={"classic": Peak(7, "orders")},
        peak_connections=Peak(5, "p1", 30.0),
        longest=longest,
        decisions=[
            {
                "policy": "group_size",
                "limit_key": "group.max.size",
                "limit": 6,
                "mode": "enforce",
                "action": "refuse",
                "count": 3,
                "client_ids": 1,
                "first": 10.0,
                "last": 20.0,
            }
        ],
    )


def test_short_evidence_is_provisional_thin_limits_are_left_out_and_check_config_accepts_it(tmp_path: Path) -> None:
    traffic = traffic_over(span=600.0, windows=40)  # ten minutes
    recs = recommend(traffic, 20.0, min_windows=30)
    by_key = {r.key: r for r in recs}
    assert by_key["group.max.size"].value == 9  # 7 members + 20%, rounded up
    assert "3 enforced decisions at 6 (what they held back is not counted)" in by_key["group.max.size"].reason
    assert by_key["max.connections"].value == 6
    # Identifiers were checked in two windows: no KIP-1233 switch and no number, a reason instead.
    for key in ("resource.identifier.limit.enable", "resource.identifier.max.length"):
        assert by_key[key] == Recommendation(
            key,
            None,
            "too thin to recommend: 2 observation windows with identifiers checked, at least 30 needed (--min-windows)",
        )
    warning = provisional(traffic)
    assert warning is not None and warning.startswith("PROVISIONAL: the evidence spans 10 min, less than the 7 d")
    text = policies_yaml(recs, traffic, 20.0, min_windows=30)
    lines = text.splitlines()
    header = " ".join(line.removeprefix("# ") for line in lines if line.startswith("# "))
    assert "PROVISIONAL: the evidence spans 10 min, less than the 7 d asked for (--min-span)" in header
    assert "each limit is the largest value the proxies let through (observe-mode decisions included) + 20%" in header
    assert "A limit measured by fewer than 30 observation windows (--min-windows) is left out" in header
    assert "  group.max.size: 9  # largest classic group seen" in "\n".join(lines)
    assert all(
        line.endswith("(provisional)")
        for line in lines
        if line.startswith("  ") and ": " in line and not line.startswith("  #")
    )
    assert (
        "  # resource.identifier.max.length: left out, too thin to recommend: 2 observation windows with "
        "identifiers checked, at least 30 needed (--min-windows)"
    ) in lines
    assert yaml.safe_load(text)["policies"] == {"group.max.size": 9, "max.connections": 6}
    checked = check_recommended(tmp_path, text)
    assert checked.returncode == 0, checked.stderr
    effective = yaml.safe_load(checked.stdout)["policies"]
    assert (effective["group.max.size"], effective["max.connections"]) == (9, 6)
    assert effective["resource.identifier.limit.enable"] is False  # left out: the proxy's default


def test_evidence_spanning_more_than_min_span_is_not_provisional(tmp_path: Path) -> None:
    traffic = traffic_over(span=8 * DAY, windows=192)  # hourly windows for eight days
    assert provisional(traffic) is None
    assert provisional(traffic, min_span_seconds=9 * DAY) is not None  # --min-span 9d
    recs = recommend(traffic, 20.0, min_windows=2)  # the identifiers' two windows are enough now
    assert {r.key: r.value for r in recs}["resource.identifier.max.length"] == 250
    text = policies_yaml(recs, traffic, 20.0, min_windows=2)
    assert "PROVISIONAL" not in text and "(provisional)" not in text
    assert not [line for line in text.splitlines() if line.startswith("  #")]  # no key left out
    checked = check_recommended(tmp_path, text)
    assert checked.returncode == 0, checked.stderr


def test_nothing_but_thin_evidence_is_an_empty_section_check_config_accepts(tmp_path: Path) -> None:
    traffic = traffic_over(span=20.0, windows=10)  # the demo's few seconds
    recs = recommend(traffic, 20.0)
    assert recs and all(r.value is None for r in recs)
    text = policies_yaml(recs, traffic, 20.0)
    assert "policies: {}" in text.splitlines() and "  # max.connections: left out, too thin" in text
    assert yaml.safe_load(text)["policies"] == {}
    checked = check_recommended(tmp_path, text)
    assert checked.returncode == 0, checked.stderr


def test_the_page_says_what_the_evidence_covers_and_warns_of_it() -> None:
    traffic = traffic_over(span=600.0, windows=40)
    # a second proxy that stopped after 5 of the 40 windows: silent for the rest
    coverage = Coverage.of(
        rows("p1", [int(n * 15) for n in range(40)], 15.0, ("pool", "group/classic", "connections/plain"))
        + rows("p2", [int(n * 15) for n in range(5)], 15.0)
    )
    traffic = replace(traffic, coverage=coverage)
    recs = recommend(traffic, 20.0)
    page = render(
        traffic=traffic,
        recs=recs,
        impact=Impact((), [], {}, {}),
        plots={},
        problems=(),
        inputs="test",
        timings=[],
        run={},
    )
    text = re.sub(r"<[^>]+>", "|", html.unescape(page))
    assert "|PROVISIONAL: the evidence spans 10 min, less than the 7 d asked for (--min-span)" in text
    assert "|time span||10 min: 1970-01-01 00:00 UTC to 1970-01-01 00:10 UTC (--min-span 7 d)|" in text
    assert "|observation windows||45 (per proxy: p1 40, p2 5; every 15 s)|" in text
    assert "|gaps (proxies silent)||1: a gap is a stretch longer than 3 of a proxy's window periods" in text
    assert "|p2||1970-01-01 00:01 UTC||1970-01-01 00:10 UTC||8.8 min||35|" in text  # silent from 75 s to 600 s
    assert "|group.max.size||9||provisional||largest classic group seen" in text
    assert "|resource.identifier.max.length||left out||too thin||too thin to recommend: 0 observation windows" in text
    assert "Never tighter than the evidence: each limit is the largest value the proxies let through" in text
