"""Reading audit events: the Spark schema is the JSON Schema's, the synthetic
fleet follows the JSON Schema exactly, and every line that is not a valid
version-2 event is counted and listed per file without stopping the job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BooleanType, DataType, DoubleType, LongType, StringType, StructType

from pipeline.events import (
    EVENT_SCHEMA,
    EventsPathError,
    InputFile,
    Inputs,
    find_inputs,
    read_evidence,
    write_parquet,
)

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILE = ROOT / "schema" / "audit-event-v2.schema.json"

pytestmark = pytest.mark.spark


def _spark_type(prop: dict[str, Any], defs: dict[str, Any]) -> DataType:
    """A JSON Schema property as the Spark type it must be read as."""
    if "$ref" in prop:
        return _spark_type(defs[prop["$ref"].rsplit("/", 1)[1]], defs)
    if "const" in prop:
        return LongType() if isinstance(prop["const"], int) else StringType()
    if "enum" in prop:
        kinds = {type(v) for v in prop["enum"] if v is not None}
        assert kinds == {str}, prop
        return StringType()
    types = prop["type"] if isinstance(prop["type"], list) else [prop["type"]]
    (kind,) = [t for t in types if t != "null"]
    if kind == "array":
        item = prop["items"]
        return ArrayType(
            StructType(
                [
                    *(f for f in _struct(item["properties"], defs).fields),
                ]
            )
        )
    return {"string": StringType(), "integer": LongType(), "number": DoubleType(), "boolean": BooleanType()}[kind]


def _struct(props: dict[str, Any], defs: dict[str, Any]) -> StructType:
    from pyspark.sql.types import StructField

    return StructType([StructField(name, _spark_type(p, defs)) for name, p in props.items()])


def test_spark_schema_has_every_json_schema_property_with_its_type() -> None:
    doc = json.loads(SCHEMA_FILE.read_text())
    defs = doc["$defs"]
    expected: dict[str, DataType] = {}
    for props in (doc["properties"], *(defs[k]["properties"] for k in ("decision", "connection", "window"))):
        for name, prop in props.items():
            spark_type = _spark_type(prop, defs)
            assert expected.setdefault(name, spark_type) == spark_type, f"{name} has two types in the JSON Schema"
    actual = {f.name: f.dataType for f in EVENT_SCHEMA.fields}
    assert set(actual) == set(expected), set(actual) ^ set(expected)
    for name, spark_type in expected.items():
        if isinstance(spark_type, ArrayType):  # field order inside the struct does not matter
            assert sorted(map(str, spark_type.elementType.fields)) == sorted(map(str, actual[name].elementType.fields))
        else:
            assert actual[name] == spark_type, name


def test_every_generated_event_follows_the_json_schema(fleet: Any) -> None:
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text()))
    valid = invalid = 0
    for file in sorted(fleet.path.iterdir()):
        for line in file.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                invalid += 1
                continue
            if validator.is_valid(event):
                valid += 1
            else:
                invalid += 1
    assert valid == fleet.truth.events
    assert invalid == fleet.truth.malformed + fleet.truth.v1 + len(fleet.truth.partial_files)


def test_bad_lines_are_counted_per_file_by_kind_and_the_rest_is_read(spark: Any, tmp_path: Path) -> None:
    good = {
        "schema_version": 2,
        "type": "window",
        "ts": 10.0,
        "instance": "p1",
        "section": "pool",
        "window_start": 0.0,
        "window_seconds": 10.0,
        "high_water_mark_bytes": 5,
    }
    a = tmp_path / "p1-1.jsonl"
    a.write_text(
        "\n".join(
            [
                json.dumps(good),
                "not json",
                '{"schema_version": 2, "type": "window", "ts": "yesterday", "instance": "p1"}',  # wrong type
                json.dumps({"schema_version": 1, "type": "identifier_breach", "ts": 1.0}),
                json.dumps({"schema_version": 3, "type": "window", "ts": 1.0, "instance": "p1"}),
                json.dumps({**good, "section": "nonsense"}),  # not a section of version 2
                json.dumps({"schema_version": 2, "type": "decision", "ts": 1.0, "instance": "p1"}),  # no policy
                "",
                json.dumps(good),
            ]
        )
        + "\n"
    )
    b = tmp_path / "p1-2.jsonl"
    b.write_text(json.dumps(good) + "\n" + '{"schema_version":2,"type":"win')  # a writer is on this line
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / ".p1-3.jsonl.tmp").write_text("hidden files are not read\n")

    inputs = find_inputs([str(tmp_path)])
    evidence = read_evidence(spark, inputs, str(tmp_path / "_scratch"))
    assert evidence.events.count() == 3
    found = {(Path(p.file).name, p.problem, p.detail): p.lines for p in evidence.problems}
    assert found == {
        ("p1-1.jsonl", "malformed", "not a JSON object of the v2 types"): 2,
        ("p1-1.jsonl", "unknown_version", "schema_version 1"): 1,
        ("p1-1.jsonl", "unknown_version", "schema_version 3"): 1,
        ("p1-1.jsonl", "invalid", "section nonsense"): 1,
        ("p1-1.jsonl", "invalid", "decision without policy"): 1,
        ("p1-2.jsonl", "half_written", "last line incomplete: a writer is on this file"): 1,
        ("empty.jsonl", "empty", "no lines"): 0,
    }
    samples = {p.sample for p in evidence.problems}
    assert "not json" in samples


def test_a_file_rotated_away_between_listing_and_reading_is_listed_not_fatal(spark: Any, tmp_path: Path) -> None:
    line = json.dumps(
        {
            "schema_version": 2,
            "type": "connection",
            "ts": 1.0,
            "instance": "p",
            "event": "open",
            "conn_id": "c1",
            "listener": "l",
            "client_address": "10.0.0.1:5000",
            "tls": False,
        }
    )
    (tmp_path / "kept.jsonl").write_text(line + "\n")
    (tmp_path / "rotated.jsonl").write_text(line + "\n")
    inputs = find_inputs([str(tmp_path)])
    (tmp_path / "rotated.jsonl").unlink()  # the proxy's disk bound deleted it
    evidence = read_evidence(spark, inputs, str(tmp_path / "_scratch"))
    assert evidence.events.count() == 1
    (problem,) = evidence.problems
    assert (Path(problem.file).name, problem.problem) == ("rotated.jsonl", "unreadable")
    assert "vanished" in problem.detail


def test_a_missing_events_path_is_one_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(EventsPathError, match=r"--events .*nowhere: no such file or directory"):
        find_inputs([str(tmp_path / "nowhere")])


def test_parquet_conversion_keeps_every_event_and_the_input_problems(spark: Any, fleet: Any, tmp_path: Path) -> None:
    evidence = read_evidence(spark, find_inputs([str(fleet.path)]), str(tmp_path / "scratch"), schema=EVENT_SCHEMA)
    write_parquet(evidence, str(tmp_path / "pq"))
    again = read_evidence(spark, find_inputs([str(tmp_path / "pq")]), str(tmp_path / "scratch2"), schema=EVENT_SCHEMA)
    assert again.events.count() == fleet.truth.events
    assert sorted(again.events.columns) == sorted(EVENT_SCHEMA.fieldNames())
    totals = [F.sum("bytes_in"), F.sum("duration_seconds"), F.max("max_members")]  # fields the report does not read
    assert again.events.agg(*totals).collect() == evidence.events.agg(*totals).collect()
    assert again.overview == evidence.overview
    by_type = {r["type"]: r["count"] for r in again.events.groupBy("type").count().collect()}
    assert by_type == dict(fleet.truth.by_type)
    assert again.problems == evidence.problems
    assert sum(p.lines for p in again.problems) == fleet.truth.malformed + fleet.truth.v1 + 1


def test_json_lines_count_for_the_jvm_as_the_parquet_they_become(tmp_path: Path) -> None:
    """The report's JIT choice (pipeline.session.SHORT_JOB_BYTES) weighs what the JVM will read."""
    part = tmp_path / "pq" / "type=window"
    part.mkdir(parents=True)
    (part / "part-0.parquet").write_bytes(b"x" * 1000)
    inputs = Inputs(
        json_files=(InputFile("a.jsonl", 2_000_000, False), InputFile("b.jsonl.gz", 300_000, False)),
        parquet_dirs=(str(tmp_path / "pq"),),
    )
    assert inputs.total_bytes == 2_301_000
    assert inputs.parquet_bytes == 100_000 + 200_000 + 1000
