"""The proxies' audit events in Spark: the explicit schema of
``schema/audit-event-v2.schema.json``, JSON-line and Parquet inputs, and an
account of every line that is not a valid version-2 event.

A line that is not JSON, a version other than 2, an event missing what its kind
requires, a file whose writer is in the middle of a line, a file that vanished
(rotated away) or cannot be read: each is counted and listed per file, never
fatal. The schema is given to Spark, not inferred, so the files are parsed once.
"""

from __future__ import annotations

import json
import math
import operator
import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property, reduce
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from . import json_lines

__all__ = [
    "EVENT_SCHEMA",
    "REPORT_SCHEMA",
    "SCHEMA_VERSION",
    "EventsPathError",
    "Evidence",
    "InputProblem",
    "Inputs",
    "Overview",
    "between",
    "find_inputs",
    "local_frame",
    "proxy_of",
    "read_evidence",
    "relabelled",
    "write_parquet",
]

SCHEMA_VERSION = 2
PROBLEMS_FILE = "_input_problems.json"  # next to converted Parquet; Spark skips names starting with "_"
_CORRUPT = "_corrupt_record"
_TAIL_BYTES = 1 << 16


def _schema(*fields: tuple[str, DataType]) -> StructType:
    return StructType([StructField(name, kind, nullable=True) for name, kind in fields])


_S, _L, _D, _B = StringType(), LongType(), DoubleType(), BooleanType()

# Every property of the three kinds (decision, connection, window), one column each;
# a name shared by kinds has one type in all of them. tests/pipeline checks this
# against the JSON Schema file, so the two cannot drift apart.
EVENT_SCHEMA = _schema(
    ("schema_version", _L),
    ("type", _S),
    ("ts", _D),
    ("instance", _S),
    ("proxy", _S),  # workers: N: a worker's events name their proxy (its instance is <proxy>-w<index>)
    # decision
    ("policy", _S),
    ("mode", _S),
    ("action", _S),
    ("reason", _S),
    ("limit_key", _S),
    ("limit", _L),
    ("listener", _S),
    ("client_address", _S),
    ("ip", _S),
    ("client_id", _S),
    ("conn_id", _S),
    ("tls", _B),
    ("api", _S),
    ("api_key", _L),
    ("api_version", _L),
    ("correlation_id", _L),
    ("error_code", _L),
    ("group_id", _S),
    ("member_id", _S),
    ("identifier_kind", _S),
    ("identifier_length", _L),
    ("identifier", _S),
    ("breaches", ArrayType(_schema(("kind", _S), ("path", _S), ("length", _L), ("limit", _L)))),
    ("size", _L),
    ("used", _L),
    ("capacity", _L),
    ("upstream", _S),
    ("direction", _S),
    # connection
    ("event", _S),
    ("open_connections", _L),
    ("open_ssl_connections", _L),
    ("open_ip_connections", _L),
    ("node_id", _L),
    ("duration_seconds", _D),
    ("requests", _L),
    ("bytes_in", _L),
    ("bytes_out", _L),
    ("passthrough", _B),
    # window
    ("section", _S),
    ("window_start", _D),
    ("window_seconds", _D),
    ("max_request_bytes", _L),
    ("max_response_bytes", _L),
    ("group_kind", _S),
    ("max_members", _L),
    ("capacity_bytes", _L),
    ("high_water_mark_bytes", _L),
    ("waits", _L),
    ("max_open", _L),
    ("opened", _L),
    ("closed", _L),
    ("max_length", _L),
    ("overflow", _B),
    ("overflow_cap", _S),
)
EVENT_COLUMNS = tuple(EVENT_SCHEMA.fieldNames())
# What the report reads: the contract's other fields (API keys and versions, error codes,
# breaches, byte totals, durations) feed no table or plot, and parsing fewer fields is
# most of what reading JSON costs. --to-parquet keeps every field.
_UNREAD = {
    "api_key",
    "api_version",
    "correlation_id",
    "error_code",
    "member_id",
    "breaches",
    "upstream",
    "direction",
    "duration_seconds",
    "bytes_in",
    "bytes_out",
    "opened",
    "closed",
    "overflow",
    "overflow_cap",
    "ip",
    "used",
    "capacity",
    # pyarrow's parse costs about the same for each column of the schema, present in a line or not
    # (~30 ns a line each): these two, 3% of it (bench/RESULTS.md)
    "node_id",
    "passthrough",
}
REPORT_SCHEMA = StructType([f for f in EVENT_SCHEMA.fields if f.name not in _UNREAD])
REPORT_COLUMNS = tuple(REPORT_SCHEMA.fieldNames())
KINDS = ("decision", "connection", "window")
SECTIONS = ("client_api", "group", "pool", "connections", "identifier")
# What each kind must carry (the JSON Schema's "required"), beyond schema_version, type, ts, instance.
_REQUIRED = {
    "decision": ("policy", "mode", "action", "reason", "limit_key"),
    "connection": ("event", "conn_id", "listener", "client_address", "tls"),
    "window": ("section", "window_start", "window_seconds"),
}
_ENUMS = {
    "mode": ("enforce", "observe"),
    "action": ("refuse", "wait", "evict", "close", "throttle"),
    "event": ("open", "close"),
    "section": SECTIONS,
}
# The rules above as data, for the Spark tasks that convert JSON lines (pipeline.json_lines)
CONTRACT = json_lines.Contract(SCHEMA_VERSION, ("ts", "instance"), _REQUIRED, _ENUMS, SECTIONS)


def proxy_of() -> Column:
    """The proxy an event is of: ``proxy`` on a worker's events (``workers: N``: each worker is an
    audit instance of its own, ``<proxy>-w<index>``), else its ``instance``. The report counts,
    covers and peaks per proxy, so a proxy with N workers is one proxy, not N."""
    return F.coalesce(F.col("proxy"), F.col("instance"))


class EventsPathError(ValueError):
    """An ``--events`` path that cannot be read; the message names it."""


@dataclass(frozen=True)
class InputFile:
    path: str
    size: int
    half_written: bool  # its last line has no newline and is not a complete event: a writer is on it


@dataclass(frozen=True)
class Inputs:
    json_files: tuple[InputFile, ...]
    parquet_dirs: tuple[str, ...]
    empty_files: tuple[str, ...] = ()

    @property
    def total_bytes(self) -> int:
        """Bytes of every input file (JSON lines and Parquet)."""
        return sum(f.size for f in self.json_files) + self._parquet_dir_bytes()

    @property
    def parquet_bytes(self) -> int:
        """About what these events take as Parquet, which is what Spark's JVM reads: JSON lines are
        converted in Python tasks first (pipeline.json_lines). 10 million synthetic events: 3,151.8 MB
        of JSON lines, 151 MB as Parquet; gzip shrinks the same lines 13.7 times."""
        converted = sum(f.size * 2 // 3 if f.path.endswith(".gz") else f.size // 20 for f in self.json_files)
        return converted + self._parquet_dir_bytes()

    def _parquet_dir_bytes(self) -> int:
        return sum(
            (Path(root) / name).stat().st_size
            for directory in self.parquet_dirs
            for root, _, names in os.walk(directory)
            for name in names
        )

    @property
    def described(self) -> str:
        size = sum(f.size for f in self.json_files)
        parts = []
        if self.json_files:
            parts.append(f"{len(self.json_files)} JSON-line files ({size / 1e6:,.1f} MB)")
        if self.parquet_dirs:
            parts.append(f"{len(self.parquet_dirs)} Parquet directories")
        return " and ".join(parts) or "no files"


@dataclass(frozen=True)
class InputProblem:
    """Lines of one file that are not valid version-2 events, of one kind."""

    file: str
    problem: str  # malformed | unknown_version | invalid | half_written | unreadable
    detail: str
    lines: int
    sample: str = ""


_NICE_STEPS = (1, 5, 10, 15, 30, 60, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 604800)
MAX_BUCKETS = 360


@dataclass(frozen=True)
class Overview:
    """How many valid events of each kind, from which proxies, over which span of time."""

    events: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)  # "decision", "connection", "window/<section>"
    instances: tuple[str, ...] = ()
    first_ts: float | None = None
    last_ts: float | None = None
    window_seconds: float | None = None

    @property
    def bucket_seconds(self) -> int:
        """A round time step that cuts the span into at most ``MAX_BUCKETS`` buckets (at least a window)."""
        span = (self.last_ts or 0.0) - (self.first_ts or 0.0)
        floor = max(self.window_seconds or 1.0, span / MAX_BUCKETS)
        return next((s for s in _NICE_STEPS if s >= floor), _NICE_STEPS[-1])

    @staticmethod
    def of(rows: Iterable[Any]) -> Overview:
        """From rows with type, section, instance, n, first, last, window_seconds (any grouping finer than that)."""
        by_kind: dict[str, int] = {}
        firsts, lasts, windows = [], [], []
        instances: set[str] = set()
        for r in rows:
            kind = r["type"] if r["section"] is None else f"{r['type']}/{r['section']}"
            by_kind[kind] = by_kind.get(kind, 0) + int(r["n"])
            firsts += [r["first"]] if r["first"] is not None else []
            lasts += [r["last"]] if r["last"] is not None else []
            windows += [r["window_seconds"]] if r["window_seconds"] is not None else []
            if r["instance"] is not None:
                instances.add(r["instance"])
        return Overview(
            events=sum(by_kind.values()),
            by_kind=dict(sorted(by_kind.items())),
            instances=tuple(sorted(instances)),
            first_ts=min(firsts) if firsts else None,
            last_ts=max(lasts) if lasts else None,
            window_seconds=max(windows) if windows else None,
        )

    def merged(self, other: Overview) -> Overview:
        by_kind = dict(self.by_kind)
        for kind, n in other.by_kind.items():
            by_kind[kind] = by_kind.get(kind, 0) + n

        def pick(f: Any, *values: float | None) -> float | None:
            known = [v for v in values if v is not None]
            return f(known) if known else None

        return Overview(
            events=self.events + other.events,
            by_kind=dict(sorted(by_kind.items())),
            instances=tuple(sorted({*self.instances, *other.instances})),
            first_ts=pick(min, self.first_ts, other.first_ts),
            last_ts=pick(max, self.last_ts, other.last_ts),
            window_seconds=pick(max, self.window_seconds, other.window_seconds),
        )


def _tally() -> list[Column]:
    """The aggregates :meth:`Overview.of` reads, over a group of events (grouped by type, section and
    instance at least)."""
    return [
        F.count(F.lit(1)).alias("n"),
        F.min("ts").alias("first"),
        F.max("ts").alias("last"),
        F.max("window_seconds").alias("window_seconds"),
    ]


# Spark's log2(x) is StrictMath.log(x) / StrictMath.log(2), two calls of the JDK's software logarithm per
# row; ln(x) over this constant (the same double as StrictMath.log(2)) gives the same quotient with one.
# 10 million events: the bulk windows' counts 2.7-2.8 -> 2.5-2.6 s of JVM CPU, warm; equal buckets for every
# integer to 2^22 and 2^k - 1, 2^k, 2^k + 1 to 2^62 (bench/RESULTS.md).
_LN_2 = math.log(2)


def size_bucket(size: Column) -> Column:
    """k such that 2^(k-1) <= size < 2^k (0 for 0): Python's ``int.bit_length``."""
    return F.when(size <= 0, 0).otherwise(F.floor(F.ln(size) / F.lit(_LN_2)) + 1).cast("int")


# The observation windows most events are (one per client id and API, one per identifier kind
# and client, per window): their queries read their own section (a Parquet partition, or the cached
# batches of JSON lines, kept in kind order: _cache_order); every other query reads the rest, cached
# apart after the first such query, a tenth of the events or less.
BULK_SECTIONS = ("client_api", "identifier")


def _is_rest() -> Column:
    """A valid event that is not a window of :data:`BULK_SECTIONS`, said with =, IN and OR: Spark skips
    the cached batches whose values rule those out, where a NOT is evaluated row by row."""
    others = [s for s in SECTIONS if s not in BULK_SECTIONS]
    return F.col("type").isin(*(k for k in KINDS if k != "window")) | F.col("section").isin(*others)


@dataclass(frozen=True)
class Evidence:
    """The valid version-2 events, what was wrong with the rest, and an overview."""

    events: DataFrame
    problems: tuple[InputProblem, ...] = ()
    files_read: int = 0
    lines_per_file: dict[str, int] = field(default_factory=dict)
    # A directory holding exactly these events as Parquet partitioned by kind and section (JSON lines
    # converted in Spark's tasks): --to-parquet copies it into place rather than writing it again.
    parquet_root: str | None = None

    @cached_property
    def overview(self) -> Overview:
        """How many valid events of each kind, from which proxies, over which span of time: the rest
        counted by a query of its own, the bulk windows by :attr:`bulk_counts` on its way (10 million
        events from JSON lines: counting every line per file and kind as it was parsed was 14 s of the
        read; per file alone, under 1 s)."""
        tally = self.rest.groupBy("type", "section", proxy_of().alias("instance")).agg(*_tally())
        return Overview.of(tally.collect()).merged(Overview.of(self.bulk_counts))

    @cached_property
    def bulk_counts(self) -> list[Any]:
        """The bulk windows counted in one scan of each section: per section, proxy, size buckets of the
        largest request and response (``rq``, ``rs``: :func:`size_bucket`), identifier kind and longest
        length, a few thousand rows with the overview's tally (``n``, ``first``, ``last``,
        ``window_seconds``) and the largest request and response (``rq_max``, ``rs_max``). The size and
        identifier histograms and the overview of 9 events in 10 come from it (10 million
        events: three scans of the bulk windows were 12 s of CPU, these two 7 s)."""
        tally = [
            *_tally(),
            F.max("max_request_bytes").alias("rq_max"),
            F.max("max_response_bytes").alias("rs_max"),
        ]
        none = F.lit(None)

        def section(name: str) -> list[Column]:
            # the same for every row of the scan: named after it, not hashed per row (10 million events:
            # 4.6-4.9 -> 3.9-4.5 s of JVM CPU for the client_api windows, warm)
            return [F.lit("window").alias("type"), F.lit(name).alias("section")]

        # One aggregate per section, with the other section's keys null: a single one over both, keyed by
        # all of them, took twice the CPU.
        sizes = (
            self.windows("client_api")
            .groupBy(
                proxy_of().alias("instance"),
                size_bucket(F.col("max_request_bytes")).alias("rq"),
                size_bucket(F.col("max_response_bytes")).alias("rs"),
            )
            .agg(*tally)
            .select(*section("client_api"), "*", none.alias("identifier_kind"), none.alias("max_length"))
        )
        lengths = (
            self.windows("identifier")
            .groupBy(proxy_of().alias("instance"), "identifier_kind", "max_length")
            .agg(*tally)
            .select(*section("identifier"), "*", none.alias("rq"), none.alias("rs"))
        )
        return [*sizes.collect(), *lengths.collect()]

    @cached_property
    def rest(self) -> DataFrame:
        """Every event but the windows of :data:`BULK_SECTIONS`. Not cached: read from its partitions (kind
        and section) by column, it is cheaper than filling a cache (10 million events: the cache of these
        817,000 took 10 s to fill, longer than every query over it)."""
        return self.events.filter(_is_rest())

    @property
    def decisions(self) -> DataFrame:
        return self.rest.filter(F.col("type") == "decision")

    @property
    def connections(self) -> DataFrame:
        return self.rest.filter(F.col("type") == "connection")

    def windows(self, *sections: str) -> DataFrame:
        """The windows of ``sections`` (one scan for several)."""
        source = self.events if set(sections) & set(BULK_SECTIONS) else self.rest
        return source.filter((F.col("type") == "window") & F.col("section").isin(*sections))

    @property
    def problem_lines(self) -> int:
        return sum(p.lines for p in self.problems)


def _is_hidden(name: str) -> bool:
    return name.startswith((".", "_"))


def _half_written(path: Path, size: int) -> bool:
    """True when the file does not end with a newline and its last line is no complete JSON object."""
    if size == 0 or path.name.endswith(".gz"):
        return False
    with path.open("rb") as f:
        f.seek(max(0, size - _TAIL_BYTES))
        tail = f.read(_TAIL_BYTES)
    if tail.endswith(b"\n"):
        return False
    last = tail.rsplit(b"\n", 1)[-1]
    try:
        return not isinstance(json.loads(last), dict)
    except ValueError:
        return True


def _holds_parquet(path: Path) -> bool:
    if path.is_file():
        return path.name.endswith(".parquet")
    return any(name.endswith(".parquet") for _, _, names in os.walk(path) for name in names)


def find_inputs(paths: Sequence[str]) -> Inputs:
    """Sort ``--events`` paths into JSON-line files and Parquet directories.

    A directory holding ``*.parquet`` files is read as Parquet (what ``--to-parquet``
    writes); anything else as JSON lines (``.gz`` too), walking directories and
    skipping names starting with ``.`` or ``_``, as Spark does.
    """
    json_files: list[InputFile] = []
    parquet: list[str] = []
    empty: list[str] = []
    for raw in paths:
        path = Path(raw).resolve()
        if not path.exists():
            raise EventsPathError(f"--events {raw}: no such file or directory")
        if not os.access(path, os.R_OK):
            raise EventsPathError(f"--events {raw}: not readable")
        if _holds_parquet(path):
            parquet.append(str(path))
            continue
        if path.is_file():
            candidates = [path]
        else:
            candidates = []
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not _is_hidden(d))
                candidates += [Path(root) / n for n in sorted(names) if not _is_hidden(n)]
        for file in candidates:
            size = file.stat().st_size
            if size == 0:
                empty.append(str(file))
            else:
                json_files.append(InputFile(str(file), size, _half_written(file, size)))
    return Inputs(tuple(json_files), tuple(parquet), tuple(empty))


@dataclass(frozen=True)
class _Rule:
    """A rule a version-2 line can break: its problem, and its detail (``{}``: the offending value)."""

    broken: Column
    problem: str
    detail: str
    value: str | None = None  # the column whose value the detail names


def _rules() -> list[_Rule]:
    """What can be wrong with a parsed line, in order: the first rule it breaks is its problem."""
    version, kind = F.col("schema_version"), F.col("type")
    return [
        _Rule(
            version.isNotNull() & (version != SCHEMA_VERSION), "unknown_version", "schema_version {}", "schema_version"
        ),
        _Rule(F.col(_CORRUPT).isNotNull(), "malformed", "not a JSON object of the v2 types"),
        _Rule(version.isNull(), "unknown_version", "schema_version missing"),
        _Rule(~kind.isin(*KINDS) | kind.isNull(), "invalid", "type {}", "type"),
        *[_Rule(F.col(name).isNull(), "invalid", f"no {name}") for name in CONTRACT.always],
        *[
            _Rule((kind == event_kind) & F.col(name).isNull(), "invalid", f"{event_kind} without {name}")
            for event_kind, names in _REQUIRED.items()
            for name in names
        ],
        *[
            _Rule(F.col(name).isNotNull() & ~F.col(name).isin(*allowed), "invalid", f"{name} {{}}", name)
            for name, allowed in _ENUMS.items()
        ],
    ]


def _first_broken(rules: Sequence[_Rule]) -> Column:
    """The index of the first rule a line breaks; null for a valid event. A small integer per bad line:
    the problem texts are made on the driver (texts built per line in generated code made reading
    several times slower)."""
    index = F.lit(None).cast("int")
    for n in reversed(range(len(rules))):
        index = F.when(rules[n].broken, F.lit(n)).otherwise(index)
    return index


def _problem_of(rules: Sequence[_Rule], row: Any) -> tuple[str, str]:
    rule = rules[row["_rule"]]
    if rule.value is None:
        return rule.problem, rule.detail
    value = row[f"_bad_{rule.value}"]
    return rule.problem, rule.detail.format("missing" if value is None else value)


# The values a problem's detail may name.
_NAMED = ("schema_version", "type", "mode", "action", "event", "section")


def _valid(rules: Sequence[_Rule]) -> Column:
    """True for a line that breaks none of ``rules``: one test per line. Which rule a bad line breaks
    is worked out for the few bad lines only (the first rule broken, worked out for every line, was
    a quarter of the read of 10 million events)."""
    return ~F.coalesce(reduce(operator.or_, [rule.broken for rule in rules]), F.lit(False))


def _read_json_lines(
    spark: SparkSession, inputs: Inputs, schema: StructType, scratch: str
) -> tuple[DataFrame, list[InputProblem], dict[str, int], str | None]:
    # Spark tasks turn the files into Parquet of their valid events in scratch (pipeline.json_lines) and
    # keep every other line as it was; Spark's JSON reader reads those, and the rules name what is wrong
    # with each. A file that is gone by then, or cannot be read, is listed below.
    present = [f.path for f in inputs.json_files if Path(f.path).exists()]
    converted = json_lines.convert(spark, present, scratch, schema, CONTRACT)
    lines = {present[n]: count for n, count in converted.lines.items()}
    alone = converted.parquet  # the Parquet holds every valid event, unless refused lines add some
    if converted.parquet:
        events = spark.read.schema(schema).option("basePath", converted.parquet).parquet(converted.parquet)
        events = events.select(*schema.fieldNames())
    else:
        events = local_frame(spark, [], schema)
    problems: dict[tuple[str, str, str], InputProblem] = {}
    if converted.refused:
        with_corrupt = StructType([*schema.fields, StructField(_CORRUPT, StringType())])
        rules = _rules()
        refused = (
            spark.read.schema(with_corrupt)
            .option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", _CORRUPT)
            .json(list(converted.refused))
            .select("*", json_lines.refused_file_index().alias(json_lines.FILE_COLUMN))
            # Kept in memory, every column parsed: uncached, Spark's reader parses only the columns a
            # query reads, so a line with a bad value in another column (a float for a long) would be
            # valid to the problems' query and malformed to the events'. Few lines (10 million events: 200).
            .cache()
        )
        # The refused lines per file, rule broken (null: none) and the values a problem names, with a
        # sample line: one query. Numbers and short values only: an aggregate of text (the sample line)
        # would make Spark sort every line.
        rule = _first_broken(rules)
        sample = F.substring(F.coalesce(F.col(_CORRUPT), F.to_json(F.struct("schema_version", "type"))), 1, 160)
        by = [F.col(json_lines.FILE_COLUMN), rule.alias("_rule"), *[F.col(n).alias(f"_bad_{n}") for n in _NAMED]]
        found = refused.groupBy(*by).agg(F.count(F.lit(1)).alias("lines"), F.min(sample).alias("sample")).collect()
        if any(row["_rule"] is None for row in found):
            # Lines pyarrow refused that are valid events to Spark's reader (its lenient forms, such as
            # single quotes) join the rest.
            events = events.unionByName(refused.filter(_valid(rules)).select(*schema.fieldNames()))
            alone = None
        for row in (row for row in found if row["_rule"] is not None):
            index_of = row[json_lines.FILE_COLUMN]
            path = present[index_of] if 0 <= index_of < len(present) else str(index_of)
            problem, detail = _problem_of(rules, row)
            seen = problems.get((path, problem, detail))
            problems[(path, problem, detail)] = InputProblem(
                path,
                problem,
                detail,
                row["lines"] + (seen.lines if seen else 0),
                min(row["sample"], seen.sample) if seen else row["sample"],
            )
    for f in inputs.json_files:
        if f.half_written:
            # Its unfinished last line was read as a malformed one: name it for what it is.
            key = (f.path, "malformed", "not a JSON object of the v2 types")
            bad = problems.get(key)
            if bad is not None:
                if bad.lines > 1:
                    problems[key] = InputProblem(f.path, bad.problem, bad.detail, bad.lines - 1, bad.sample)
                else:
                    del problems[key]
            problems[(f.path, "half_written", "")] = InputProblem(
                f.path, "half_written", "last line incomplete: a writer is on this file", 1
            )
        if f.path not in lines:
            reason = "vanished while read (rotated away?)" if not Path(f.path).exists() else "unreadable"
            problems[(f.path, "unreadable", reason)] = InputProblem(f.path, "unreadable", reason, 0)
    ordered = sorted(problems.values(), key=lambda p: (p.file, p.problem, p.detail))
    return events, ordered, lines, alone


def _read_parquet(spark: SparkSession, directory: str, schema: StructType) -> tuple[DataFrame, list[InputProblem]]:
    events = spark.read.schema(EVENT_SCHEMA).option("basePath", directory).parquet(directory)
    # Not cached: Parquet is read by column and by kind and section (its partitions), and
    # decoding the few columns a query needs is cheaper than keeping every column in memory.
    events = events.select(*schema.fieldNames())
    stored = Path(directory) / PROBLEMS_FILE
    problems = []
    if stored.is_file():
        problems = [InputProblem(**p) for p in json.loads(stored.read_text())]
    return events, problems


def read_evidence(spark: SparkSession, inputs: Inputs, scratch: str, schema: StructType = REPORT_SCHEMA) -> Evidence:
    """Read every input with ``schema`` (the report's columns by default; ``EVENT_SCHEMA`` keeps every
    field). JSON lines are converted into ``scratch`` first, a directory Spark's tasks can write and read
    that must outlive the Evidence."""
    frames: list[DataFrame] = []
    problems: list[InputProblem] = [InputProblem(p, "empty", "no lines", 0) for p in inputs.empty_files]
    lines: dict[str, int] = {}
    alone = None
    if inputs.json_files:
        events, found, lines, alone = _read_json_lines(spark, inputs, schema, scratch)
        frames.append(events)
        problems += found
    for directory in inputs.parquet_dirs:
        events, stored = _read_parquet(spark, directory, schema)
        frames.append(events)
        problems += stored
    if not frames:
        frames.append(local_frame(spark, [], schema))
    files = len(inputs.json_files) + len(inputs.parquet_dirs)
    root = alone if len(frames) == 1 else None
    return Evidence(union_all(frames), tuple(problems), files, lines, root)


def between(evidence: Evidence, since: float | None, until: float | None) -> Evidence:
    """The events of ``evidence`` from ``since`` (included) until ``until`` (not), by their own time
    (``ts``, Unix seconds; a window's is its end). Lines that are not events are listed still."""
    if since is None and until is None:
        return evidence
    ts = F.col("ts")
    kept = (ts >= F.lit(since) if since is not None else F.lit(True)) & (
        ts < F.lit(until) if until is not None else F.lit(True)
    )
    return replace(evidence, events=evidence.events.filter(kept), parquet_root=None)


def relabelled(evidence: Evidence, labels: dict[str, str]) -> Evidence:
    """``evidence`` with the input files of ``labels`` named by their labels (files written from a
    topic, named by its partition): their problems and lines are summed per label."""
    if not labels:
        return evidence
    problems: dict[tuple[str, str, str], InputProblem] = {}
    for p in evidence.problems:
        named = replace(p, file=labels.get(p.file, p.file))
        seen = problems.get((named.file, named.problem, named.detail))
        if seen is not None:
            named = replace(named, lines=seen.lines + named.lines, sample=min(seen.sample, named.sample))
        problems[(named.file, named.problem, named.detail)] = named
    lines: dict[str, int] = {}
    for path, count in evidence.lines_per_file.items():
        label = labels.get(path, path)
        lines[label] = lines.get(label, 0) + count
    ordered = tuple(sorted(problems.values(), key=lambda p: (p.file, p.problem, p.detail)))
    return replace(evidence, problems=ordered, lines_per_file=lines)


def write_parquet(evidence: Evidence, out: str) -> None:
    """Write the valid events as Parquet partitioned by kind and section, and the input problems beside them."""
    if evidence.parquet_root is not None:
        # Already so: copied, not written again by Spark (10 million events: 101 s -> 36-44 s)
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(evidence.parquet_root, out)
    else:
        evidence.events.write.mode("overwrite").partitionBy("type", "section").parquet(out)
    Path(out, PROBLEMS_FILE).write_text(json.dumps([p.__dict__ for p in evidence.problems], indent=1))


def union_all(frames: Iterable[DataFrame]) -> DataFrame:
    """One DataFrame of several with the same columns (by name)."""
    it = iter(frames)
    result = next(it)
    for frame in it:
        result = result.unionByName(frame)
    return result


def local_frame(spark: SparkSession, rows: Sequence[Sequence[Any]], schema: StructType) -> DataFrame:
    """A DataFrame of ``rows``, a few made on the driver, handed to the JVM as Arrow. From a list of
    tuples PySpark has the rows unpickled by a Python worker, which it starts for that: seconds of the
    demo's report (bench/RESULTS.md)."""
    arrow = to_arrow_schema(schema)
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema.fields]
    arrays = [pa.array(column, type=f.type) for column, f in zip(columns, arrow, strict=True)]
    return spark.createDataFrame(pa.Table.from_arrays(arrays, schema=arrow), schema)
