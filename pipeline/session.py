"""The one SparkSession of a report run: ``local[*]`` embedded by default, or a
Spark standalone cluster (``spark://HOST:7077``) running the same job unchanged."""

from __future__ import annotations

import os
import shutil
from typing import Any
from urllib.parse import urlparse

from pyspark.sql import SparkSession

__all__ = ["SHORT_JOB_BYTES", "JavaMissingError", "driver_memory_for", "jvm_cpu_seconds", "spark_session"]

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class JavaMissingError(RuntimeError):
    """Spark needs a Java runtime (17 or 21) and none was found."""


def _check_java() -> None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(os.path.join(java_home, "bin", "java"), os.X_OK):
        return
    if shutil.which("java") is None:
        raise JavaMissingError(
            "Spark needs a Java runtime (17 or 21) and neither JAVA_HOME nor `java` on PATH was found;"
            " on Debian: apt-get install -y default-jre-headless"
        )


# Below this much input a run lasts seconds: the JVM's optimizing compiler (C2) would spend
# more CPU compiling Spark's generated code than it saves (measured: half the CPU of a
# 24,000-event report). Larger inputs keep the default tiered compilation.
SHORT_JOB_BYTES = 256 * 1024 * 1024
_QUICK_JIT = "-XX:TieredStopAtLevel=1"


_GIB = 1 << 30


def driver_memory_for(input_bytes: int) -> str:
    """The driver's heap for an input of ``input_bytes``: in local mode the driver does all the work and
    caches the parsed events (about the size of their JSON lines), so 2 GiB plus twice the input, from
    4 GiB up to three quarters of this machine's memory. A cache that does not fit spills to disk: 10
    million events (3.2 GB of JSON) took twice as long with 4 GiB."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        physical = 8 * _GIB
    wanted = 2 * _GIB + 2 * input_bytes
    return f"{max(4, min(wanted, physical * 3 // 4) // _GIB)}g"


def spark_session(
    master: str = "local[*]", *, progress: bool = True, driver_memory: str = "4g", short_job: bool = False
) -> SparkSession:
    """Start (or reuse) the session the pipeline runs in.

    Settings that matter for speed: no adaptive execution (AQE), and as many shuffle
    partitions as the session has cores (set once it runs, so a cluster gets its own
    count). Every aggregate the report keeps is small: with AQE each of its ~40
    queries became several Spark jobs (91 for one report), and 16 partitions per
    aggregate meant 900 tasks where 190 do (a report of 6,000 events: 50 s -> 40 s).
    No web UI. Files that vanish (rotated away) or cannot be decoded while being
    read are skipped and reported by :mod:`pipeline.events`, not fatal.
    """
    _check_java()
    builder = (
        SparkSession.builder.master(master)
        .appName("kafka-admission-proxy report")
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.adaptive.enabled", "false")
        # Cached events stored as they are: dictionary-encoding them took longer than every query
        # over them saved (1 million events: 8.0 s to cache compressed, 5.5 s not).
        .config("spark.sql.inMemoryColumnarStorage.compressed", "false")
        # The connection counts run window functions over each proxy's lifecycle events: above
        # 4,096 rows a partition (the default) Spark buffers it in a slower sorter-backed array
        # (10 million events: the window stage's CPU 12.6 s -> 9.4 s with a million rows in memory).
        .config("spark.sql.windowExec.buffer.in.memory.threshold", str(1 << 20))
        .config("spark.sql.files.ignoreMissingFiles", "true")
        .config("spark.sql.files.ignoreCorruptFiles", "true")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "true" if progress else "false")
    )
    if short_job:
        builder = builder.config("spark.driver.extraJavaOptions", _QUICK_JIT).config(
            "spark.executor.extraJavaOptions", _QUICK_JIT
        )
    host = urlparse(master).hostname if master.startswith("spark://") else "127.0.0.1"
    if host in _LOOPBACK:
        # Executors on this machine reach the driver on loopback, whatever the hostname resolves to.
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.conf.set("spark.sql.shuffle.partitions", str(max(2, spark.sparkContext.defaultParallelism)))
    return spark


def jvm_cpu_seconds(spark: SparkSession) -> float | None:
    """CPU time (user + system) of the local Spark JVM so far, from /proc; None where unknown.

    In local mode the JVM does all of the work, so this is the job's CPU cost whatever
    else the machine is running (wall time on a shared machine is not)."""
    gateway: Any = getattr(spark.sparkContext, "_gateway", None)
    pid = getattr(getattr(gateway, "proc", None), "pid", None)
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
