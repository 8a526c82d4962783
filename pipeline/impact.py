"""What a candidate limit would have done to the recorded traffic: for each
``KEY=VALUE`` (a Kafka property of :data:`pipeline.limits.LIMITS`), which client
ids, client addresses, groups, identifiers and proxies it would have refused,
evicted, closed or held back, how often, and when.

Three kinds of evidence answer it, each in its own unit of ``occurrences``:

* ``window``: observation windows over the limit (a group of 57 members in a
  window is over ``group.max.size=50``; Kafka refuses the joins beyond 50);
* ``connection``: connections opened while the count per proxy, per proxy over
  TLS, or per client host was already at the limit (the counts the proxy's limits
  took as they admitted it; Kafka's ``ConnectionQuotas`` and KIP-1015 would have
  refused them or evicted an idle one);
* ``decision``: decisions the proxies recorded that the candidate would also
  have taken (a join refused at ``group.max.size=100`` is refused at 50 too; an
  identifier of 250 characters breaks a limit of 249).

The rule is the same everywhere: a limit ``value`` acts on an observation when
``value < acts_below``, where ``acts_below`` is the observed group size, frame
size, connection count, identifier length or pool high-water mark (Kafka lets a
group reach exactly ``group.max.size`` members and a frame be exactly
``socket.request.max.bytes`` long), or the recorded limit plus one.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import reduce
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from policies.properties import (
    GROUP_CONSUMER_MAX_SIZE,
    GROUP_MAX_SIZE,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_IP,
    MAX_RESPONSE_SIZE,
    MAX_SSL_CONNECTIONS,
    QUEUED_MAX_REQUEST_BYTES,
    SOCKET_REQUEST_MAX_BYTES,
)

from .events import Evidence, local_frame, proxy_of, union_all
from .limits import IDENTIFIER_KEYS, KAFKA_DEFAULTS, LIMITS, identifier_limit_key
from .traffic import bucket, client_host

__all__ = [
    "Candidate",
    "CandidateError",
    "Impact",
    "choose_candidates",
    "hits",
    "impact_tables",
    "parse_candidate",
    "subjects",
    "summary",
    "timeline",
]

ORIGINS = ("candidate", "configured", "recommended", "kafka default")  # in order of precedence
SUBJECT_KINDS = ("client_id", "client_address", "group_id", "identifier", "instance")
# summary's count of distinct subjects of each kind
COUNTED = {
    "client_id": "client_ids",
    "client_address": "client_addresses",
    "group_id": "groups",
    "identifier": "identifiers",
    "instance": "proxies",
}
TOP_SUBJECTS = 15


class CandidateError(ValueError):
    """A ``--candidate`` that is not ``KEY=VALUE`` with a known key and an integer value."""


@dataclass(frozen=True)
class Candidate:
    key: str
    value: int
    origin: str = "candidate"

    @property
    def label(self) -> str:
        return f"{self.key}={self.value}"


def parse_candidate(text: str) -> Candidate:
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep:
        raise CandidateError(f"--candidate {text}: write KEY=VALUE, e.g. group.max.size=50")
    if key not in LIMITS:
        raise CandidateError(
            f"--candidate {text}: {key!r} is not a limit the report evaluates (known: {', '.join(LIMITS)})"
        )
    try:
        number = int(value.strip().replace("_", ""))
    except ValueError:
        raise CandidateError(f"--candidate {text}: the value of {key} must be an integer") from None
    if number < 0:
        raise CandidateError(f"--candidate {text}: the value of {key} must be >= 0")
    return Candidate(key, number)


def choose_candidates(
    explicit: Iterable[Candidate], configured: Iterable[tuple[str, int]], recommended: Iterable[tuple[str, int]]
) -> list[Candidate]:
    """Every limit to evaluate, once per (key, value): the ``--candidate`` ones, the limits the
    proxies had configured (seen in their decisions), the recommended ones, and Kafka's defaults
    for the identifier limits and frame sizes (what turning them on would do)."""
    chosen: dict[tuple[str, int], Candidate] = {}
    defaults = [(k, KAFKA_DEFAULTS[k]) for k in (*IDENTIFIER_KEYS, SOCKET_REQUEST_MAX_BYTES, MAX_RESPONSE_SIZE)]
    sources: list[tuple[str, Iterable[tuple[str, int]]]] = [
        ("candidate", ((c.key, c.value) for c in explicit)),
        ("configured", configured),
        ("recommended", recommended),
        ("kafka default", defaults),
    ]
    for origin, pairs in sources:
        for key, value in pairs:
            if key in LIMITS and (key, value) not in chosen:
                chosen[(key, value)] = Candidate(key, value, origin)
    return sorted(chosen.values(), key=lambda c: (list(LIMITS).index(c.key), c.value))


Measure = tuple[Column, Column, Column]  # limit key, observed value (null: not this key), detail


def _measured(
    frame: DataFrame, evidence: str, measures: Sequence[Measure], smallest: Column, **columns: Column
) -> DataFrame:
    """One scan of a kind of evidence: a row per (event, limit key it measures), in the common shape
    (``acts_below`` is the observed value: a limit acts when it is below it). Only rows some candidate
    acts on are kept, before anything else (``smallest``: a map of each key's smallest candidate)."""
    empty = F.lit(None).cast("string")
    acted_on = reduce(operator.or_, [value > F.element_at(smallest, key) for key, value, _ in measures])
    frame = frame.filter(acted_on)
    pairs = F.array(
        *[
            F.struct(key.alias("key"), value.cast("long").alias("observed"), detail.cast("string").alias("detail"))
            for key, value, detail in measures
        ]
    )
    return (
        frame.select(
            F.col("ts").cast("double").alias("ts"),
            F.col("instance"),
            *[
                columns.get(name, empty).alias(name)
                for name in ("client_id", "client_address", "group_id", "identifier")
            ],
            columns.get("conn_id", empty).alias("conn_id"),
            F.explode(pairs).alias("m"),
        )
        .filter(F.col("m.observed").isNotNull())
        .select(
            F.col("m.key").alias("key"),
            F.lit(evidence).alias("evidence"),
            F.col("m.observed").alias("acts_below"),
            F.col("m.observed").alias("observed"),
            "ts",
            "instance",
            "client_id",
            "client_address",
            "group_id",
            "identifier",
            F.col("m.detail").alias("detail"),
            "conn_id",
        )
    )


def _at_start(windows: DataFrame) -> DataFrame:
    """Windows dated by their start (``ts`` is when they were written, at their end)."""
    return windows.withColumn("ts", F.col("window_start"))


def _window_observations(evidence: Evidence, opens: DataFrame, smallest: dict[str, int]) -> list[DataFrame]:
    """Observation windows and connection counts, one scan per kind, for the keys of ``smallest``."""
    keys = set(smallest)
    table = F.create_map(*[F.lit(x) for pair in smallest.items() for x in pair])
    found: list[DataFrame] = []
    start = F.col("window_start").alias("ts")
    lit = F.lit

    def wanted(*measures: tuple[str, Column, Column]) -> list[Measure]:
        return [(lit(k), v, d) for k, v, d in measures if k in keys]

    kind = F.coalesce(F.col("group_kind"), lit("classic"))
    members = F.col("max_members")
    groups = wanted(
        (GROUP_MAX_SIZE, F.when(kind == "classic", members), lit("classic group")),
        (GROUP_CONSUMER_MAX_SIZE, F.when(kind == "consumer", members), lit("consumer group")),
    )
    if groups:
        found.append(
            _measured(_at_start(evidence.windows("group")), "window", groups, table, group_id=F.col("group_id"))
        )
    per_proxy = wanted(
        (MAX_CONNECTIONS, F.col("all"), lit("all listeners")),
        (MAX_SSL_CONNECTIONS, F.col("tls"), lit("TLS listeners")),
    )
    if per_proxy:
        open_at_once = (
            evidence.windows("connections")
            .groupBy(proxy_of().alias("instance"), "window_start")
            .agg(F.sum("max_open").alias("all"), F.sum(F.when(F.col("tls"), F.col("max_open"))).alias("tls"))
            .select(start, "instance", "all", "tls")
        )
        found.append(_measured(open_at_once, "window", per_proxy, table))
    counted = wanted(
        (MAX_CONNECTIONS, F.col("open_connections"), F.col("listener")),
        (MAX_SSL_CONNECTIONS, F.col("open_ssl_connections"), F.col("listener")),
        (MAX_CONNECTIONS_PER_IP, F.col("open_ip_connections"), F.col("listener")),
    )
    if counted:
        found.append(
            _measured(opens, "connection", counted, table, client_address=F.col("host"), conn_id=F.col("conn_id"))
        )
    pool = wanted((QUEUED_MAX_REQUEST_BYTES, F.col("high_water_mark_bytes"), lit("in-flight high-water mark")))
    if pool:
        found.append(_measured(_at_start(evidence.windows("pool")), "window", pool, table))
    # The bulk of the windows, sizes and identifier lengths, in one scan of the sections where the bulk
    # counts saw a value some candidate acts on (none: no scan; the recommended sizes are above every one).
    largest = _largest_in_bulk(evidence)
    sizes = [
        (key, value, detail)
        for key, value, detail, seen in (
            (SOCKET_REQUEST_MAX_BYTES, F.col("max_request_bytes"), F.col("api"), largest["rq"]),
            (MAX_RESPONSE_SIZE, F.col("max_response_bytes"), F.col("api"), largest["rs"]),
        )
        if key in keys and seen > smallest[key]
    ]
    bulk = wanted(*sizes)
    sections = ["client_api"] if bulk else []
    if any(largest["identifier"] > smallest[k] for k in keys & set(IDENTIFIER_KEYS)):
        kinds = {r["identifier_kind"] for r in evidence.bulk_counts if r["identifier_kind"] is not None}
        limit_key = identifier_limit_key(F.col("identifier_kind"), kinds)
        bulk.append((limit_key, F.col("max_length"), F.col("identifier_kind")))
        sections.append("identifier")
    if bulk:
        found.append(
            _measured(
                _at_start(evidence.windows(*sections)),
                "window",
                bulk,
                table,
                client_id=F.col("client_id"),
                identifier=F.col("identifier"),
            )
        )
    return found


def _largest_in_bulk(evidence: Evidence) -> dict[str, int]:
    """The largest request, response and identifier length of the bulk windows (-1: none), from their counts."""
    largest = {"rq": -1, "rs": -1, "identifier": -1}
    for r in evidence.bulk_counts:
        for name, column in (("rq", "rq_max"), ("rs", "rs_max"), ("identifier", "max_length")):
            if r[column] is not None:
                largest[name] = max(largest[name], int(r[column]))
    return largest


def _decision_observations(evidence: Evidence, keys: set[str]) -> DataFrame:
    """Recorded decisions under each key: the identifier's length, the frame's size, or the limit + 1."""
    kind = F.lower(F.col("identifier_kind"))
    named = F.when(kind.isin("client_id", "client id"), F.col("client_id")).when(
        kind.isin("group_id", "group id"), F.col("group_id")
    )
    is_identifier = F.col("limit_key").isin(*IDENTIFIER_KEYS)
    is_size = F.col("limit_key").isin(SOCKET_REQUEST_MAX_BYTES, MAX_RESPONSE_SIZE)
    acts_below = (
        F.when(is_identifier, F.col("identifier_length")).when(is_size, F.col("size")).otherwise(F.col("limit") + 1)
    )
    observed = F.when(is_identifier, F.col("identifier_length")).when(is_size, F.col("size")).otherwise(F.col("limit"))
    rows = evidence.decisions.filter(F.col("limit_key").isin(*keys))
    return rows.select(
        F.col("limit_key").alias("key"),
        F.lit("decision").alias("evidence"),
        acts_below.cast("long").alias("acts_below"),
        observed.cast("long").alias("observed"),
        F.col("ts").cast("double").alias("ts"),
        "instance",
        "client_id",
        client_host(F.col("client_address")).alias("client_address"),
        "group_id",
        F.when(is_identifier, F.coalesce(F.col("identifier"), named)).alias("identifier"),
        F.concat_ws(" ", F.col("mode"), F.col("action"), F.col("api"), F.col("identifier_kind")).alias("detail"),
        F.col("conn_id"),
    )


# What each row of hits() says about the observation a candidate acted on.
_OBSERVATION = (
    "evidence",
    "observed",
    "ts",
    "instance",
    "client_id",
    "client_address",
    "group_id",
    "identifier",
    "detail",
)
_CANDIDATE_SCHEMA = StructType(
    [StructField("key", StringType()), StructField("value", LongType()), StructField("origin", StringType())]
)
_EVERY_CANDIDATE_SCHEMA = StructType(
    [
        StructField("candidate", StringType()),
        *_CANDIDATE_SCHEMA.fields[:2],
        StructField("origin", StringType()),
        StructField("policy", StringType()),
        StructField("action", StringType()),
    ]
)


def hits(spark: SparkSession, evidence: Evidence, opens: DataFrame, candidates: Sequence[Candidate]) -> DataFrame:
    """One row per observation a candidate limit would have acted on (all candidates at once).

    Each kind of evidence is scanned once for all candidates of a key: rows are kept
    only when the smallest candidate of their key acts on them, then matched to the
    candidates (a broadcast of a few rows).
    """
    keys = {c.key for c in candidates}
    smallest = {k: min(c.value for c in candidates if c.key == k) for k in keys}
    found = _window_observations(evidence, opens, smallest)
    found.append(_decision_observations(evidence, keys))
    table = F.create_map(*[F.lit(x) for pair in smallest.items() for x in pair])
    observations = union_all(found).filter(F.col("acts_below") > F.element_at(table, F.col("key")))
    chosen = local_frame(spark, [(c.key, c.value, c.origin) for c in candidates], _CANDIDATE_SCHEMA)
    matched = observations.join(
        F.broadcast(chosen), (observations["key"] == chosen["key"]) & (chosen["value"] < observations["acts_below"])
    ).select(
        F.concat(chosen["key"], F.lit("="), chosen["value"].cast("string")).alias("candidate"),
        chosen["key"],
        chosen["value"],
        chosen["origin"],
        *[observations[c] for c in (*_OBSERVATION, "conn_id")],
    )
    # Connection opens carry no client id: their close event names it. Per proxy: with workers: N the
    # owner writes the opens under the proxy's instance, each worker its closes (conn ids are unique
    # across a proxy's workers).
    closes = evidence.connections.filter(F.col("event") == "close").select(
        proxy_of().alias("instance"), "conn_id", F.col("client_id").alias("closed_client_id")
    )
    named = (
        matched.filter(F.col("evidence") == "connection")
        .join(closes, ["instance", "conn_id"], "left")
        .withColumn("client_id", F.coalesce(F.col("client_id"), F.col("closed_client_id")))
        .drop("closed_client_id")
    )
    policy = F.create_map(*[F.lit(x) for k, limit in LIMITS.items() for x in (k, limit.policy)])
    action = F.create_map(*[F.lit(x) for k, limit in LIMITS.items() for x in (k, limit.action)])
    return (
        matched.filter(F.col("evidence") != "connection")
        .unionByName(named)
        .select(
            "candidate",
            "key",
            "value",
            "origin",
            F.element_at(policy, F.col("key")).alias("policy"),
            F.element_at(action, F.col("key")).alias("action"),
            *_OBSERVATION,
        )
    )


_GROUP = ("candidate", "key", "value", "origin", "policy", "action", "evidence")


def _seen(column: str) -> Column:
    return F.timestamp_seconds(F.col(column))


def subjects(found: DataFrame) -> DataFrame:
    """Per candidate and evidence: each client id, client address (host), group, identifier and
    proxy it would have acted on, how often, the worst value observed, first and last time."""
    pairs = F.array(
        *[F.struct(F.lit(k).alias("subject_kind"), F.col(k).cast("string").alias("subject")) for k in SUBJECT_KINDS]
    )
    return (
        found.select(*_GROUP, "observed", "ts", "detail", F.explode(pairs).alias("s"))
        .filter(F.col("s.subject").isNotNull())
        .groupBy(*_GROUP, F.col("s.subject_kind").alias("subject_kind"), F.col("s.subject").alias("subject"))
        .agg(
            F.count(F.lit(1)).alias("occurrences"),
            F.max("observed").alias("worst"),
            F.min("ts").alias("first"),
            F.max("ts").alias("last"),
            F.array_join(F.slice(F.array_sort(F.collect_set("detail")), 1, 10), ", ").alias("details"),
        )
        .select(
            *_GROUP,
            "subject_kind",
            "subject",
            "occurrences",
            "worst",
            _seen("first").alias("first_seen"),
            _seen("last").alias("last_seen"),
            "details",
        )
    )


def timeline(found: DataFrame, seconds: int) -> DataFrame:
    """Per candidate and evidence: occurrences per time bucket of ``seconds``."""
    return (
        found.groupBy("candidate", "key", "value", "origin", "evidence", bucket(F.col("ts"), seconds).alias("t"))
        .agg(F.count(F.lit(1)).alias("occurrences"), F.max("observed").alias("worst"))
        .select(
            "candidate",
            "key",
            "value",
            "origin",
            "evidence",
            _seen("t").alias("bucket_start"),
            F.lit(seconds).alias("bucket_seconds"),
            "occurrences",
            "worst",
        )
    )


def summary(spark: SparkSession, found: DataFrame, candidates: Sequence[Candidate]) -> DataFrame:
    """Per candidate and evidence: occurrences, distinct subjects of each kind, first and last time,
    worst value; a candidate that would have acted on nothing has one row with 0 occurrences."""
    counted = found.groupBy(*_GROUP).agg(
        F.count(F.lit(1)).alias("occurrences"),
        *[F.count_distinct(k).alias(name) for k, name in COUNTED.items()],
        F.min("ts").alias("first"),
        F.max("ts").alias("last"),
        F.max("observed").alias("worst"),
    )
    everyone = local_frame(
        spark,
        [(c.label, c.key, c.value, c.origin, LIMITS[c.key].policy, LIMITS[c.key].action) for c in candidates],
        _EVERY_CANDIDATE_SCHEMA,
    )
    joined = everyone.join(counted.drop("key", "value", "origin", "policy", "action"), "candidate", "left")
    return joined.select(
        *_GROUP[:6],
        F.coalesce(F.col("evidence"), F.lit("none")).alias("evidence"),
        F.coalesce(F.col("occurrences"), F.lit(0)).alias("occurrences"),
        *[F.coalesce(F.col(name), F.lit(0)).alias(name) for name in COUNTED.values()],
        _seen("first").alias("first_seen"),
        _seen("last").alias("last_seen"),
        "worst",
    )


@dataclass(frozen=True)
class Impact:
    """The impact tables as the report shows them (small: collected)."""

    candidates: tuple[Candidate, ...]
    summary: list[dict[str, Any]]
    top_subjects: dict[str, list[dict[str, Any]]]  # candidate label -> subjects, most occurrences first
    timeline: dict[str, list[tuple[float, int]]]  # candidate label -> (bucket start, occurrences)


def impact_tables(
    spark: SparkSession,
    evidence: Evidence,
    opens: DataFrame,
    candidates: Sequence[Candidate],
    out: str,
    seconds: int,
    planned: Callable[[], object] = lambda: None,
) -> Impact:
    """Write ``out/impact/{summary,subjects,timeline}`` (Parquet) and return what the report shows.
    ``planned`` is called once the tables' plans are made (the Python side's share of the work)."""
    found = hits(spark, evidence, opens, candidates).cache()
    tables = {
        "summary": summary(spark, found, candidates),
        "subjects": subjects(found),
        "timeline": timeline(found, seconds),
    }

    planned()

    def write(name: str) -> None:
        tables[name].coalesce(1).write.mode("overwrite").parquet(f"{out}/impact/{name}")

    # The first table fills the cache of hits; then the other two are written side by side, and the
    # three read back side by side (while Spark runs one, the driver plans the next).
    write("summary")
    with ThreadPoolExecutor(3, thread_name_prefix="impact") as pool:
        list(pool.map(write, ("subjects", "timeline")))
        found.unpersist()
        read = {name: _readable(spark.read.parquet(f"{out}/impact/{name}")) for name in tables}
        rank = Window.partitionBy("candidate", "evidence", "subject_kind").orderBy(F.desc("occurrences"), "subject")
        top_rows = pool.submit(
            lambda: (
                read["subjects"]
                .withColumn("rank", F.row_number().over(rank))
                .filter(F.col("rank") <= TOP_SUBJECTS)
                .collect()
            )
        )
        bucket_rows = pool.submit(
            lambda: read["timeline"].groupBy("candidate", "t").agg(F.sum("occurrences").alias("n")).collect()
        )
        summary_rows = pool.submit(read["summary"].collect)
    top = sorted(  # small: sorted on the driver (Spark's orderBy would sample in a job of its own)
        top_rows.result(), key=lambda r: (r["candidate"], r["evidence"], r["subject_kind"], r["rank"])
    )
    top_subjects: dict[str, list[dict[str, Any]]] = {}
    for r in top:
        top_subjects.setdefault(r["candidate"], []).append(r.asDict())
    series: dict[str, list[tuple[float, int]]] = {}
    for r in sorted(bucket_rows.result(), key=lambda r: r["t"]):
        series.setdefault(r["candidate"], []).append((float(r["t"]), int(r["n"])))
    order = {c.label: n for n, c in enumerate(candidates)}
    rows = sorted((r.asDict() for r in summary_rows.result()), key=lambda r: (order[r["candidate"]], r["evidence"]))
    return Impact(tuple(candidates), rows, top_subjects, series)


def _readable(frame: DataFrame) -> DataFrame:
    """Timestamps as UTC text for the page (and a numeric ``t`` for plotting), as Spark formats them."""
    columns: list[Column] = []
    for field in frame.schema.fields:
        if field.dataType.typeName() == "timestamp":
            if field.name == "bucket_start":
                columns.append(F.col(field.name).cast("long").alias("t"))
            columns.append(F.date_format(field.name, "yyyy-MM-dd HH:mm:ss").alias(field.name))
        else:
            columns.append(F.col(field.name))
    return frame.select(*columns)
