"""``make demo`` tells the whole story: the demo's proxy writes audit events and,
once the demo stops, ``report`` turns them into report.html and says where it is.
The test runs the command ``make demo`` runs (read from ``make -n demo``), with
``--exit-after-workload`` so it stops by itself, in this process (``command_in_process``):
its report runs on the tests' Spark session (a Spark JVM of
its own would add ~25 s of start-up and cold code). ``tests/integration/test_cli.py``
runs the ``demo`` console script itself as a process. Its seconds of traffic are too little to
recommend limits from: the report says so (provisional, every limit too thin) rather than giving numbers."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import check_recommended, command_in_process

from pipeline.coverage import MIN_WINDOWS
from tests.conftest import ROOT

pytestmark = pytest.mark.spark


def test_make_demo_ends_with_the_report_over_its_own_audit_events(
    tmp_path: Path, spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    planned = subprocess.run(["make", "-n", "demo"], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    (line,) = [x for x in planned.splitlines() if "kafka-admission-proxy demo" in x]
    command = shlex.split(line)
    assert command[1:3] == ["demo", "--report"]
    demo_dir = tmp_path / "demo"  # the same command, into a directory of this test
    command[3] = str(demo_dir)
    assert Path(command[0]).name == "kafka-admission-proxy"
    sigterm = signal.getsignal(signal.SIGTERM)
    status = command_in_process(*command[1:], "--exit-after-workload", "--records", "300")
    run = capsys.readouterr()
    # The process goes on after the demo: it leaves its signals as it found them (a blocked SIGTERM
    # was inherited by every proxy started later, and none of them could be stopped).
    assert signal.getsignal(signal.SIGTERM) is sigterm
    assert not signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert status == 0, run.out[-2000:] + run.err[-4000:]
    out = demo_dir / "report"
    lines = run.out.strip().splitlines()
    assert "workload: produced 300, consumed 300" in run.out
    assert f"report: {out / 'report.html'}" in lines[-3:]  # it ends saying where report.html is
    assert (out / "report.html").stat().st_size > 10_000
    summary = json.loads((out / "run.json").read_text())
    assert summary["by_kind"]["connection"] > 0 and summary["by_kind"]["window/client_api"] > 0
    assert summary["problem_lines"] == 0
    assert {"produce", "fetch"} <= {
        e["api"]
        for f in (demo_dir / "audit").glob("demo-*.jsonl")
        for e in map(json.loads, f.open())
        if e.get("section") == "client_api"
    }
    # Seconds of traffic are no evidence to set limits by: the report says so, in the page and the YAML.
    windows = summary["coverage"]["windows"]["demo"]
    assert 1 <= windows < MIN_WINDOWS  # windows of 2 s: a demo of seconds is far from --min-windows
    assert summary["coverage"]["provisional"] is True
    assert {"max.connections", "socket.request.max.bytes", "queued.max.request.bytes"} <= set(
        summary["coverage"]["too_thin"]
    )
    text = (out / "recommended-policies.yaml").read_text()
    header = " ".join(line.removeprefix("# ") for line in text.splitlines() if line.startswith("# "))
    assert "PROVISIONAL: the evidence spans " in header and "less than the 7 d asked for (--min-span)" in header
    assert "Never tighter than the evidence: each limit is the largest value the proxies let through" in header
    assert yaml.safe_load(text)["policies"] == {}  # every limit too thin: the proxy keeps its defaults
    for key in ("max.connections", "socket.request.max.bytes"):
        assert f"  # {key}: left out, too thin to recommend: {windows} observation windows" in text, key
    checked = check_recommended(tmp_path, text)  # the comments and the empty section included
    assert checked.returncode == 0, checked.stderr
    page = (out / "report.html").read_text()
    assert "PROVISIONAL: the evidence spans" in page and "too thin to recommend" in page
