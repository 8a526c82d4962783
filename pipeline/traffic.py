"""What the fleet's traffic looked like, as small aggregates computed by Spark:
sizes per client id and API, group sizes, pool depth, connections (TLS and
plaintext), identifier lengths, and the decisions recorded. The report's plots
and the recommended limits are made from these; only they reach the driver.

Connections open at once per proxy, per proxy over TLS, and per client host are
what each proxy's connection limits counted as they admitted a connection
(Kafka's ``ConnectionQuotas`` counts the same three), recorded in its open event;
the windows' ``max_open`` give the peaks per listener.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from .coverage import Coverage, measure_coverage
from .events import Evidence, Overview, local_frame, proxy_of
from .limits import limit_key_of, normalized_kind

__all__ = ["Peak", "Traffic", "bucket", "client_host", "measure_traffic", "open_connections"]

TOP = 10
PAIR_ROWS = 10_000  # windows whose client id and API are grouped to find the largest sizes' pairs (_largest)

# Results collected to the driver are small and sorted there: Spark's orderBy (without a limit)
# samples its input in a Spark job of its own first, one more job per table for nothing.


@dataclass(frozen=True)
class Peak:
    """The largest value of something, where (a group, a proxy, a client...) and when."""

    value: int
    where: str
    ts: float | None = None


@dataclass(frozen=True)
class Traffic:
    overview: Overview
    bucket_seconds: int
    coverage: Coverage = field(default_factory=Coverage)  # windows, span, gaps: what the evidence covers
    # sizes: (log2 bucket k: 2^(k-1) <= size < 2^k, rows of (client id, API, window)) of the largest frame
    request_size_hist: list[tuple[int, int]] = field(default_factory=list)
    response_size_hist: list[tuple[int, int]] = field(default_factory=list)
    largest_requests: list[dict[str, Any]] = field(default_factory=list)  # client_id, api, bytes, requests
    largest_responses: list[dict[str, Any]] = field(default_factory=list)
    client_api_rows: int = 0
    # memory pool
    pool_percentiles: dict[str, int] = field(default_factory=dict)  # p50, p90, p99, p99.9, max
    pool_capacity: int | None = None
    pool_waits: int = 0
    pool_peak: Peak | None = None
    pool_series: list[tuple[float, int, int, int]] = field(default_factory=list)  # bucket, max, median, waits
    # connections
    connection_series: list[tuple[float, bool, int, int]] = field(default_factory=list)  # bucket, tls, fleet, busiest
    peak_tls: Peak | None = None
    peak_connections: Peak | None = None
    peak_per_ip: Peak | None = None
    uncounted_opens: int = 0  # connection opens without the proxy's counts (files from before they were recorded)
    close_reasons: list[tuple[str, int]] = field(default_factory=list)
    # groups
    largest_groups: list[dict[str, Any]] = field(default_factory=list)  # group_id, kind, peak, ts
    largest_by_kind: dict[str, Peak] = field(default_factory=dict)  # classic | consumer
    group_series: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    group_peak_hist: list[tuple[int, int]] = field(default_factory=list)  # peak members, groups
    groups: int = 0
    # identifiers
    identifier_hist: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # kind -> (length, rows)
    longest: dict[str, dict[str, Any]] = field(default_factory=dict)  # kind -> length, client_id, identifier, key
    # decisions recorded, by policy, limit and action
    decisions: list[dict[str, Any]] = field(default_factory=list)

    def longest_for(self, limit_key: str) -> Peak | None:
        """The longest identifier whose limit is ``limit_key``."""
        best: Peak | None = None
        for kind, entry in self.longest.items():
            if entry["key"] == limit_key and (best is None or entry["length"] > best.value):
                best = Peak(entry["length"], f"{kind} {entry['identifier']!r} (client id {entry['client_id']!r})")
        return best


def bucket(ts: Column, seconds: int) -> Column:
    """The start of the ``seconds``-long time bucket ``ts`` falls in (Unix seconds)."""
    return F.floor(ts / seconds) * seconds


def client_host(address: Column) -> Column:
    """``10.0.0.5:53211`` -> ``10.0.0.5``; ``[::1]:9092`` -> ``::1``: the IP Kafka counts per-IP limits by.
    (Substrings only: Spark's ``translate`` builds its table again for every row, a third of the
    connection counts' first stage.)"""
    port = F.substring_index(address, ":", -1)
    host = F.left(address, F.length(address) - F.length(port) - 1)
    bracketed = host.startswith("[") & host.endswith("]")
    unbracketed = F.substring_index(F.substring_index(host, "]", 1), "[", -1)
    return F.when(F.instr(address, ":") == 0, address).when(bracketed, unbracketed).otherwise(host)


# What the proxy's connection limits counted as they admitted a connection (audit: connection open)
COUNTED = ("open_connections", "open_ssl_connections", "open_ip_connections")


def _int(value: Any) -> int:
    return int(value) if value is not None else 0


def open_connections(connections: DataFrame) -> DataFrame:
    """One row per connection opened: instance, ts, conn_id, listener, host, tls, and what the
    proxy's connection limits counted as they admitted it, itself included: ``open_connections``
    (``max.connections``), ``open_ssl_connections`` (``max.ssl.connections``, TLS only) and
    ``open_ip_connections`` (``max.connections.per.ip``). Opens written before proxies recorded
    the counts have them null: no limit is judged on those (``_peak_per_ip`` counts them). ``instance``
    is the proxy's (``proxy_of``): with workers: N the owner writes the opens (files of an older
    version: each worker, naming the proxy)."""
    return connections.filter(F.col("event") == "open").select(
        proxy_of().alias("instance"),
        "ts",
        "conn_id",
        "listener",
        client_host(F.col("client_address")).alias("host"),
        "tls",
        *COUNTED,
    )


def _largest_first(value: Column, *ties: Column) -> Column:
    """An ordering for ``min_by``: the largest ``value`` first, then the least of ``ties`` (the earliest time,
    then the name); null, which ``min_by`` skips, where ``value`` is null. ``max_by`` alone takes whichever
    tied row the input gives last, an order a partition's layout changes (the same events converted in the
    driver and on a cluster named two hosts for one peak)."""
    return F.when(value.isNotNull(), F.struct((-value).alias("v"), *ties))


def _peak(row: Any, value: str, where: str, ts: str) -> Peak | None:
    if row is None or row[value] is None:
        return None
    return Peak(int(row[value]), str(row[where]), float(row[ts]) if row[ts] is not None else None)


_SIZE_COLUMNS = (("rq", "max_request_bytes"), ("rs", "max_response_bytes"))


def _top_pairs(windows: DataFrame) -> list[Any]:
    """The ``TOP`` client id and API pairs with the largest request and with the largest response
    among ``windows``: a row per pair and kind (``which``: rq, rs), ranked within the kind."""
    pairs = windows.groupBy("client_id", "api").agg(
        F.max("max_request_bytes").alias("rq"), F.max("max_response_bytes").alias("rs")
    )
    largest_of = F.array(*[F.struct(F.lit(w).alias("which"), F.col(w).alias("bytes")) for w in ("rq", "rs")])
    ranked = Window.partitionBy("which").orderBy(F.desc("bytes"), "client_id", "api")
    return (
        pairs.select("client_id", "api", F.inline(largest_of))
        .filter(F.col("bytes").isNotNull())
        .withColumn("rank", F.row_number().over(ranked))
        .filter(F.col("rank") <= TOP)
        .collect()
    )


def _floor(hist: dict[int, int], rows: int) -> int:
    """The least size of the highest size buckets of ``hist`` that hold at least ``rows`` windows."""
    seen = 0
    for k in sorted(hist, reverse=True):
        seen += hist[k]
        if seen >= rows:
            return 1 << (k - 1) if k > 0 else 0
    return 0


_TOPS_SCHEMA = StructType(
    [StructField(name, StringType()) for name in ("which", "top_client_id", "top_api")]
    + [StructField("bytes", LongType())]
)
_LONGEST_SCHEMA = StructType([StructField("kind", StringType()), StructField("length", LongType())])


def _largest(evidence: Evidence, floors: dict[str, int]) -> dict[str, list[dict[str, Any]]]:
    """The ``TOP`` client id and API pairs with the largest request and the largest response, each
    with the window it was seen in (the earliest among ties).

    Numbers first: only windows with a request or a response at least ``floors`` (a size some
    ``PAIR_ROWS`` windows reach) are grouped by pair; a pair's largest at or above its floor is then
    exact. Were fewer than ``TOP`` pairs there, every window is grouped (10 million events: the
    client ids and APIs of 7.6 million windows read and hashed for 14,000 pairs, 3-4 s of CPU).
    Their windows come from one more scan that keeps only the windows of those pairs at those sizes."""
    every = evidence.windows("client_api")
    top = []
    if any(floors.values()):  # 0: the smallest size bucket (or too few windows to leave any out)
        at_least = [F.col(column) >= floors[which] for which, column in _SIZE_COLUMNS]
        top = _top_pairs(every.filter(reduce(operator.or_, at_least)))
    above = {w: sum(1 for r in top if r["which"] == w and r["bytes"] >= floors[w]) for w in floors}
    if not top or any(above[w] < TOP for w in floors if floors[w]):
        top = _top_pairs(every)
    top.sort(key=lambda r: (r["which"], r["rank"]))
    tops = [(str(r["which"]), r["client_id"], r["api"], int(r["bytes"])) for r in top]
    largest: dict[str, list[dict[str, Any]]] = {"rq": [], "rs": []}
    if not tops:
        return largest
    # Again numbers first: only windows at least as large as the smallest of the top ones get to the join.
    smallest = {which: min(b for w, _, _, b in tops if w == which) for which, _, _, _ in tops}
    at_least = [F.col(column) >= smallest[which] for which, column in _SIZE_COLUMNS if which in smallest]
    windows = evidence.windows("client_api").filter(reduce(operator.or_, at_least))
    wanted = local_frame(windows.sparkSession, tops, _TOPS_SCHEMA)
    # null-safe: a client may send no client id, and its windows are counted under null
    pair = F.col("client_id").eqNullSafe(F.col("top_client_id")) & F.col("api").eqNullSafe(F.col("top_api"))
    size = F.when(F.col("which") == "rq", F.col("max_request_bytes")).otherwise(F.col("max_response_bytes"))
    seen = (
        windows.join(F.broadcast(wanted), pair)
        .filter(size == F.col("bytes"))
        .groupBy("which", "client_id", "api")
        .agg(F.min(F.struct("window_start", "instance", "requests")).alias("at"))
        .collect()
    )
    at = {(r["which"], r["client_id"], r["api"]): r["at"] for r in seen}
    for which, client_id, api, size_bytes in tops:
        window = at.get((which, client_id, api))
        largest[which].append(
            {
                "client_id": client_id,
                "api": api,
                "bytes": size_bytes,
                "requests": _int(window["requests"]) if window else 0,
                "instance": window["instance"] if window else None,
                "ts": window["window_start"] if window else None,
            }
        )
    return largest


# Sizes over the client_api windows: a joint histogram of the largest request and response (from the
# bulk counts, Evidence.bulk_counts), and the client ids and APIs with the largest of each (a scan to a
# table per client id and API). One aggregate keyed by client id, API and both size buckets took 2.5
# times the CPU of the two (10 million events: 250,000 groups where these have a few thousand and 14,000).


def _size_histograms(evidence: Evidence) -> dict[str, Any]:
    request_hist, response_hist, rows = _histograms(evidence)
    return {
        "request_size_hist": sorted(request_hist.items()),
        "response_size_hist": sorted(response_hist.items()),
        "client_api_rows": rows,
    }


def _histograms(evidence: Evidence) -> tuple[dict[int, int], dict[int, int], int]:
    """client_api windows per size bucket of their largest request and response, and in all."""
    request_hist: dict[int, int] = {}
    response_hist: dict[int, int] = {}
    rows = 0
    for r in evidence.bulk_counts:
        if r["section"] != "client_api":
            continue
        rows += int(r["n"])
        if r["rq"] is not None:
            request_hist[r["rq"]] = request_hist.get(r["rq"], 0) + int(r["n"])
        if r["rs"] is not None:
            response_hist[r["rs"]] = response_hist.get(r["rs"], 0) + int(r["n"])
    return request_hist, response_hist, rows


def _largest_sizes(evidence: Evidence) -> dict[str, Any]:
    request_hist, response_hist, _ = _histograms(evidence)
    floors = {"rq": _floor(request_hist, PAIR_ROWS), "rs": _floor(response_hist, PAIR_ROWS)}
    largest = _largest(evidence, floors)
    return {"largest_requests": largest["rq"], "largest_responses": largest["rs"]}


def _pool(evidence: Evidence, step: Callable[[], int]) -> dict[str, Any]:
    rows = evidence.windows("pool").filter(F.col("high_water_mark_bytes").isNotNull())
    hwm = F.col("high_water_mark_bytes")
    first = _largest_first(hwm, F.col("window_start"), F.col("instance"))
    stats = rows.agg(
        F.percentile_approx(hwm, [0.5, 0.9, 0.99, 0.999]).alias("p"),
        F.max(hwm).alias("max"),
        F.min_by("instance", first).alias("instance"),
        F.min_by("window_start", first).alias("at"),
        F.max("capacity_bytes").alias("capacity"),
        F.sum("waits").alias("waits"),
    ).collect()[0]
    series = sorted(
        rows.groupBy(bucket(F.col("window_start"), step()).alias("t"))
        .agg(F.max(hwm).alias("max"), F.percentile_approx(hwm, 0.5).alias("median"), F.sum("waits").alias("waits"))
        .collect(),
        key=lambda r: r["t"],
    )
    percentiles = {}
    if stats["p"] is not None:
        percentiles = dict(zip(("p50", "p90", "p99", "p99.9"), (int(v) for v in stats["p"]), strict=True))
        percentiles["max"] = int(stats["max"])
    capacity = stats["capacity"]
    return {
        "pool_percentiles": percentiles,
        "pool_capacity": int(capacity) if capacity is not None and capacity > 0 else None,
        "pool_waits": _int(stats["waits"]),
        "pool_peak": _peak(stats, "max", "instance", "at"),
        "pool_series": [(float(r["t"]), _int(r["max"]), _int(r["median"]), _int(r["waits"])) for r in series],
    }


def _peak_per_ip(opens: DataFrame) -> dict[str, Any]:
    """The most connections open at once from one client host, and how many opens carry no counts.
    Numbers first, then the host and time among the opens at that peak: naming the host of every open
    (its address cut, joined to the proxy's name, in a struct to order by) was most of the query (10 million
    events, 592,000 opens: 0.9 s of JVM CPU, warm; the two queries 0.3-0.4 s)."""
    counts = opens.agg(
        F.max("open_ip_connections").alias("v"),
        F.count_if(F.col("open_ip_connections").isNull()).alias("uncounted"),
    ).collect()[0]
    peak = None
    if counts["v"] is not None:
        where = F.concat_ws(" on ", "host", "instance")
        first = _largest_first(F.col("open_ip_connections"), F.col("ts"), where)
        at = (
            opens.filter(F.col("open_ip_connections") == counts["v"])
            .agg(
                F.max("open_ip_connections").alias("v"),
                F.min_by(where, first).alias("w"),
                F.min_by("ts", first).alias("t"),
            )
            .collect()[0]
        )
        peak = _peak(at, "v", "w", "t")
    return {"peak_per_ip": peak, "uncounted_opens": _int(counts["uncounted"])}


def _connections(evidence: Evidence, step: Callable[[], int]) -> dict[str, Any]:
    per_window = (
        evidence.windows("connections")
        .groupBy(proxy_of().alias("instance"), "window_start", F.coalesce(F.col("tls"), F.lit(False)).alias("tls"))
        .agg(F.sum("max_open").alias("open"))
        .cache()
    )
    # The peaks over all listeners and over TLS ones, per proxy and window, in one query (a window
    # without TLS connections has a null TLS count, which max and min_by skip).
    peaks = (
        per_window.groupBy("instance", "window_start")
        .agg(F.sum("open").alias("all"), F.sum(F.when(F.col("tls"), F.col("open"))).alias("tls"))
        .agg(
            *[
                column
                for count in ("all", "tls")
                for column in (
                    F.max(count).alias(f"{count}_v"),
                    F.min_by("instance", _largest_first(F.col(count), F.col("window_start"), F.col("instance"))).alias(
                        f"{count}_w"
                    ),
                    F.min_by(
                        "window_start", _largest_first(F.col(count), F.col("window_start"), F.col("instance"))
                    ).alias(f"{count}_t"),
                )
            ]
        )
        .collect()[0]
    )
    reasons = (
        evidence.connections.filter(F.col("event") == "close")
        .groupBy(F.coalesce(F.col("reason"), F.lit("(none)")).alias("reason"))
        .count()
        .orderBy(F.desc("count"))
        .limit(20)
        .collect()
    )
    series = sorted(
        per_window.groupBy(bucket(F.col("window_start"), step()).alias("t"), "instance", "tls")
        .agg(F.max("open").alias("open"))
        .groupBy("t", "tls")
        .agg(F.sum("open").alias("fleet"), F.max("open").alias("busiest"))
        .collect(),
        key=lambda r: (r["t"], r["tls"]),
    )
    per_window.unpersist()
    return {
        "connection_series": [(float(r["t"]), bool(r["tls"]), _int(r["fleet"]), _int(r["busiest"])) for r in series],
        "peak_tls": _peak(peaks, "tls_v", "tls_w", "tls_t"),
        "peak_connections": _peak(peaks, "all_v", "all_w", "all_t"),
        "close_reasons": [(str(r["reason"]), int(r["count"])) for r in reasons],
    }


def _groups(evidence: Evidence, step: Callable[[], int]) -> dict[str, Any]:
    kind = F.coalesce(F.col("group_kind"), F.lit("classic"))
    per_window = (
        evidence.windows("group")
        .filter(F.col("group_id").isNotNull() & F.col("max_members").isNotNull())
        .groupBy("group_id", kind.alias("kind"), "window_start")
        .agg(F.max("max_members").alias("members"))
    )
    per_group = (
        per_window.groupBy("group_id", "kind")
        .agg(
            F.max("members").alias("peak"),
            F.min_by("window_start", _largest_first(F.col("members"), F.col("window_start"))).alias("at"),
        )
        .cache()
    )
    top = per_group.orderBy(F.desc("peak"), "group_id").limit(TOP).collect()
    by_kind = (
        per_group.groupBy("kind")
        .agg(
            F.max("peak").alias("v"),
            F.min_by("group_id", _largest_first(F.col("peak"), F.col("at"), F.col("group_id"))).alias("w"),
            F.min_by("at", _largest_first(F.col("peak"), F.col("at"), F.col("group_id"))).alias("t"),
        )
        .collect()
    )
    hist = sorted(per_group.groupBy("peak").count().collect(), key=lambda r: r["peak"])
    groups = sum(int(r["count"]) for r in hist)
    shown = [r["group_id"] for r in top[:8]]
    series_rows = sorted(
        per_window.filter(F.col("group_id").isin(*shown))
        .groupBy("group_id", bucket(F.col("window_start"), step()).alias("t"))
        .agg(F.max("members").alias("members"))
        .collect()
        if shown
        else [],
        key=lambda r: r["t"],
    )
    series: dict[str, list[tuple[float, int]]] = {g: [] for g in shown}
    for r in series_rows:
        series[r["group_id"]].append((float(r["t"]), int(r["members"])))
    per_group.unpersist()
    return {
        "largest_groups": [
            {"group_id": r["group_id"], "kind": r["kind"], "peak": int(r["peak"]), "ts": r["at"]} for r in top
        ],
        "largest_by_kind": {str(r["kind"]): Peak(int(r["v"]), str(r["w"]), r["t"]) for r in by_kind},
        "group_series": series,
        "group_peak_hist": [(int(r["peak"]), int(r["count"])) for r in hist],
        "groups": groups,
    }


def _identifiers(evidence: Evidence) -> dict[str, Any]:
    """Lengths per identifier kind (windows, and the decisions' breaches), and the longest of each kind."""
    kind = F.col("identifier_kind")
    named = F.when(F.lower(kind).isin("client_id", "client id"), F.col("client_id")).when(
        F.lower(kind).isin("group_id", "group id"), F.col("group_id")
    )
    rows = (
        evidence.windows("identifier")
        .select(kind.alias("kind"), F.col("max_length").alias("length"), "client_id", "identifier")
        .unionByName(
            evidence.decisions.select(
                kind.alias("kind"),
                F.col("identifier_length").alias("length"),
                "client_id",
                F.coalesce(F.col("identifier"), named).alias("identifier"),
            )
        )
        .filter(F.col("kind").isNotNull() & F.col("length").isNotNull())
    )
    # Rows per kind and length: the windows' from the bulk counts, the decisions' counted here; then one
    # scan names the least client id and identifier at each kind's longest length, from the few rows there.
    windows_hist: list[Any] = [
        {"kind": r["identifier_kind"], "length": r["max_length"], "count": r["n"]}
        for r in evidence.bulk_counts
        if r["section"] == "identifier" and r["identifier_kind"] is not None and r["max_length"] is not None
    ]
    decisions_hist = (
        evidence.decisions.filter(F.col("identifier_kind").isNotNull() & F.col("identifier_length").isNotNull())
        .groupBy(kind.alias("kind"), F.col("identifier_length").alias("length"))
        .agg(F.count(F.lit(1)).alias("count"))
        .collect()
    )
    hist = [*windows_hist, *decisions_hist]
    longest_of: dict[str, int] = {}
    for r in hist:
        longest_of[r["kind"]] = max(longest_of.get(r["kind"], 0), int(r["length"]))
    at_longest: list[Any] = []
    if longest_of:
        spark = rows.sparkSession
        wanted = local_frame(spark, list(longest_of.items()), _LONGEST_SCHEMA)
        at_longest = (
            rows.join(F.broadcast(wanted), ["kind", "length"])
            .groupBy("kind", "length")
            .agg(F.min("client_id").alias("client_id"), F.min("identifier").alias("identifier"))
            .collect()
        )
    histograms: dict[str, dict[int, int]] = {}
    for r in hist:
        per_length = histograms.setdefault(normalized_kind(r["kind"]), {})
        per_length[int(r["length"])] = per_length.get(int(r["length"]), 0) + int(r["count"])
    longest: dict[str, dict[str, Any]] = {}
    for r in at_longest:
        name = normalized_kind(r["kind"])
        if name not in longest or r["length"] > longest[name]["length"]:
            longest[name] = {
                "length": int(r["length"]),
                "client_id": r["client_id"],
                "identifier": r["identifier"],
                "key": limit_key_of(r["kind"]),
            }
    return {
        "identifier_hist": {k: sorted(v.items()) for k, v in sorted(histograms.items())},
        "longest": dict(sorted(longest.items())),
    }


def _decisions(evidence: Evidence) -> list[dict[str, Any]]:
    rows = (
        evidence.decisions.groupBy("policy", "limit_key", "limit", "mode", "action")
        .agg(
            F.count(F.lit(1)).alias("count"),
            F.min("ts").alias("first"),
            F.max("ts").alias("last"),
            F.approx_count_distinct("client_id").alias("client_ids"),
        )
        .collect()
    )
    return [r.asDict() for r in sorted(rows, key=lambda r: -r["count"])]


def measure_traffic(evidence: Evidence, opens: DataFrame, threads: int = 3) -> Traffic:
    """Every aggregate the report shows and recommends from (a few Spark jobs each), from ``threads``
    Python threads: while Spark runs one query, the driver plans and compiles the next (alone, a
    report's 2 cores sat idle for a fifth of its time, the driver's one thread busy between jobs).
    The overview (from Parquet, a query of its own) runs beside the parts that do not need its time
    buckets."""
    _ = evidence.rest  # made (and for JSON lines cached) once, before the threads share it

    def step() -> int:
        return evidence.overview.bucket_seconds

    # The bulk windows' counts first (the longest query; the overview, the size and identifier parts
    # wait for them) and the coverage beside them (a scan of every window: run last, it was the step's
    # tail, 10 million events); then the parts that need only the time buckets, which ask for them at
    # their last query: their other queries run meanwhile, not after.
    parts: list[Callable[[], dict[str, Any]]] = [
        lambda: _size_histograms(evidence),
        lambda: {"coverage": measure_coverage(evidence)},
        lambda: {"overview": evidence.overview},
        lambda: _peak_per_ip(opens),
        lambda: _connections(evidence, step),
        lambda: _groups(evidence, step),
        lambda: _pool(evidence, step),
        lambda: {"decisions": _decisions(evidence)},
        lambda: _largest_sizes(evidence),
        lambda: _identifiers(evidence),
    ]
    with ThreadPoolExecutor(threads, thread_name_prefix="traffic") as pool:
        measured = list(pool.map(lambda part: part(), parts))
    return Traffic(bucket_seconds=step(), **{k: v for m in measured for k, v in m.items()})


def nice_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    if n < 1024:
        return f"{int(n)} B"
    exp = min(int(math.log(n, 1024)), 4)
    return f"{n / 1024**exp:.1f} {('B', 'KiB', 'MiB', 'GiB', 'TiB')[exp]}"
