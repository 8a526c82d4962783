"""JSON lines parsed by pyarrow in Spark tasks (pipeline.json_lines) read as Spark's own JSON reader reads
them: the oracle here is ``spark.read.json`` with the report's rules, over a file of odd lines (wrong
types, duplicate keys, Spark's lenient forms, blank lines, two objects on a line, a line cut off). The same
valid events come out, and every other line is named by the same rule, gzip or not, whatever the blocks
the file is parsed in."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StringType, StructField, StructType

from pipeline import events as ev
from pipeline import json_lines
from pipeline.events import EVENT_SCHEMA, REPORT_SCHEMA, find_inputs, read_evidence

pytestmark = pytest.mark.spark

GOOD = {
    "schema_version": 2,
    "type": "window",
    "ts": 1.0,
    "instance": "p",
    "section": "client_api",
    "window_start": 0.0,
    "window_seconds": 60.0,
    "client_id": "c",
    "api": "produce",
    "requests": 5,
    "max_request_bytes": 100,
    "max_response_bytes": 50,
}


def _with(**changes: Any) -> str:
    return json.dumps({**GOOD, **changes}, ensure_ascii=False)


def _raw(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new)


ODD_LINES = [
    _with(),
    _raw(_with(), '"schema_version": 2', '"schema_version": 2.0'),  # a float for a long
    _with(schema_version="2"),
    _with(ts=5),  # an int for a double: fine for both
    _with(ts="5"),
    _with(client_id=123),  # Spark keeps the number's text; pyarrow refuses
    _with(client_id={"a": 1}),
    _with(client_id=[1]),
    _raw(_with(), '"client_id": "c"', '"client_id": "c", "client_id": "d"'),  # a duplicate key
    _raw(_with(), '"requests": 5', '"requests": 1e3'),
    _raw(_with(), '"requests": 5', '"requests": 99999999999999999999'),
    _with(client_id='\u00e9\U0001f600 \\ " /'),
    _raw(_with(), '"ts": 1.0', '"ts": NaN'),  # not JSON, but Spark's reader takes it
    _raw(_with(), '"client_id": "c"', "'client_id': 'c'"),  # single quotes: Spark takes them
    _raw(_with(), '"requests": 5', '"requests": 007'),
    _with(requests=None),
    _with(section="nonsense"),
    _with(schema_version=1),
    _with(type="windowz"),
    json.dumps({k: v for k, v in GOOD.items() if k != "window_start"}),
    _with(mode="sometimes"),
    _with(extra={"x": [1, {"y": 2}]}, breaches=[{"kind": "client_id", "path": "x", "length": 3, "limit": 2}]),
    _with(breaches=[{"kind": "client_id", "length": "3"}]),  # a string for a long, inside a list
    _with(breaches=[None, {}]),
    json.dumps(
        {
            "schema_version": 2,
            "type": "decision",
            "ts": 1.0,
            "instance": "p",
            "policy": "x",
            "mode": "observe",
            "action": "refuse",
            "reason": "r",
            "limit_key": "k",
            "limit": 3,
            "client_id": "c",
        }
    ),
    json.dumps(
        {
            "schema_version": 2,
            "type": "connection",
            "ts": 2.0,
            "instance": "p",
            "event": "open",
            "conn_id": "c1",
            "listener": "l",
            "client_address": "10.0.0.1:1",
            "tls": "true",
        }
    ),
    "",
    "   ",
    _with() + _with(),  # two objects on one line
    "[1, 2, 3]",
    "null",
    "{not json",
    _with() + " trailing",
    _with(type=None),
    _with(instance=""),
    _with(),
]


def _rows(frame: Any, schema: StructType = REPORT_SCHEMA) -> list[tuple[Any, ...]]:
    """Rows to compare: NaN (Spark's reader takes it) equals NaN here."""
    rows = [tuple("NaN" if v != v else v for v in r) for r in frame.select(*schema.fieldNames()).collect()]
    return sorted(rows, key=repr)


def _oracle(
    spark: Any, path: Path, fields: StructType = REPORT_SCHEMA
) -> tuple[list[tuple[Any, ...]], dict[tuple[str, str], int]]:
    """The valid events and the problems, as Spark's own JSON reader and the report's rules find them."""
    rules = ev._rules()
    schema = StructType([*fields.fields, StructField(ev._CORRUPT, StringType())])
    raw = (
        spark.read.schema(schema)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", ev._CORRUPT)
        .json(str(path))
        .cache()
    )
    valid = raw.filter(ev._valid(rules))
    named = raw.filter(~ev._valid(rules)).select(
        ev._first_broken(rules).alias("_rule"), *[F.col(n).alias(f"_bad_{n}") for n in ev._NAMED]
    )
    problems: dict[tuple[str, str], int] = {}
    for row in named.collect():
        key = ev._problem_of(rules, row)
        problems[key] = problems.get(key, 0) + 1
    return _rows(valid, fields), problems


def _read(
    spark: Any, path: Path, scratch: Path, schema: StructType = REPORT_SCHEMA
) -> tuple[list[tuple[Any, ...]], dict[tuple[str, str], int], Any]:
    evidence = read_evidence(spark, find_inputs([str(path)]), str(scratch), schema)
    rows = _rows(evidence.events, schema)
    problems = {(p.problem, p.detail): p.lines for p in evidence.problems}
    return rows, problems, evidence


@pytest.mark.parametrize("schema", [REPORT_SCHEMA, EVENT_SCHEMA], ids=["report", "every field"])
def test_odd_lines_read_as_spark_reads_them(spark: Any, tmp_path: Path, schema: StructType) -> None:
    path = tmp_path / "in" / "odd.jsonl"
    path.parent.mkdir()
    path.write_text("\n".join(ODD_LINES) + "\n" + _with()[:40])  # the last line cut off, no newline
    expected_rows, expected_problems = _oracle(spark, path, schema)
    rows, problems, evidence = _read(spark, path, tmp_path / "scratch", schema)
    assert rows == expected_rows
    # Spark's lenient forms are valid events to it, and so to the report: NaN, single quotes, the number's text
    assert len(rows) >= 6
    assert problems.pop(("half_written", "last line incomplete: a writer is on this file")) == 1
    expected_problems[("malformed", "not a JSON object of the v2 types")] -= 1  # the cut-off line, named above
    assert problems == {k: v for k, v in expected_problems.items() if v}
    non_blank = sum(1 for line in ODD_LINES if line.strip()) + 1
    assert evidence.lines_per_file == {str(path): non_blank}


def test_gzip_and_many_blocks_read_the_same(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [_with(client_id=f"c{n}", requests=n) for n in range(3000)]
    for n, odd in enumerate(ODD_LINES):  # odd lines spread through the file, several per block below
        lines.insert(n * 97, odd)
    text = "\n".join(lines) + "\n"
    plain = tmp_path / "plain" / "f.jsonl"
    plain.parent.mkdir()
    plain.write_text(text)
    packed = tmp_path / "packed" / "f.jsonl.gz"
    packed.parent.mkdir()
    packed.write_bytes(gzip.compress(text.encode()))
    rows, problems, _ = _read(spark, plain, tmp_path / "s1")
    assert len(rows) > 3000
    assert _read(spark, packed, tmp_path / "s2")[:2] == (rows, problems)
    # Parsed in blocks of ~1 KB rather than 4 MiB (in this process: the tasks above ran in Spark's),
    # the same events are written and the same lines refused.
    arrow = to_arrow_schema(REPORT_SCHEMA)
    outcome = []
    for block, target in ((json_lines._BLOCK, tmp_path / "whole"), (1000, tmp_path / "small")):
        monkeypatch.setattr(json_lines, "_BLOCK", block)
        (done,) = json_lines._convert_files(0, [(0, str(plain))], str(target), arrow, ev.CONTRACT)
        written = ds.dataset(target / "events", format="parquet", partitioning="hive").to_table()
        refused = sorted((target / "refused" / "part-00000.jsonl").read_bytes().splitlines())
        index, wrote, _, lines_read = done
        client_ids = sorted(written.column("client_id").to_pylist())
        outcome.append(((index, wrote, lines_read), written.num_rows, client_ids, refused))
    assert outcome[0] == outcome[1]
    (_, _, lines_read), written_rows, _, refused = outcome[0]
    assert lines_read == written_rows + len(refused) == sum(1 for line in lines if line.strip())
    # The refused lines Spark's reader takes as events (single quotes, a number for a string, ...) make up the rest.
    taken_by_spark, _ = _oracle(spark, tmp_path / "whole" / "refused" / "part-00000.jsonl")
    assert written_rows + len(taken_by_spark) == len(rows) and taken_by_spark


MORE_ODD = [
    "null",
    " null",
    "1",
    "true",
    '"s"',
    "[]",
    "{}",
    "{",
    '{"a":',
    '{"breaches":[null]}',
    "\t",
    "\r",
    "{" * 200 + "}" * 200,
    "\ufeff{}",
    "{}\r",
    " " + _with(client_id="indented"),
]


def _split(piece: bytes) -> list[bytes]:
    return piece.removesuffix(b"\n").split(b"\n")


@pytest.mark.parametrize("seed", range(3))
def test_every_line_is_one_row_or_refused_whatever_its_neighbours(seed: int) -> None:
    """Blocks of odd lines in random order: each non-blank line is either one parsed row (its own: a blank
    line beside two objects on one line once shifted a row onto the wrong line) or refused, as it was."""
    rng = random.Random(seed)
    arrow = to_arrow_schema(REPORT_SCHEMA)
    pool = [*ODD_LINES, *MORE_ODD]
    for _ in range(200):
        lines = [rng.choice(pool) for _ in range(rng.randint(1, 12))]
        block = ("\n".join(lines) + rng.choice(["", "\n"])).encode()
        parsed: list[Any] = []
        refused: list[bytes] = []
        json_lines._parse(block, arrow, parsed, refused)
        kept = [line for table, piece in parsed for line in _split(piece)]
        assert sum(t.num_rows for t, _ in parsed) == len(kept)
        assert sorted(kept + [r.rstrip(b"\n") for r in refused]) == sorted(
            line.encode() for line in "\n".join(lines).split("\n") if line.strip()
        )
        for table, piece in parsed:
            ids = [json.loads(line).get("client_id") for line in _split(piece)]
            assert table.column("client_id").to_pylist() == ids
