"""``kafka-admission-proxy report``: the whole job, from audit files to
report.html, recommended-policies.yaml and the impact/ Parquet tables (or,
with ``--to-parquet``, the events converted to Parquet).

Every step is a function of :mod:`pipeline`; this module runs them in order,
says on stderr what it is doing and how long each step took, and turns
operator mistakes into one line and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from .coverage import MIN_SPAN_SECONDS, MIN_WINDOWS, DurationError, nice_duration, parse_duration, parse_instant
from .events import (
    EVENT_SCHEMA,
    REPORT_SCHEMA,
    EventsPathError,
    Evidence,
    Inputs,
    between,
    find_inputs,
    read_evidence,
    relabelled,
    write_parquet,
)
from .impact import Candidate, CandidateError, Impact, choose_candidates, impact_tables, parse_candidate
from .plots import Plot, load_in_background, plots_for
from .recommend import Recommendation, policies_yaml, provisional, recommend
from .report_html import render
from .session import (
    SHORT_JOB_BYTES,
    JavaMissingError,
    KafkaSourceMissingError,
    driver_memory_for,
    jvm_cpu_seconds,
    sized_for,
    spark_session,
    stop_session,
)
from .topic import Topic, is_topic, parse_topic, topic_lines
from .traffic import Traffic, measure_traffic, open_connections

__all__ = ["ReportOptions", "ReportResult", "Steps", "main", "run_report", "to_parquet"]

EXIT_USAGE = 2
YAML_NAME = "recommended-policies.yaml"


@dataclass(frozen=True)
class ReportOptions:
    events: tuple[str, ...]  # paths, and topics as kafka://HOST:PORT/TOPIC
    out: str
    candidates: tuple[Candidate, ...] = ()
    headroom_pct: float = 20.0
    min_span_seconds: float = MIN_SPAN_SECONDS  # less: every recommendation is provisional
    min_windows: int = MIN_WINDOWS  # a limit measured by fewer windows gets no number
    since: float | None = None  # the events from this time (Unix seconds) on, by their own time
    until: float | None = None  # and before this one


@dataclass
class Steps:
    """Names, wall time and Spark CPU time of the job's steps, printed as they end (progress on
    long runs; the CPU time says where the work went on a machine shared with others)."""

    stream: TextIO | None = field(default_factory=lambda: sys.stderr)  # the stderr of when it runs
    cpu: Callable[[], float | None] = lambda: None
    done: list[tuple[str, float]] = field(default_factory=list)
    cpu_done: list[tuple[str, float | None]] = field(default_factory=list)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        if self.stream is not None:
            print(f"report: {name} ...", file=self.stream, flush=True)
        started, cpu_before = time.monotonic(), self.cpu()
        yield
        seconds = time.monotonic() - started
        cpu_after = self.cpu()
        cpu = cpu_after - cpu_before if cpu_after is not None and cpu_before is not None else None
        self.done.append((name, seconds))
        self.cpu_done.append((name, cpu))
        if self.stream is not None:
            spent = f", Spark CPU {cpu:.1f}s" if cpu is not None else ""
            print(f"report: {name}: {seconds:.1f}s{spent}", file=self.stream, flush=True)


@dataclass(frozen=True)
class ReportResult:
    out: Path
    traffic: Traffic
    recommendations: list[Recommendation]
    impact: Impact
    evidence: Evidence


def run_report(spark: SparkSession, options: ReportOptions, steps: Steps | None = None) -> ReportResult:
    """The report over ``options.events`` into ``options.out`` on an existing session."""
    steps = steps or Steps()
    with steps.step("finding input files"):
        inputs, topics = _sources(options.events)
    out = Path(options.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    # JSON lines are converted to Parquet here while the report runs (pipeline.json_lines)
    with (
        tempfile.TemporaryDirectory(prefix=".events-", dir=out) as scratch,
        sized_for(spark, None if topics else inputs.parquet_bytes),
    ):
        return _report(spark, options, inputs, topics, steps, out, scratch)


def _sources(events: Sequence[str]) -> tuple[Inputs, list[Topic]]:
    """``--events`` sorted into files (found) and topics (parsed): a bad one is named before Spark starts."""
    topics = [parse_topic(e) for e in events if is_topic(e)]
    return find_inputs([e for e in events if not is_topic(e)]), topics


def _described(inputs: Inputs, topics: Sequence[Topic]) -> str:
    files = [inputs.described] if inputs.json_files or inputs.parquet_dirs or not topics else []
    return " and ".join([*files, *(f"topic {t.url}" for t in topics)])


def _read(
    spark: SparkSession,
    inputs: Inputs,
    topics: Sequence[Topic],
    scratch: str,
    since: float | None,
    until: float | None,
    schema: StructType,
) -> tuple[Evidence, Inputs]:
    """The events of the files and topics from ``since`` until ``until``. A topic's values are written as
    JSON lines in ``scratch`` (pipeline.topic) and read with the files, by the same parser and rules."""
    labels: dict[str, str] = {}
    for n, topic in enumerate(topics):
        labels.update(topic_lines(spark, topic, str(Path(scratch, f"topic-{n}")), since))
    if labels:
        written = find_inputs(sorted(labels))
        inputs = Inputs(inputs.json_files + written.json_files, inputs.parquet_dirs, inputs.empty_files)
    converted = str(Path(scratch, "converted"))
    evidence = relabelled(read_evidence(spark, inputs, converted, schema), labels)
    return between(evidence, since, until), inputs


def _report(
    spark: SparkSession,
    options: ReportOptions,
    inputs: Inputs,
    topics: Sequence[Topic],
    steps: Steps,
    out: Path,
    scratch: str,
) -> ReportResult:
    described = _described(inputs, topics)
    with steps.step(f"reading {described}"):
        evidence, inputs = _read(spark, inputs, topics, scratch, options.since, options.until, REPORT_SCHEMA)
    with steps.step("traffic aggregates"):
        opens = open_connections(evidence.connections)
        traffic = measure_traffic(evidence, opens)
    seen = evidence.overview
    if steps.stream is not None:
        print(f"report: {seen.events:,} valid events, {evidence.problem_lines:,} lines not valid", file=steps.stream)
    with steps.step("recommendations"):
        recs = recommend(traffic, options.headroom_pct, options.min_windows)
        yaml_text = policies_yaml(recs, traffic, options.headroom_pct, options.min_span_seconds, options.min_windows)
        (out / YAML_NAME).write_text(yaml_text)
    configured = {(d["limit_key"], int(d["limit"])) for d in traffic.decisions if d["limit"] is not None}
    recommended = [(r.key, r.limit) for r in recs if r.limit is not None]
    candidates = choose_candidates(options.candidates, sorted(configured), recommended)
    limits = dict(recommended)
    with ThreadPoolExecutor(1, thread_name_prefix="plots") as drawing:
        # matplotlib draws the traffic's plots (2-3 s of Python) while Spark works out the impact, from
        # when the impact's plans are made: making them is Python's work too, and sharing the GIL with
        # the drawing made it 1.5 s longer (10M events)
        plots: list[Future[dict[str, list[Plot]]]] = []
        with steps.step(f"impact of {len(candidates)} candidate limits"):
            impact = impact_tables(
                spark,
                evidence,
                opens,
                candidates,
                str(out),
                traffic.bucket_seconds,
                planned=lambda: plots.append(drawing.submit(plots_for, traffic, limits)),
            )
        with steps.step("report.html"):
            run = {
                "spark": spark.version,
                "master": str(spark.sparkContext.master),
                "inputs": ", ".join(options.events),
                "headroom": f"{options.headroom_pct:g}%",
                "min span": nice_duration(options.min_span_seconds),
                "min windows": str(options.min_windows),
                "time bucket": f"{traffic.bucket_seconds} s",
            }
            page = render(
                traffic=traffic,
                recs=recs,
                impact=impact,
                plots=plots[0].result(),
                problems=evidence.problems,
                inputs=described,
                timings=steps.done,
                run=run,
                min_span_seconds=options.min_span_seconds,
                min_windows=options.min_windows,
                headroom_pct=options.headroom_pct,
            )
            (out / "report.html").write_text(page, encoding="utf-8")
    (out / "run.json").write_text(
        json.dumps(
            {
                "events": seen.events,
                "by_kind": seen.by_kind,
                "problem_lines": evidence.problem_lines,
                "candidates": [c.label for c in candidates],
                "coverage": {
                    "span_seconds": traffic.coverage.span_seconds,
                    "windows": traffic.coverage.windows,
                    "gaps": len(traffic.coverage.gaps),
                    "provisional": provisional(traffic, options.min_span_seconds) is not None,
                    "too_thin": [r.key for r in recs if r.value is None],
                },
                "steps": steps.done,
                "spark_cpu": steps.cpu_done,
                **run,
            },
            indent=1,
        )
    )
    return ReportResult(out, traffic, recs, impact, evidence)


def to_parquet(
    spark: SparkSession,
    events: Sequence[str],
    target: str,
    steps: Steps | None = None,
    since: float | None = None,
    until: float | None = None,
) -> Inputs:
    """Convert audit files and topics to Parquet (partitioned by kind and section) in ``target``."""
    steps = steps or Steps()
    with steps.step("finding input files"):
        inputs, topics = _sources(events)
    parent = Path(target).resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    with (
        steps.step(f"converting {_described(inputs, topics)} to Parquet"),
        tempfile.TemporaryDirectory(prefix=".events-", dir=parent) as scratch,
        sized_for(spark, None if topics else inputs.parquet_bytes),
    ):
        evidence, inputs = _read(spark, inputs, topics, scratch, since, until, EVENT_SCHEMA)
        write_parquet(evidence, target)
    if steps.stream is not None:
        print(
            f"report: {evidence.problem_lines:,} lines not valid events (listed in {target}/_input_problems.json)",
            file=steps.stream,
        )
    return inputs


def main(args: argparse.Namespace) -> int:
    """The ``report`` command (arguments parsed by ``proxy.cli``)."""
    try:
        candidates = tuple(parse_candidate(c) for c in args.candidate)
        if not 0 <= args.headroom <= 1000:
            raise CandidateError(f"--headroom {args.headroom:g}: a percentage from 0 to 1000")
        min_span = MIN_SPAN_SECONDS if args.min_span is None else parse_duration(args.min_span)
        min_windows = MIN_WINDOWS if args.min_windows is None else args.min_windows
        if min_windows < 1:
            raise CandidateError(f"--min-windows {min_windows}: a number of windows, at least 1")
        events = list(args.events or [])
        if (args.kafka_bootstrap is None) != (args.topic is None):
            raise EventsPathError("--kafka-bootstrap and --topic go together: the brokers and the topic they hold")
        if args.topic is not None:
            events.append(parse_topic(f"kafka://{args.kafka_bootstrap}/{args.topic}", "--kafka-bootstrap/--topic").url)
        if not events:
            raise EventsPathError(
                "no events: --events PATH..., kafka://HOST:PORT/TOPIC, or --kafka-bootstrap and --topic"
            )
        now = time.time()
        since = None if args.since is None else parse_instant(args.since, "--since", now)
        until = None if args.until is None else parse_instant(args.until, "--until", now)
        if since is not None and until is not None and since >= until:
            raise DurationError(f"--since {args.since} is not before --until {args.until}")
        inputs, topics = _sources(events)  # a missing path or a bad topic is named before Spark starts
        steps = Steps()
        load_in_background()
        with steps.step(f"starting Spark ({args.master})"):
            spark = spark_session(
                args.master,
                short_job=inputs.parquet_bytes < SHORT_JOB_BYTES,
                driver_memory=driver_memory_for(inputs.total_bytes),
                class_archive=True,
                kafka_source=bool(topics),
            )
        try:
            steps.cpu = lambda: jvm_cpu_seconds(spark)
            if args.to_parquet:
                to_parquet(spark, events, args.to_parquet, steps, since, until)
                print(f"Parquet events: {Path(args.to_parquet).resolve()}")
            else:
                options = ReportOptions(
                    tuple(events), args.out, candidates, args.headroom, min_span, min_windows, since, until
                )
                result = run_report(spark, options, steps)
                print(f"report: {result.out / 'report.html'}")
                print(f"recommended policies: {result.out / YAML_NAME}")
                print(f"impact tables: {result.out / 'impact'}")
            total = sum(seconds for _, seconds in steps.done)
            print(f"report: done in {total:.1f}s", file=sys.stderr, flush=True)
        finally:
            stop_session(spark, say=lambda text: print(f"report: {text}", file=sys.stderr, flush=True))
        return 0
    except (EventsPathError, CandidateError, DurationError, JavaMissingError, KafkaSourceMissingError) as exc:
        print(f"report: {exc}", file=sys.stderr)
        return EXIT_USAGE
