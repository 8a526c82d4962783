"""``report`` over a Kafka topic (Spark's Kafka source, jars from tools/fetch-spark-kafka): the fleet's
audit lines produced to a topic on a real Apache Kafka broker (Tansu's offsets miscount for Spark's
Java client: it read 1 record of 100), keyed by proxy as the topic sink keys them, make the same impact
tables, recommendations and YAML as the same lines read from the files; ``--since``/``--until`` select
the same events from both. The reports run on the tests' Spark session, the topic is conftest.py's
``fleet_topic``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from conftest import DAY, FLEET_CANDIDATES, Fleet, assert_same_report, report_command

pytestmark = pytest.mark.spark


def _report(out: Path, *events: str, extra: tuple[str, ...] = ()) -> Path:
    candidates = [arg for c in FLEET_CANDIDATES for arg in ("--candidate", c)]
    assert report_command("--events", *events, "--out", str(out), *candidates, *extra) == 0
    return out


def test_a_topic_makes_the_same_report_as_the_files(
    fleet: Fleet, fleet_report: Any, fleet_topic: Any, tmp_path: Path
) -> None:
    url, produced = fleet_topic
    files = fleet_report.out  # the report over the files, with the same candidates (conftest.py)
    from_topic = _report(tmp_path / "topic", url)
    assert_same_report(files, from_topic)
    run = json.loads((from_topic / "run.json").read_text())
    assert run["events"] == fleet.truth.events
    # Every line not an event is listed: the files' half-written last line is a malformed record of the topic
    files_run = json.loads((files / "run.json").read_text())
    assert run["problem_lines"] == files_run["problem_lines"] == produced - fleet.truth.events
    page = (from_topic / "report.html").read_text()
    assert f"{url} partition" in page  # the problems are named by topic and partition


def test_since_and_until_select_the_same_events_from_both(fleet: Fleet, fleet_topic: Any, tmp_path: Path) -> None:
    url, _ = fleet_topic
    since, until = fleet.spec.start + 3 * DAY, fleet.spec.start + 9 * DAY
    assert (since, until) == (1_795_046_400.0, 1_795_564_800.0)  # 2026-11-19 and 2026-11-25, 00:00 UTC
    # The same instants said two ways (UTC when no offset is given)
    files = _report(tmp_path / "files", str(fleet.path), extra=("--since", "2026-11-19", "--until", "2026-11-25T00:00"))
    from_topic = _report(
        tmp_path / "topic", url, extra=("--since", "2026-11-19T01:00+01:00", "--until", "2026-11-25T00:00:00Z")
    )
    assert_same_report(files, from_topic)
    run = json.loads((from_topic / "run.json").read_text())
    assert _events_between(fleet.path, 0, 2e9) == fleet.truth.events  # what is counted is what the report reads
    assert 0 < run["events"] == _events_between(fleet.path, since, until) < fleet.truth.events
    # From the first window's start (a day before its end, the window's time) to the last window's end
    assert until - since < run["coverage"]["span_seconds"] <= until - since + DAY


def _events_between(directory: Path, since: float, until: float) -> int:
    """Version-2 events in the files from ``since`` until ``until`` (the fleet's other lines are not JSON
    objects, or of version 1)."""
    count = 0
    for file in directory.iterdir():
        for line in file.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            count += isinstance(event, dict) and event.get("schema_version") == 2 and since <= event["ts"] < until
    return count


def test_times_are_iso_or_a_duration_before_now() -> None:
    from pipeline.coverage import DurationError, parse_instant

    assert parse_instant("7d", "--since", 1_800_000_000.0) == 1_800_000_000.0 - 7 * DAY
    assert parse_instant("2026-11-19", "--since", 0.0) == 1_795_046_400.0
    assert parse_instant("2026-11-19T01:00+01:00", "--until", 0.0) == 1_795_046_400.0
    with pytest.raises(DurationError, match=r"^--until yesterday: an ISO time such as"):
        parse_instant("yesterday", "--until", 0.0)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (("--events", "x", "--since", "soon"), "report: --since soon: an ISO time such as 2026-11-20T08:00Z"),
        (("--events", "x", "--since", "1d", "--until", "2d"), "report: --since 1d is not before --until 2d"),
        (("--events", "kafka://127.0.0.1/audit"), "report: --events kafka://127.0.0.1/audit: a topic is kafka://HOST"),
        (("--topic", "audit"), "report: --kafka-bootstrap and --topic go together"),
        (("--kafka-bootstrap", "127.0.0.1:1", "--topic", "a/b"), "report: --kafka-bootstrap/--topic kafka://"),
    ],
)
def test_bad_options_are_one_line_before_spark_starts(
    argv: tuple[str, ...], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert report_command(*argv, "--out", str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert err.startswith(said) and err.count("\n") == 1, err


def test_since_skips_records_produced_before_it_in_kafka(spark: Any, fleet_topic: Any, tmp_path: Path) -> None:
    """With --since each partition starts at its first record (by Kafka's timestamp) an hour before it:
    records produced earlier are not read at all, whatever they hold."""
    from pipeline.topic import parse_topic, topic_lines

    url, _ = fleet_topic
    source = parse_topic(url)
    since = time.time() - 2 * DAY  # within the topic's retention (7 days by default)
    producer = Producer({"bootstrap.servers": source.bootstrap})
    for name, at in (("early", since - 7200), ("slack", since - 1800), ("late", since + 60), ("{\r\n}", since)):
        producer.produce("stamped", value=name.encode(), timestamp=int(at * 1000))
    assert producer.flush(30) == 0
    del producer
    stamped = parse_topic(f"kafka://{source.bootstrap}/stamped")
    everything = topic_lines(spark, stamped, str(tmp_path / "all"))
    # A value with line breaks (JSON pretty-printed) stays one line
    assert sorted(_values(everything)) == ["early", "late", "slack", "{  }"]
    assert sorted(_values(topic_lines(spark, stamped, str(tmp_path / "since"), since))) == ["late", "slack", "{  }"]
    assert set(everything.values()) == {f"{stamped.url} partition 0"}


def _values(files: dict[str, str]) -> list[str]:
    return [line for file in files for line in Path(file).read_text().splitlines()]
