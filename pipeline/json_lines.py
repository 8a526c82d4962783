"""JSON-line audit files turned into Parquet in Spark tasks, parsed by pyarrow's JSON reader.

Spark's own JSON reader builds Java strings and a row field by field for every line: for 10 million
events (3.15 GB), parsing and caching them was 39-52 s of the report's 83-87 s on 2 cores, and the
queries after read the cache row by row (bench/RESULTS.md). pyarrow's reader parses the lines in C++
into columns, and each task writes its valid events as Parquet partitioned by kind and section, the way
``--to-parquet`` does, so the queries read them as they read a Parquet input: by partition and column.
The tasks run wherever Spark runs them (on a standalone cluster, its workers); only counts come back.

pyarrow is stricter than Spark: a line it accepts reads as Spark reads it, and it refuses the rest (not
JSON, a value of the wrong type, a duplicate key, Spark's lenient forms such as single quotes, two objects
on a line; tests/pipeline/test_json_lines.py holds Spark's reader to that). A line it refuses, or
one that breaks a rule of the schema (``Contract``), is kept as it was, for Spark's JSON reader, which
names what is wrong with it by the same rules as ever. Blank lines are skipped, as Spark skips them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import pyarrow.parquet as pq
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

__all__ = ["FILE_COLUMN", "Contract", "Converted", "convert", "refused_file_index"]

FILE_COLUMN = "_file"  # of a refused line: its input file's index in the list given to convert()

# Bytes parsed at a time. Per call pyarrow costs a little (1 MiB blocks: 40% more CPU than 16 MiB, 4 MiB:
# 5%), and a block with a line it refuses is parsed again up to that line.
_BLOCK = 4 << 20
_ROW_GROUP = 1 << 18
_NOT_AN_OBJECT_LINE = re.compile(rb"\n[^{]")
_STOPPED_AT = re.compile(r"in row (\d+)$")  # how pyarrow names the line it could not parse (0: the first)
_NULL = "__HIVE_DEFAULT_PARTITION__"  # the directory name of a null partition value, as Spark writes it
# Files smaller than this in all are converted by a local session's driver itself, not in Spark tasks
# (pyarrow parses ~100 MB/s per core here: a Python worker's start costs about as much as 16 MiB)
DRIVER_CONVERTS_BYTES = 16 << 20


@dataclass(frozen=True)
class Contract:
    """What makes a parsed line a valid event, as data: pipeline.events states it, builds Spark's rules
    (which name what is wrong with a line) from it, and hands it here."""

    version: int
    always: tuple[str, ...]  # what every event carries
    required: dict[str, tuple[str, ...]]  # what each type (the types there are) carries besides
    enums: dict[str, tuple[str, ...]]  # the values a field may have, when it has one
    sections: tuple[str, ...]


@dataclass(frozen=True)
class Converted:
    """Where the converted events are, and how many lines each input file had."""

    parquet: str | None  # the root of the Parquet events, partitioned by type and section
    refused: tuple[str, ...]  # JSON-line files of the lines Spark's reader must read, named part-<index>
    lines: dict[int, int]  # input index -> lines read (blank lines not counted), for files that could be read


def convert(spark: SparkSession, paths: list[str], target: str, schema: StructType, contract: Contract) -> Converted:
    """Convert ``paths`` (JSON lines, ``.gz`` too) in Spark tasks into ``target``:
    the valid events as Parquet partitioned by ``type`` and ``section`` (as ``--to-parquet`` writes them),
    every other line as it was, for Spark's reader to name what is wrong with it."""
    arrow = to_arrow_schema(schema)
    jobs = list(enumerate(paths))
    if str(spark.sparkContext.master).startswith("local") and _bytes(paths) < DRIVER_CONVERTS_BYTES:
        # Here, in the driver: a Spark task would start a Python worker (fork, import pyspark and pyarrow),
        # seconds for what pyarrow parses in milliseconds (bench/RESULTS.md: the demo's report). A
        # cluster's workers convert what they are given, as ever.
        done = list(_convert_files(0, jobs, target, arrow, contract))
    else:
        # Two tasks per core, each writing one Parquet file per partition, rather than a task per input file:
        # every query opens the files of its partitions (10 million events in 60 files: the queries took
        # 33.0 s after a task per file, 29.7 s after four tasks)
        tasks = max(1, min(len(jobs), 2 * spark.sparkContext.defaultParallelism))
        rdd = spark.sparkContext.parallelize(jobs, tasks)
        done = rdd.mapPartitionsWithIndex(
            lambda task, part: _convert_files(task, part, target, arrow, contract)
        ).collect()
    refused = sorted(f for _, wrote, f, _ in done if f)
    lines = {index: count for index, _, _, count in done if count is not None}
    parquet = str(Path(target, "events")) if any(wrote for _, wrote, _, _ in done) else None
    return Converted(parquet, tuple(refused), lines)


def _bytes(paths: Iterable[str]) -> int:
    total = 0
    for path in paths:
        try:
            total += Path(path).stat().st_size
        except OSError:
            pass  # gone: the conversion lists it as unreadable
    return total


def _refused_path(target: str, index: int) -> Path:
    return Path(target, "refused", f"part-{index:05d}.jsonl")


def refused_file_index() -> Column:
    """The input index of a refused line, from the name of the file it was kept in (``_refused_path``)."""
    return F.regexp_extract(F.col("_metadata.file_path"), r"part-(\d+)\.jsonl$", 1).cast("int")


def _blocks(path: str) -> Iterator[bytes]:
    """The file in blocks of whole lines (the last may lack its newline)."""
    with pa.input_stream(path, compression="detect") as stream:
        carry = b""
        while chunk := stream.read(_BLOCK):
            block = carry + chunk
            cut = block.rfind(b"\n") + 1
            if cut:
                yield block[:cut]
            carry = block[cut:]
        if carry:
            yield carry


def _lines(block: bytes) -> int:
    return block.count(b"\n") + (0 if block.endswith(b"\n") else 1)


def _line(block: bytes) -> bytes:
    return block if block.endswith(b"\n") else block + b"\n"


def _parse(block: bytes, arrow: pa.Schema, parsed: list[tuple[pa.Table, bytes]], refused: list[bytes]) -> None:
    """Parse ``block`` (each table with its lines, one row per line). Where pyarrow stops at a line it
    names, the lines before it and after it are parsed apart; otherwise the piece is halved, until the
    lines it refuses are alone. A worklist, not recursion: a file may hold any number of bad lines."""
    pending = [block]
    while pending:
        piece = pending.pop()
        if not piece.startswith(b"{"):
            # A line that does not start an object (blank, indented, not an object) is Spark's to read, or
            # to skip when blank; pyarrow is not asked (it crashes on a piece that starts with null, 26.0).
            end = piece.find(b"\n") + 1 or len(piece)
            if piece[:end].strip():
                refused.append(_line(piece[:end]))
            if end < len(piece):
                pending.append(piece[end:])
            continue
        other = _NOT_AN_OBJECT_LINE.search(piece)
        if other is not None:  # such a line further on: parsed apart, so that each row is its line
            pending += [piece[other.start() + 1 :], piece[: other.start() + 1]]
            continue
        stopped_at = None
        try:
            table = pj.read_json(
                pa.py_buffer(piece),
                read_options=pj.ReadOptions(use_threads=False, block_size=len(piece) + 1),
                parse_options=pj.ParseOptions(explicit_schema=arrow, unexpected_field_behavior="ignore"),
            )
            if table.num_rows == _lines(piece):  # one row per line; not so with two objects on a line
                parsed.append((table, piece))
                continue
        except pa.ArrowInvalid as error:
            named = _STOPPED_AT.search(str(error))
            stopped_at = int(named.group(1)) if named else None
        lines = _lines(piece)
        if lines == 1:
            refused.append(_line(piece))
        elif stopped_at is not None and 0 <= stopped_at < lines:
            # "in row N": line N, if no blank line came before it; a wrong guess costs a parse, not a result
            start = len(piece) - len(piece.split(b"\n", stopped_at)[-1])
            end = piece.find(b"\n", start) + 1 or len(piece)
            pending += [piece[end:], piece[start:end], piece[:start]]
        else:
            middle = piece.find(b"\n", len(piece) // 2)
            if middle < 0 or middle == len(piece) - 1:
                middle = piece.rfind(b"\n", 0, len(piece) - 1)
            pending += [piece[middle + 1 :], piece[: middle + 1]]


def _valid(table: pa.Table, contract: Contract) -> pa.Array:
    """True for a row that is a valid event by ``contract``: the same test as Spark's rules in
    pipeline.events, so that the Parquet holds valid events only (tests/pipeline compares the two)."""

    def present(name: str) -> pa.Array:
        return pc.is_valid(table[name])

    def equal(name: str, value: object) -> pa.Array:
        return pc.fill_null(pc.equal(table[name], value), False)

    valid = equal("schema_version", contract.version)
    for name in contract.always:
        valid = pc.and_(valid, present(name))
    typed = pa.repeat(False, table.num_rows)
    for kind, names in contract.required.items():
        carries = equal("type", kind)
        for name in names:
            carries = pc.and_(carries, present(name))
        typed = pc.or_(typed, carries)
    valid = pc.and_(valid, typed)
    for name, allowed in {**contract.enums, "section": contract.sections}.items():
        valid = pc.and_(
            valid, pc.or_(pc.is_null(table[name]), pc.fill_null(pc.is_in(table[name], pa.array(allowed)), False))
        )
    return valid


class _Writers:
    """One Parquet file per partition (type and section) a task's events fall in, written ``_ROW_GROUP``
    rows or more at a time: the report over 10 million events took 30.5-32.8 s from row groups of 64 Ki
    rows, 28.5-29.4 s from these (29.5-29.6 s from what Spark writes), and longer from one per block."""

    def __init__(self, root: Path, index: int, parsed: pa.Schema) -> None:
        self.root, self.index = root, index
        self.schema = pa.schema([f for f in parsed if f.name not in ("type", "section")])  # the partitions say those
        self.open: dict[tuple[str, str], pq.ParquetWriter] = {}
        self.pending: dict[tuple[str, str], list[pa.Table]] = {}

    def write(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        keys = table.select(["type", "section"]).group_by(["type", "section"]).aggregate([])
        for kind, section in zip(keys["type"].to_pylist(), keys["section"].to_pylist(), strict=True):
            same = pc.equal(table["section"], section) if section is not None else pc.is_null(table["section"])
            part = table.filter(pc.and_(pc.equal(table["type"], kind), same)).drop_columns(["type", "section"])
            key = (kind, section if section is not None else _NULL)
            pending = self.pending.setdefault(key, [])
            pending.append(part)
            if sum(t.num_rows for t in pending) >= _ROW_GROUP:
                self._flush(key)

    def _flush(self, key: tuple[str, str]) -> None:
        tables = self.pending.pop(key, [])
        if not tables:
            return
        if key not in self.open:
            directory = self.root / f"type={key[0]}" / f"section={key[1]}"
            directory.mkdir(parents=True, exist_ok=True)
            self.open[key] = pq.ParquetWriter(directory / f"part-{self.index:05d}.parquet", self.schema)
        self.open[key].write_table(pa.concat_tables(tables), row_group_size=4 * _ROW_GROUP)

    def close(self) -> None:
        for key in list(self.pending):
            self._flush(key)
        for writer in self.open.values():
            writer.close()


def _convert_files(
    task: int, jobs: Iterable[tuple[int, str]], target: str, arrow: pa.Schema, contract: Contract
) -> Iterator[tuple[int, bool, str, int | None]]:
    """Runs in a Spark task: per input file, whether it had valid events, the file of its lines left for
    Spark's reader ("" for none), and its lines (None when it could not be read at all: gone, unreadable,
    not decompressible). The task's events go to one Parquet file per partition."""
    writers = _Writers(Path(target, "events"), task, arrow)
    try:
        for index, path in jobs:
            yield _convert_file(index, path, _refused_path(target, index), arrow, writers, contract)
    finally:
        writers.close()


def _convert_file(
    index: int, path: str, refused_path: Path, arrow: pa.Schema, writers: _Writers, contract: Contract
) -> tuple[int, bool, str, int | None]:
    refused_path.parent.mkdir(parents=True, exist_ok=True)
    refused_count = rows = 0
    read_any = False
    try:
        with refused_path.open("wb") as refused_file:
            for block in _blocks(path):
                read_any = True
                parsed: list[tuple[pa.Table, bytes]] = []
                refused: list[bytes] = []
                _parse(block, arrow, parsed, refused)
                for table, lines in parsed:
                    valid = _valid(table, contract)
                    if not pc.all(valid).as_py():
                        split = lines.split(b"\n")  # row i is line i: the rows were counted against the lines
                        refused += [split[i] + b"\n" for i in pc.indices_nonzero(pc.invert(valid)).to_pylist()]
                        table = table.filter(valid)
                    rows += table.num_rows
                    writers.write(table)
                refused_file.writelines(refused)
                refused_count += len(refused)
    except (OSError, pa.ArrowInvalid):
        # Gone, unreadable, or not decompressible: Spark's ignoreMissingFiles and ignoreCorruptFiles skip
        # such a file the same way; what was read before stays.
        pass
    if not refused_count:
        refused_path.unlink(missing_ok=True)
    return index, rows > 0, str(refused_path) if refused_count else "", rows + refused_count if read_any else None
