"""``kafka-admission-proxy report`` over the synthetic fleet: what the report finds
agrees with what the generator planted; lines that are not valid version-2 events
(malformed, an unknown schema version, a file whose writer is in the middle of a
line) are counted and listed in report.html, never fatal; mistakes in
``--candidate``, ``--headroom`` and ``--events`` are one line each, before Spark
starts. (``--to-parquet`` is run in test_standalone_cluster.py, whose cluster
report reads that Parquet.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import DAY, GAP_AFTER, GAP_DAYS, rendered_sections, report_command, report_process

from bench.fleet_evidence import BIG_GROUP, LONG_CLIENT_ID
from pipeline.recommend import with_headroom
from pipeline.report_html import SECTIONS
from tests.conftest import ROOT

pytestmark = pytest.mark.spark


def test_bad_lines_are_counted_and_listed_in_the_report_never_fatal(
    fleet: Any, fleet_report: Any, chromium: Any
) -> None:
    truth = fleet.truth
    assert truth.malformed == 5 and truth.v1 == 3 and len(truth.partial_files) == 1
    run = json.loads((fleet_report.out / "run.json").read_text())
    assert run["events"] == truth.events  # every valid event read, around the bad lines
    assert run["problem_lines"] == truth.malformed + truth.v1 + 1
    by_problem: dict[str, int] = {}
    for p in fleet_report.evidence.problems:
        by_problem[p.problem] = by_problem.get(p.problem, 0) + p.lines
    assert by_problem == {"malformed": truth.malformed, "unknown_version": truth.v1, "half_written": 1}
    page = rendered_sections(chromium, fleet_report.out / "report.html")
    sections = {s["id"]: s for s in page["sections"]}
    assert sections["inputs"]["heading"] == "Inputs that were not valid events"
    for section in SECTIONS:  # the fleet's report too has every policy section with its plots drawn
        plots = sections[f"policy-{section.id}"]["plots"]
        assert plots and all(p["complete"] and p["naturalWidth"] > 0 for p in plots), section.id
    text = page["text"]
    # What the evidence covers, as the browser shows it: 17 days, the gaps, and nothing provisional.
    assert "What the evidence covers" in text and "time span\t17 d: " in text
    assert "observation windows\t36 (per proxy: " in text and "gaps (proxies silent)\t3: a gap is a stretch" in text
    assert "PROVISIONAL" not in text and "provisional" not in text
    assert "schema_version 1" in text and "last line incomplete" in text
    assert truth.partial_files[0] in text
    for problem, lines in by_problem.items():
        assert f"{problem}\t{lines}" in text  # the totals table: problem, lines


def test_the_report_finds_what_the_generator_planted(fleet: Any, fleet_report: Any) -> None:
    truth, traffic = fleet.truth, fleet_report.traffic
    assert traffic.overview.events == truth.events
    assert traffic.overview.instances == tuple(sorted(truth.instances))
    group, members = truth.largest_group["classic"]
    assert (traffic.largest_by_kind["classic"].value, traffic.largest_by_kind["classic"].where) == (members, group)
    assert group == BIG_GROUP
    assert traffic.peak_tls is not None and traffic.peak_tls.value == truth.peak_tls_per_instance
    assert traffic.peak_connections is not None
    assert traffic.peak_connections.value == truth.peak_connections_per_instance
    assert traffic.peak_per_ip is not None and traffic.peak_per_ip.value == truth.peak_per_ip
    top = traffic.largest_requests[0]
    assert (top["client_id"], top["api"], top["bytes"]) == truth.largest_request
    assert traffic.pool_percentiles["max"] == max(truth.pool_high_water_marks)
    for kind, (length, _client_id, _value) in truth.longest.items():
        assert traffic.longest[kind]["length"] == length, kind
    recommended = {r.key: r.value for r in fleet_report.recommendations}
    assert recommended["group.max.size"] == with_headroom(members, 20)
    assert recommended["max.ssl.connections"] == with_headroom(truth.peak_tls_per_instance, 20)
    assert recommended["resource.identifier.max.length"] == len(LONG_CLIENT_ID)
    # group.max.size=50 (a --candidate) names the big group; Kafka's 249 names the long client id.
    named = {(r["subject_kind"], r["subject"]) for r in fleet_report.impact.top_subjects["group.max.size=50"]}
    assert ("group_id", BIG_GROUP) in named
    named = {
        (r["subject_kind"], r["subject"])
        for r in fleet_report.impact.top_subjects["resource.identifier.max.length=249"]
    }
    assert ("client_id", LONG_CLIENT_ID) in named


def test_ten_days_of_evidence_are_not_provisional_and_a_silent_proxy_is_a_gap(fleet: Any, fleet_report: Any) -> None:
    truth, coverage = fleet.truth, fleet_report.traffic.coverage
    assert coverage.windows == {instance: fleet.spec.windows for instance in truth.instances}
    assert coverage.span_seconds == pytest.approx((fleet.spec.windows + GAP_DAYS) * DAY, abs=1)
    silent = sorted(truth.instances)[-1]
    # The silent proxy's days, and the other two's at the end (they stopped GAP_DAYS before it).
    gaps = sorted((g.instance, g.windows_missed) for g in coverage.gaps)
    assert gaps == [(instance, GAP_DAYS) for instance in sorted(truth.instances)]
    (gap,) = [g for g in coverage.gaps if g.instance == silent]
    assert gap.start == pytest.approx(fleet.spec.start + GAP_AFTER * DAY, abs=1) and gap.seconds == GAP_DAYS * DAY
    run = json.loads((fleet_report.out / "run.json").read_text())
    assert run["coverage"]["provisional"] is False and run["coverage"]["gaps"] == 3
    text = (fleet_report.out / "recommended-policies.yaml").read_text()
    assert "PROVISIONAL" not in text and "(provisional)" not in text
    assert "over 17 d, 3 gaps (proxies silent)" in text
    # Consumer groups were seen in 24 of the 36 windows: too thin for a number, a comment says why.
    assert coverage.windows_for("group.consumer.max.size") == 24
    assert (
        "  # group.consumer.max.size: left out, too thin to recommend: 24 observation windows with a consumer "
        "(KIP-848) group, at least 30 needed (--min-windows)"
    ) in text.splitlines()
    assert {r.key: r.value for r in fleet_report.recommendations}["group.consumer.max.size"] is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--candidate", "group.max.size"], "--candidate group.max.size: write KEY=VALUE"),
        (["--candidate", "group.size=5"], "'group.size' is not a limit the report evaluates"),
        (["--candidate", "group.max.size=lots"], "the value of group.max.size must be an integer"),
        (["--headroom", "-5"], "--headroom -5: a percentage from 0 to 1000"),
        (["--min-span", "a week"], "--min-span a week: a duration such as 7d, 12h, 30m, 45s or plain seconds"),
        (["--min-windows", "0"], "--min-windows 0: a number of windows, at least 1"),
    ],
)
def test_a_bad_option_is_one_line_naming_it(
    fleet: Any, tmp_path: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert report_command("--events", str(fleet.path), "--out", str(tmp_path / "out"), *args) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("report: ") and message in line
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_missing_events_path_is_one_line_naming_it(tmp_path: Path) -> None:
    # As an operator runs it: its own process, which must end with that one line and no traceback.
    run = report_process("--events", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out"))
    assert run.returncode == 2
    assert run.stderr.strip() == f"report: --events {tmp_path / 'nowhere'}: no such file or directory"


def test_the_report_process_ends_with_its_jvm_gone_and_sparks_directories_deleted(fleet: Any, tmp_path: Path) -> None:
    """As an operator runs it. The process shuts py4j's gateway down as it ends, so that its JVM exits
    sooner (pipeline.session.release_jvm); the JVM still runs Spark's shutdown hooks, which delete the
    local directories it made (its shuffle files, blocks and scratch files)."""
    local = tmp_path / "spark-local"
    local.mkdir()
    no_cache = tmp_path / "a-file"  # no class archive can be kept under it: the JVM is not writing one as
    no_cache.write_text("")  # the report ends (that JVM is stopped and waited for: stop_session)
    out = tmp_path / "out"
    env = {"SPARK_LOCAL_DIRS": str(local), "XDG_CACHE_HOME": str(no_cache)}
    run = report_process("--events", str(fleet.path), "--out", str(out), env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (out / "report.html").is_file()
    assert "Traceback" not in run.stderr and "saving Spark's classes" not in run.stderr
    assert "py4j" not in run.stderr  # its INFO lines, a connection closed each, are not the operator's
    assert list(local.iterdir()) == [], "Spark's local directories were left behind"


def test_the_report_loads_neither_the_proxy_nor_the_protocol_codec() -> None:
    """The command line and the report's modules, as `report` imports them, load no trio (the proxy's
    I/O) and no kio (the protocol codec, which imports hypothesis wherever that is installed): 0.25 s
    and 0.35 s of every report's start (bench/RESULTS.md)."""
    code = "import json, sys, proxy.cli, pipeline.job; print(json.dumps(sorted(sys.modules)))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    loaded = {name.partition(".")[0] for name in json.loads(run.stdout)}
    assert "pyspark" in loaded  # what the report needs is loaded
    unwanted = loaded & {"trio", "kio", "hypothesis", "pydantic"}
    assert not unwanted, sorted(unwanted)
