"""`kafka-admission-proxy report` timed on synthetic fleet evidence (bench/fleet_evidence.py):
from JSON lines, the --to-parquet conversion, and from Parquet, each a fresh command in
local mode (Spark start included), with the report's own step times and the Spark
JVM's CPU seconds per step (from each run's run.json).

    .venv/bin/python bench/report_bench.py --events 10000000 --dir /tmp/fleet-bench
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.fleet_evidence import FORMAT, bench_fleet_spec, generate  # noqa: E402


def _run(*args: str) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "report", *args], capture_output=True, text=True, cwd=ROOT, check=False
    )
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"report {' '.join(args)} failed:\n{done.stderr[-4000:]}")
    return seconds, done.stderr


def _steps(out: Path) -> str:
    run = json.loads((out / "run.json").read_text())
    cpu = dict((name, seconds) for name, seconds in run["spark_cpu"])
    rows = [f"    {name}: {seconds:.1f} s wall, {cpu.get(name) or 0:.1f} s Spark CPU" for name, seconds in run["steps"]]
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/fleet-bench"))
    parser.add_argument("--regenerate", action="store_true")
    args = parser.parse_args()
    events_dir = args.dir / f"events-{args.events}"
    made_as = events_dir / ".fleet-format"  # hidden: report reads no hidden files
    if args.regenerate or not made_as.is_file() or made_as.read_text() != str(FORMAT):
        shutil.rmtree(events_dir, ignore_errors=True)
        started = time.monotonic()
        spec = bench_fleet_spec(args.events)
        truth = generate(spec, events_dir, workers=2)
        made_as.write_text(str(FORMAT))
        print(f"generated {truth.events:,} events in {time.monotonic() - started:.0f} s into {events_dir}")
    size = sum(p.stat().st_size for p in events_dir.rglob("*") if p.is_file())
    print(f"input: {size / 1e9:.2f} GB of JSON lines")
    from pipeline.session import class_archive_path

    archive = class_archive_path()
    if archive.is_file():
        print(f"Spark's class archive: {archive} (mapped by every run)")
    else:  # the first report writes it as its JVM exits, 10-20 s counted in its time
        print(f"Spark's class archive: written by the first run below, into {archive}")
    json_out, parquet, parquet_out = args.dir / "report-json", args.dir / "parquet", args.dir / "report-parquet"
    for path in (json_out, parquet, parquet_out):
        shutil.rmtree(path, ignore_errors=True)
    seconds, _ = _run("--events", str(events_dir), "--out", str(json_out))
    events = json.loads((json_out / "run.json").read_text())["events"]
    print(f"report from JSON lines: {seconds:.1f} s, {events / seconds:,.0f} events/s\n{_steps(json_out)}")
    seconds, _ = _run("--events", str(events_dir), "--to-parquet", str(parquet))
    psize = sum(p.stat().st_size for p in parquet.rglob("*") if p.is_file())
    print(f"--to-parquet: {seconds:.1f} s ({psize / 1e6:,.0f} MB of Parquet)")
    seconds, _ = _run("--events", str(parquet), "--out", str(parquet_out))
    print(f"report from Parquet: {seconds:.1f} s, {events / seconds:,.0f} events/s\n{_steps(parquet_out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
