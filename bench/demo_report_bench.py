"""`kafka-admission-proxy report` over the demo's audit events (issue 32: <= 12 s of wall time, the JVM's
start included), each run a fresh command in local mode as an operator runs it after `make demo`: its wall
time, its report steps (run.json), and the CPU time of its whole process tree (Python, Spark's JVM, Spark's
Python workers, from /proc), which says more than wall time on a machine shared with others.

    .venv/bin/python bench/demo_report_bench.py [--runs 3] [--dir /tmp/demo-bench]

The demo's events are made once by `kafka-admission-proxy demo --report DIR --exit-after-workload` (the
command `make demo` runs) and reused; --regenerate makes them again.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import load_average  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found = []
    for task in tasks:
        try:
            found += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except OSError:
            pass
    return found


def _cpu(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


def run_timed(argv: list[str], cwd: Path = ROOT) -> tuple[float, float, str]:
    """Run ``argv``; its wall seconds, the CPU seconds of its process tree (each process's last reading,
    polled every 20 ms: a process's last 20 ms may be missed), and its stderr."""
    started = time.monotonic()
    process = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen: dict[int, float] = {}
    while process.poll() is None:
        pending = [process.pid]
        while pending:
            pid = pending.pop()
            cpu = _cpu(pid)
            if cpu is not None:
                seen[pid] = cpu
            pending += _children(pid)
        time.sleep(0.02)
    seconds = time.monotonic() - started
    err = process.stderr.read() if process.stderr else ""
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{err[-4000:]}")
    return seconds, sum(seen.values()), err


def demo_events(directory: Path, regenerate: bool) -> Path:
    audit = directory / "audit"
    if regenerate or not any(audit.glob("*.jsonl")):
        shutil.rmtree(directory, ignore_errors=True)
        subprocess.run(
            [sys.executable, "-m", "proxy.cli", "demo", "--report", str(directory), "--exit-after-workload"],
            cwd=ROOT,
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return audit


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/demo-bench"))
    parser.add_argument("--regenerate", action="store_true")
    args = parser.parse_args()
    audit = demo_events(args.dir, args.regenerate)
    events = sum(1 for f in audit.glob("*.jsonl") for _ in f.open())
    print(f"demo events: {events} lines in {audit}")
    out = args.dir / "bench-report"
    for n in range(args.runs):
        shutil.rmtree(out, ignore_errors=True)
        load = load_average()
        seconds, cpu, _ = run_timed(
            [sys.executable, "-m", "proxy.cli", "report", "--events", str(audit), "--out", str(out)]
        )
        run = json.loads((out / "run.json").read_text())
        steps = ", ".join(f"{name.split(' (')[0]} {s:.1f}" for name, s in run["steps"])
        print(f"run {n + 1}: {seconds:.1f} s wall, {cpu:.1f} s CPU (process tree); load {load}; steps: {steps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
