"""Fixtures for the pipeline tests: one real SparkSession (local, 2 cores) for
the whole run, a small synthetic fleet's audit files with their ground truth,
the report made from them once, and a real headless Chromium (selenium and
Debian's chromium-driver). A missing Java or Chromium skips, and under
REQUIRE_ALL=1 (CI) that skip is a failure."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq
import pytest
import yaml

from bench.fleet_evidence import FleetSpec, FleetTruth, generate
from tests.conftest import ROOT

if TYPE_CHECKING:
    from tests.apache_kafka.broker import ApacheKafkaBroker

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# The limits the fleet report evaluates besides the configured, recommended and default ones.
FLEET_CANDIDATES = ("group.max.size=50", "max.ssl.connections=20", "max.connections.per.ip=3")
# The topic every line of the fleet's files is produced to (fleet_topic)
FLEET_TOPIC = "audit-events"


@pytest.fixture(scope="session")
def java() -> None:
    """Spark's JVM needs a Java runtime (under REQUIRE_ALL=1, as in CI, its absence fails)."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java runtime for Spark (apt-get install default-jre-headless)")


@pytest.fixture(scope="session")
def spark(java: None) -> Iterator[Any]:
    from pipeline.session import kafka_source_jars, spark_session

    # With Spark's Kafka source when it was fetched (test_topic_input.py needs it; a session's jars are
    # given when it starts)
    session = spark_session(
        "local[2]", progress=False, driver_memory="2g", short_job=True, kafka_source=bool(kafka_source_jars())
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def topic_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheKafkaBroker]:
    """One Apache Kafka broker (a JVM) for the tests that read a topic with Spark's Kafka source (Tansu's
    offsets miscount for Spark's Java client: it read 1 record of 100). Skips without Spark's Kafka jars."""
    from pipeline.session import kafka_source_jars
    from tests.apache_kafka.broker import ApacheKafkaBroker
    from tests.apache_kafka.cluster import java_parts_or_skip

    if not kafka_source_jars():
        pytest.skip("Spark's Kafka source not fetched (tools/fetch-spark-kafka, make spark-kafka)")
    with ApacheKafkaBroker(java_parts_or_skip(), tmp_path_factory.mktemp("topic-broker")) as broker:
        yield broker


def report_process(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``kafka-admission-proxy report ARGV...`` as an operator runs it: a process of its own (``env``
    added to this one's environment). It returns once the process and its Spark JVM, which shares its
    output pipes, are gone."""
    return subprocess.run(
        [sys.executable, "-m", "proxy.cli", "report", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        env=None if env is None else {**os.environ, **env},
    )


def command_in_process(*argv: str) -> int:
    """``kafka-admission-proxy ARGV...`` in this process: the command's own parser and function, so
    a report runs on the tests' Spark session (a Spark JVM of its own would only add its start-up).
    Not through ``proxy.cli.main``, which would point the process's logging at this test's captured
    stderr."""
    from proxy.cli import build_parser

    args = build_parser().parse_args(list(argv))
    return int(args.func(args))


def check_recommended(
    directory: Path, recommended: str, config: dict[str, Any] | None = None
) -> subprocess.CompletedProcess[str]:
    """``check-config`` as an operator runs it, on ``config`` (default: the demo's) with its ``policies``
    replaced by the recommended YAML as the report wrote it, comments and all."""
    if config is None:
        config = yaml.safe_load((ROOT / "demo" / "demo-config.yaml").read_text())
    path = directory / "with-recommended-policies.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in config.items() if k != "policies"}) + recommended)
    return subprocess.run(
        [sys.executable, "-m", "proxy.cli", "check-config", "--config", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def report_command(*argv: str) -> int:
    """``kafka-admission-proxy report ARGV...`` in this process (:func:`command_in_process`)."""
    return command_in_process("report", *argv)


@dataclass(frozen=True)
class Fleet:
    path: Path
    spec: FleetSpec
    truth: FleetTruth


DAY = 86400.0
# The fleet's last proxy is silent for this long from its window GAP_AFTER on: its later events are moved.
GAP_AFTER, GAP_DAYS = 7, 5


@pytest.fixture(scope="session")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    """3 proxies x 12 windows of a day (about 7,000 events in 6 files), with 5 malformed lines, 3 of
    version 1 and one file whose writer is in the middle of a line. The last proxy's events from its
    window GAP_AFTER on are GAP_DAYS later: it is silent for GAP_DAYS days, and the evidence spans 17
    days, more than the report's --min-span (7 days): its recommendations are not provisional."""
    spec = FleetSpec(
        instances=3,
        clients=60,
        groups=15,
        windows=12,
        window_seconds=DAY,
        malformed_lines=5,
        v1_lines=3,
        partial_file=True,
        lines_per_file=1500,
    )
    path = tmp_path_factory.mktemp("fleet")
    truth = generate(spec, path)
    silent = sorted(truth.instances)[-1]
    moved = shift_times(path, silent, since=spec.start + GAP_AFTER * DAY, by=GAP_DAYS * DAY)
    assert moved > 100
    truth.last_ts += GAP_DAYS * DAY
    return Fleet(path, spec, truth)


def shift_times(directory: Path, instance: str, since: float, by: float) -> int:
    """Move ``instance``'s events from ``since`` on (by their window's start, else their time) ``by``
    seconds later, in the audit files of ``directory``, every other line left as it is. Returns how many."""
    moved = 0
    for file in sorted(directory.iterdir()):
        lines = file.read_text().splitlines(keepends=True)
        for n, line in enumerate(lines):
            try:
                event = json.loads(line)
            except ValueError:
                continue  # malformed, or the half-written last line
            if not isinstance(event, dict) or event.get("instance") != instance:
                continue
            if event.get("window_start", event.get("ts", 0)) >= since:
                for name in ("ts", "window_start"):
                    if name in event:
                        event[name] += by
                lines[n] = json.dumps(event, separators=(",", ":")) + ("\n" if line.endswith("\n") else "")
                moved += 1
        file.write_text("".join(lines))
    return moved


@pytest.fixture(scope="session")
def fleet_report(spark: Any, fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``report`` over the fleet, in this process (the same function the CLI calls)."""
    from pipeline.impact import parse_candidate
    from pipeline.job import ReportOptions, Steps, run_report

    out = tmp_path_factory.mktemp("fleet-report")
    options = ReportOptions((str(fleet.path),), str(out), tuple(parse_candidate(c) for c in FLEET_CANDIDATES))
    return run_report(spark, options, Steps(stream=None))


@pytest.fixture(scope="session")
def fleet_topic(topic_broker: ApacheKafkaBroker, fleet: Fleet) -> tuple[str, int]:
    """(kafka://.../audit-events on the tests' broker, lines produced): every line of the fleet's files
    (valid events keyed by their proxy, the rest with no key), in 3 partitions."""
    from confluent_kafka import Producer

    from tests.clients import create_topic

    create_topic(topic_broker.bootstrap, FLEET_TOPIC, partitions=3)
    producer = Producer({"bootstrap.servers": topic_broker.bootstrap, "linger.ms": 20})
    produced = 0
    for file in sorted(fleet.path.iterdir()):
        for line in file.read_bytes().splitlines():
            if not line.strip():
                continue
            try:
                key = json.loads(line).get("instance")
            except (ValueError, AttributeError):
                key = None
            producer.produce(FLEET_TOPIC, value=line, key=key.encode() if isinstance(key, str) else None)
            producer.poll(0)
            produced += 1
    assert producer.flush(60) == 0
    del producer  # no client left reconnecting to the broker once it stops
    return f"kafka://{topic_broker.bootstrap}/{FLEET_TOPIC}", produced


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip("chromium and chromium-driver not installed (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--window-size=1280,2000",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    yield driver
    driver.quit()


def impact_tables(out: Path) -> dict[str, list[tuple[Any, ...]]]:
    """The impact tables written under ``out/impact``, every row, in a fixed order."""
    tables = {}
    for name in ("summary", "subjects", "timeline"):
        rows = pq.read_table(out / "impact" / name).to_pylist()
        tables[name] = sorted((tuple(sorted(row.items())) for row in rows), key=repr)
    return tables


def assert_same_report(files: Path, other: Path) -> None:
    """The reports under ``files`` and ``other`` (each a report's --out; the second from a topic or on a
    cluster) say the same: every row of the impact tables, the recommended YAML, and the run's counts,
    candidates and coverage."""
    assert impact_tables(other) == impact_tables(files)
    assert (other / "recommended-policies.yaml").read_text() == (files / "recommended-policies.yaml").read_text()
    by_files, by_other = json.loads((files / "run.json").read_text()), json.loads((other / "run.json").read_text())
    for key in ("events", "by_kind", "candidates", "coverage"):
        assert by_other[key] == by_files[key], key


def assert_renders(driver: Any, page: Path) -> dict[str, Any]:
    """``page`` (a report.html) in a real browser: the summary, the inputs and every policy section with
    its plots drawn (loaded, decoded, with a size on screen), and nothing fetched. Returns what it rendered."""
    from pipeline.report_html import SECTIONS

    rendered = rendered_sections(driver, page)
    sections = {s["id"]: s for s in rendered["sections"]}
    assert "summary" in sections and "inputs" in sections
    for section in SECTIONS:
        shown = sections[f"policy-{section.id}"]
        assert shown["heading"] == section.title
        assert shown["plots"], f"{section.id}: no plot"
        for plot in shown["plots"]:
            assert plot["complete"] and plot["naturalWidth"] > 0, (section.id, plot)
            assert plot["width"] > 100 and plot["height"] > 50, (section.id, plot)
            assert plot["src"].startswith("data:image/svg+xml"), (section.id, plot)
    assert [url for url in rendered["fetched"] if not url.startswith("data:")] == []
    return rendered


def rendered_sections(driver: Any, page: Path) -> dict[str, Any]:
    """Open ``page`` and describe what the browser rendered: every section, its plots
    (loaded, decoded, with a size on screen), and any resource fetched."""
    driver.get(page.as_uri())
    return dict(
        driver.execute_script(
            """
        const plots = (root) => [...root.querySelectorAll('figure.plot img')].map(img => {
            const box = img.getBoundingClientRect();
            return {name: img.closest('figure').dataset.plot, complete: img.complete,
                    naturalWidth: img.naturalWidth, width: box.width, height: box.height,
                    src: img.src.slice(0, 26)};
        });
        return {
            sections: [...document.querySelectorAll('section')].map(s => ({
                id: s.id, heading: (s.querySelector('h2') || {}).textContent || '', plots: plots(s)})),
            fetched: performance.getEntriesByType('resource').map(e => e.name),
            text: document.body.innerText,
        };
        """
        )
    )


def evidence_of(spark: Any, events: list[dict[str, Any]]) -> Any:
    """Evidence made of these version-2 events (a small DataFrame, the schema's every column)."""
    from pipeline.events import EVENT_COLUMNS, EVENT_SCHEMA, Evidence

    doubles = {f.name for f in EVENT_SCHEMA.fields if f.dataType.typeName() == "double"}

    def value(event: dict[str, Any], column: str) -> Any:
        v = event.get(column)
        return float(v) if column in doubles and v is not None else v

    rows = [tuple(value({"schema_version": 2, "instance": "p1", **e}, c) for c in EVENT_COLUMNS) for e in events]
    return Evidence(spark.createDataFrame(rows, EVENT_SCHEMA))


def window(section: str, start: float, **fields: Any) -> dict[str, Any]:
    return {
        "type": "window",
        "ts": start + 60,
        "section": section,
        "window_start": start,
        "window_seconds": 60.0,
        **fields,
    }


def connection(event: str, ts: float, conn_id: str, address: str, tls: bool, **fields: Any) -> dict[str, Any]:
    return {
        "type": "connection",
        "ts": ts,
        "event": event,
        "conn_id": conn_id,
        "listener": "tls" if tls else "plain",
        "client_address": address,
        "tls": tls,
        **fields,
    }


def counted(connections: int | None, ssl: int | None, ip: int) -> dict[str, Any]:
    """What a proxy's connection limits counted as they admitted a connection (its open event)."""
    return {"open_connections": connections, "open_ssl_connections": ssl, "open_ip_connections": ip}


def decision(policy: str, limit_key: str, limit: int, ts: float = 100.0, **fields: Any) -> dict[str, Any]:
    return {
        "type": "decision",
        "ts": ts,
        "policy": policy,
        "mode": "observe",
        "action": "refuse",
        "reason": "test",
        "limit_key": limit_key,
        "limit": limit,
        **fields,
    }
