"""`kafka-admission-proxy report` from a Kafka topic, timed against the same events from JSON lines:
synthetic fleet evidence (bench/fleet_evidence.py, as bench/report_bench.py makes it) produced to a
topic of a real Apache Kafka broker (tools/fetch-apache-kafka), keyed by proxy as the topic sink keys
them, then each report a fresh command in local mode (Spark start included), with its step times.

    .venv/bin/python bench/topic_report_bench.py --events 1000000 --dir /tmp/fleet-bench

With ``--before DIR`` (a checkout of other code, e.g. ``git worktree add DIR COMMIT``, with ``.cache``
linked to this one's for Spark's Kafka jars) each round runs that code's report from the topic, then
this checkout's, back to back on the same broker: the pair to compare on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.fleet_evidence import bench_fleet_spec, generate  # noqa: E402
from tests.apache_kafka.broker import ApacheKafkaBroker, fetch_java_parts  # noqa: E402

TOPIC = "audit-events"
_INSTANCE = re.compile(rb'"instance":\s*"([^"]*)"')
# The broker's heap for gigabytes of events (the tests' small JVM has 512 MiB)
BROKER_JVM = ("-Xms1g", "-Xmx1g", "-XX:+UseParallelGC", "-Xshare:auto")


def _run(*args: str, code: Path = ROOT) -> float:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "report", *args],
        capture_output=True,
        text=True,
        cwd=code,
        env={**os.environ, "PYTHONPATH": str(code)},
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"report {' '.join(args)} failed:\n{done.stderr[-4000:]}")
    return time.monotonic() - started


def _steps(out: Path) -> str:
    run = json.loads((out / "run.json").read_text())
    cpu = dict(run["spark_cpu"])
    return "\n".join(f"    {name}: {s:.1f} s wall, {cpu.get(name) or 0:.1f} s Spark CPU" for name, s in run["steps"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/fleet-bench"))
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--before", type=Path, help="a checkout of the code to compare with, run first in each round")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--topic-only", action="store_true", help="no report from the files")
    args = parser.parse_args()
    events_dir = args.dir / f"topic-events-{args.events}"
    if not events_dir.is_dir():
        spec = bench_fleet_spec(args.events)
        generate(spec, events_dir, workers=2)
    files = sorted(p for p in events_dir.iterdir() if not p.name.startswith("."))
    print(f"input: {sum(p.stat().st_size for p in files) / 1e9:.2f} GB of JSON lines in {len(files)} files")
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    workdir = args.dir / "broker"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    with ApacheKafkaBroker(fetch_java_parts(), workdir, jvm_options=BROKER_JVM) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(TOPIC, args.partitions, 1)])[TOPIC].result(60)
        producer = Producer(
            {
                "bootstrap.servers": broker.bootstrap,
                "linger.ms": 50,
                "batch.size": 1 << 20,
                "compression.type": "lz4",
                "queue.buffering.max.messages": 1_000_000,
            }
        )
        started, produced = time.monotonic(), 0
        for file in files:
            with file.open("rb") as lines:
                for line in lines:
                    line = line.rstrip(b"\n")
                    if not line:
                        continue
                    key = _INSTANCE.search(line)
                    while True:
                        try:
                            producer.produce(TOPIC, value=line, key=key.group(1) if key else None)
                            break
                        except BufferError:
                            producer.poll(0.05)
                    produced += 1
                    if produced % 10_000 == 0:
                        producer.poll(0)
        assert producer.flush(300) == 0
        del producer
        print(f"produced {produced:,} records in {time.monotonic() - started:.0f} s")
        url = f"kafka://{broker.bootstrap}/{TOPIC}"
        topic_out, files_out = args.dir / "report-topic", args.dir / "report-files"
        runs = [(code, topic_out, url) for code in (args.before, ROOT) if code is not None]
        if not args.topic_only:
            runs.append((ROOT, files_out, str(events_dir)))
        for _ in range(args.rounds):
            for code, out, source in runs:
                shutil.rmtree(out, ignore_errors=True)
                seconds = _run("--events", source, "--out", str(out), code=code)
                events = json.loads((out / "run.json").read_text())["events"]
                print(f"{code}: report from {source}: {seconds:.1f} s, {events:,} events\n{_steps(out)}", flush=True)
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
