"""``kafka-admission-proxy report`` as a command, over the synthetic fleet: lines
that are not valid version-2 events (malformed, an unknown schema version, a file
whose writer is in the middle of a line) are counted and listed in report.html,
never fatal; ``--to-parquet`` converts the events and a report from the Parquet
equals the one from JSON lines; mistakes in ``--candidate``, ``--headroom`` and
``--events`` are one line each, before Spark starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import FLEET_CANDIDATES, rendered_sections

from pipeline.impact import parse_candidate
from pipeline.job import ReportOptions, Steps, run_report
from pipeline.report_html import SECTIONS
from tests.conftest import ROOT

pytestmark = pytest.mark.spark


def report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy.cli", "report", *args], capture_output=True, text=True, cwd=ROOT, timeout=600
    )


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
    assert "schema_version 1" in text and "last line incomplete" in text
    assert truth.partial_files[0] in text
    for problem, lines in by_problem.items():
        assert f"{problem}\t{lines}" in text  # the totals table: problem, lines


def _tables(spark: Any, out: Path) -> dict[str, list[tuple[Any, ...]]]:
    return {
        table: sorted((tuple(r) for r in spark.read.parquet(str(out / "impact" / table)).collect()), key=repr)
        for table in ("summary", "subjects", "timeline")
    }


def test_to_parquet_converts_and_the_report_from_parquet_equals_the_json_one(
    spark: Any, fleet: Any, fleet_report: Any, tmp_path: Path
) -> None:
    parquet = tmp_path / "parquet"
    run = report("--events", str(fleet.path), "--to-parquet", str(parquet))
    assert run.returncode == 0, run.stderr[-4000:]
    assert f"Parquet events: {parquet}" in run.stdout
    assert list(parquet.rglob("*.parquet")) and (parquet / "_input_problems.json").is_file()
    out = tmp_path / "from-parquet"
    options = ReportOptions((str(parquet),), str(out), tuple(parse_candidate(c) for c in FLEET_CANDIDATES))
    from_parquet = run_report(spark, options, Steps(stream=None))
    assert from_parquet.evidence.overview == fleet_report.evidence.overview
    # The input problems found while converting travel with the Parquet into the report.
    assert sorted(from_parquet.evidence.problems, key=repr) == sorted(fleet_report.evidence.problems, key=repr)
    assert _tables(spark, out) == _tables(spark, fleet_report.out)
    yaml_name = "recommended-policies.yaml"
    assert (out / yaml_name).read_text() == (fleet_report.out / yaml_name).read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--candidate", "group.max.size"], "--candidate group.max.size: write KEY=VALUE"),
        (["--candidate", "group.size=5"], "'group.size' is not a limit the report evaluates"),
        (["--candidate", "group.max.size=lots"], "the value of group.max.size must be an integer"),
        (["--headroom", "-5"], "--headroom -5: a percentage from 0 to 1000"),
    ],
)
def test_a_bad_option_is_one_line_naming_it(fleet: Any, tmp_path: Path, args: list[str], message: str) -> None:
    run = report("--events", str(fleet.path), "--out", str(tmp_path / "out"), *args)
    assert run.returncode == 2
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("report: ") and message in line and "Traceback" not in run.stderr
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_missing_events_path_is_one_line_naming_it(tmp_path: Path) -> None:
    run = report("--events", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out"))
    assert run.returncode == 2
    assert run.stderr.strip() == f"report: --events {tmp_path / 'nowhere'}: no such file or directory"
