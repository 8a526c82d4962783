"""Audit events from a Kafka topic (the proxies' topic sink), read with Spark's Kafka source.

Each record's value is one schema v2 event as JSON, keyed by its proxy's instance id. The values are
written as JSON lines into the report's scratch directory, one directory per Kafka partition, and read
from there as audit files are (pipeline.json_lines, pipeline.events): one parser and one set of rules for
both inputs, so the same events make the same tables. A value that is not a valid event is a problem of
its topic partition, named as such.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from .events import EventsPathError

__all__ = ["SCHEME", "Topic", "is_topic", "parse_topic", "topic_lines"]

SCHEME = "kafka://"
# Kafka's rule for topic names (kafka.common.internals.Topic)
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")
_HOST_PORT = re.compile(r"(?P<host>\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):(?P<port>\d{1,5})")
# A record's Kafka timestamp is when its proxy produced it (CreateTime), after the event's own time, or
# when the broker appended it (LogAppendTime, the broker's clock): --since starts each partition at the
# first record this much earlier, to allow for clocks apart. Selecting by the events' own time is exact;
# this only skips what cannot be selected.
_TIMESTAMP_SLACK_SECONDS = 3600.0


@dataclass(frozen=True)
class Topic:
    bootstrap: str  # host:port[,host:port...]
    name: str

    @property
    def url(self) -> str:
        return f"{SCHEME}{self.bootstrap}/{self.name}"


def is_topic(events: str) -> bool:
    return events.startswith(SCHEME)


def parse_topic(url: str, option: str = "--events") -> Topic:
    """``kafka://HOST:PORT[,HOST:PORT...]/TOPIC`` -> :class:`Topic`; a bad one raises EventsPathError naming it."""
    bootstrap, slash, name = url.removeprefix(SCHEME).partition("/")
    servers = bootstrap.split(",")
    if (
        not slash
        or not _TOPIC_NAME.fullmatch(name)
        or name in (".", "..")
        or not all((m := _HOST_PORT.fullmatch(s)) and 0 < int(m["port"]) < 65536 for s in servers)
    ):
        raise EventsPathError(f"{option} {url}: a topic is kafka://HOST:PORT[,HOST:PORT...]/TOPIC")
    return Topic(bootstrap, name)


def topic_lines(spark: SparkSession, topic: Topic, target: str, since: float | None = None) -> dict[str, str]:
    """Write ``topic``'s values (from ``since`` on, give or take the clocks' slack) as JSON lines under
    ``target``, one directory per Kafka partition, in Spark's tasks (on a cluster, its executors read the
    topic). Returns each file written -> what a problem in it is a problem of: the topic and partition."""
    reader = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", topic.bootstrap)
        .option("subscribe", topic.name)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
    )
    if since is not None:
        start_ms = int((since - _TIMESTAMP_SLACK_SECONDS) * 1000)
        # A partition with nothing that late starts at its end: nothing read from it
        reader = reader.option("startingTimestamp", str(max(0, start_ms)))
        reader = reader.option("startingOffsetsByTimestampStrategy", "latest")
    value = F.col("value").cast("string")
    # A line break inside a value (whitespace between JSON tokens) would make two lines of it. Looked for
    # first, in the value's bytes: replacing in every value cost more than the rest of the write (1 million
    # events: the write took 8.7 s with translate(), 5.1 s with regexp_replace(), 4.5 s with instr() on
    # the string, which walks it character by character: 7.8-8.0 s of JVM CPU against 3.7-4.0 s with
    # contains() on the bytes, the same as writing the values as they are)
    broken = F.col("value").contains(F.lit(bytearray(b"\n"))) | F.col("value").contains(F.lit(bytearray(b"\r")))
    values = (
        reader.load()
        .filter(F.col("value").isNotNull())  # a tombstone is no event, as a blank line is none
        .select(F.when(broken, F.regexp_replace(value, "[\r\n]", " ")).otherwise(value).alias("value"), "partition")
    )
    try:
        values.write.mode("overwrite").partitionBy("partition").text(target)
    except PySparkException as exc:  # PySpark raises the JVM's errors as these
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise EventsPathError(f"--events {topic.url}: the topic could not be read: {first[:300]}") from exc
    labels = {}
    for directory in sorted(Path(target).glob("partition=*")):
        partition = directory.name.removeprefix("partition=")
        for file in directory.iterdir():
            if not file.name.startswith((".", "_")):
                labels[str(file.resolve())] = f"{topic.url} partition {partition}"
    return labels
