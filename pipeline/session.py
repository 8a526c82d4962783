"""The one SparkSession of a report run: ``local[*]`` embedded by default, or a
Spark standalone cluster (``spark://HOST:7077``) running the same job unchanged."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyspark
from pyspark import SparkContext
from pyspark.sql import SparkSession

__all__ = [
    "SHORT_JOB_BYTES",
    "SMALL_INPUT_BYTES",
    "JavaMissingError",
    "KafkaSourceMissingError",
    "archive_key",
    "class_archive_path",
    "driver_memory_for",
    "jvm_cpu_seconds",
    "kafka_source_jars",
    "release_jvm",
    "sized_for",
    "spark_session",
    "stop_session",
]

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class JavaMissingError(RuntimeError):
    """Spark needs a Java runtime (17 or 21) and none was found."""


class KafkaSourceMissingError(RuntimeError):
    """A topic to read and no jars of Spark's Kafka source (tools/fetch-spark-kafka fetches them)."""


# Where tools/fetch-spark-kafka puts Spark's Kafka source, in a checkout (the package installed editable);
# elsewhere (an image, a cluster's driver) this variable names a directory of the same jars.
KAFKA_JARS_VARIABLE = "KAFKA_ADMISSION_PROXY_SPARK_KAFKA_JARS"
_CHECKOUT_KAFKA_JARS = Path(__file__).resolve().parent.parent / ".cache" / "spark-kafka"


def kafka_source_jars() -> list[str]:
    """The jars of Spark's Kafka source (spark-sql-kafka-0-10, kafka-clients...), as fetched at set-up:
    never downloaded when a report runs (spark.jars.packages would, from the driver, every time)."""
    directory = Path(os.environ.get(KAFKA_JARS_VARIABLE) or _CHECKOUT_KAFKA_JARS)
    return sorted(str(jar) for jar in directory.glob("*.jar")) if directory.is_dir() else []


def _java() -> str:
    """The java binary Spark will run (JAVA_HOME's, else the one on PATH)."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(os.path.join(java_home, "bin", "java"), os.X_OK):
        return os.path.join(java_home, "bin", "java")
    found = shutil.which("java")
    if found is None:
        raise JavaMissingError(
            "Spark needs a Java runtime (17 or 21) and neither JAVA_HOME nor `java` on PATH was found;"
            " on Debian: apt-get install -y default-jre-headless"
        )
    return found


# Spark's driver JVM loads its classes from 280 jars, a lookup through the jars for each: 3-4 s
# to start a session and 3-4 s more in a report's first queries (10 million events from Parquet, two
# alternating runs each: start 6.2-6.9 s -> 2.1-3.3 s, first query 9.4-9.7 s -> 5.6-6.4 s; bench/RESULTS.md).
# The JDK's class data sharing (CDS) maps them from an archive instead: the first report on a machine
# writes it as its JVM exits, later ones map it. A stale or broken archive is refused by the JVM, which
# then loads classes as usual.
_QUIET_CDS = "-Xlog:cds=off -Xlog:cds+dynamic=off -Xlog:class+path=off"
_archive_being_written: tuple[Path, Path] | None = None  # (being written, where it goes)


_ARCHIVE_NAME = "spark-{version}-classes-{key}.jsa"


def class_archive_path() -> Path:
    """Where this machine's archive of Spark's classes is: one per PySpark install (its jars are the
    classpath the JVM checks the archive against) and Java binary."""
    install = os.path.dirname(os.path.realpath(pyspark.__file__))
    key = archive_key(install, pyspark.__version__, os.path.realpath(_java()))
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "kafka-admission-proxy" / _ARCHIVE_NAME.format(version=pyspark.__version__, key=key)


def archive_key(install: str, version: str, java: str) -> str:
    """What an archive is made for, as ``<place>-<made for>``: the PySpark install's path, then when its
    jars were put there (a new .venv at the same path, such as a fresh clone's, has jars the JVM would
    refuse an older archive for: the demo's report then started without one, 3.7 s instead of 1.5) and
    the Java binary. The place (the install's path and the Java binary's) lets a new archive replace the one
    of the .venv it replaced, and leaves another Java runtime's alone (JAVA_HOME switched and back)."""
    try:
        jars = os.stat(os.path.join(install, "jars")).st_mtime_ns
    except OSError:
        jars = 0  # a PySpark without jars of its own (a Spark distribution's): its path alone
    binary = os.stat(java)
    made_for = f"{jars} {version} {java} {binary.st_size} {binary.st_mtime_ns}"
    return f"{_short_hash(f'{install} {java}')}-{_short_hash(made_for)}"


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _classpath_directories() -> list[str]:
    """Directories Spark's launcher puts on the driver's classpath (its configuration directories, extra
    class paths). The JDK writes no class archive for a classpath with a non-empty directory, and maps
    none written without it: with one, sessions load classes as usual (they refused, deleted and failed
    to write the archive in turn, every run)."""
    spark_home = os.environ.get("SPARK_HOME") or os.path.dirname(os.path.realpath(pyspark.__file__))
    candidates = [os.environ.get("SPARK_CONF_DIR") or os.path.join(spark_home, "conf")]
    candidates += [os.environ.get(name, "") for name in ("HADOOP_CONF_DIR", "YARN_CONF_DIR")]
    for name in ("SPARK_DIST_CLASSPATH", "SPARK_CLASSPATH"):
        candidates += os.environ.get(name, "").split(os.pathsep)
    return [c for c in candidates if c and os.path.isdir(c) and os.listdir(c)]


def _class_archive_options(archive: Path) -> str:
    """The driver JVM's options to map ``archive``, or to write it as it exits when there is none."""
    global _archive_being_written
    if _classpath_directories():
        return ""
    if archive.is_file():
        try:
            os.utime(archive)  # when it was last used, for _drop_unused_archives
        except OSError:
            pass
        return f"-XX:SharedArchiveFile={archive} {_QUIET_CDS}"
    try:
        archive.parent.mkdir(parents=True, exist_ok=True)
        for left in archive.parent.glob(f"{archive.name}.*.part"):  # of runs that ended before moving theirs
            writer = left.name.split(".")[-2]
            if not writer.isdigit() or not _alive(int(writer)):
                left.unlink(missing_ok=True)
    except OSError:
        return ""  # no cache directory to keep it in: classes load as usual
    partial = archive.with_name(f"{archive.name}.{os.getpid()}.part")
    _archive_being_written = (partial, archive)
    return f"-XX:ArchiveClassesAtExit={partial} {_QUIET_CDS}"


# Below this much input as Parquet (Inputs.parquet_bytes) the JVM's optimizing compiler (C2) spends
# more CPU compiling each query's generated code than it saves before the query ends: C1 alone was
# faster in every report measured on 2 cores (bench/RESULTS.md), from 24,000 events (half the CPU) to
# 40 million as Parquet (10, 20, 40 million: 32.3 vs 35.2 s, 39.8 vs 45.5-47.3 s, 63.9 vs 73.9 s)
# and 10 million from JSON lines (49.9-53.5 s vs 56.6-61.5 s, back to back).
# Larger inputs, not measured, keep the JVM's default tiered compilation.
SHORT_JOB_BYTES = 640 * 1024 * 1024
# C1 alone gets a 48 MB code cache, not tiered compilation's 240 MB. A long session compiles every
# query's generated code into it (the tests' one session, ~70 reports: full, then "Out of space in
# CodeCache for adapters", a VirtualMachineError that ends the JVM); the size is reserved address
# space, not memory taken.
_QUICK_JIT = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
# A report is a batch job: throughput, not pause times. The JDK's default collector (G1) costs every
# reference store a write barrier, which C1's code runs out of line (10 million events from Parquet,
# 4 pairs back to back: 26.0-29.5 s with the parallel collector against 29.0-33.4 s with G1).
_THROUGHPUT_GC = "-XX:+UseParallelGC"
# Class metadata past 21 MB (the JVM's first threshold) costs a full collection, and Spark's passes it twice
# at start (the demo's report: two full pauses of 1 s each on a loaded machine, from -Xlog:gc); the
# threshold is not memory taken.
_METASPACE = "-XX:MetaspaceSize=256m"
# Options the JVM reads besides Spark's: a collector chosen there stays (with two, the JVM refuses to start).
_OPERATOR_JVM_OPTIONS = ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS", "PYSPARK_SUBMIT_ARGS")


def _collector_options(env: Mapping[str, str]) -> list[str]:
    """The parallel collector, unless the operator's JVM options choose a collector."""
    chosen = " ".join(env.get(name, "") for name in _OPERATOR_JVM_OPTIONS)
    return [] if re.search(r"-XX:\+Use\w*GC\b", chosen) else [_THROUGHPUT_GC]


_GIB = 1 << 30


def driver_memory_for(input_bytes: int) -> str:
    """The driver's heap for an input of ``input_bytes``: 2 GiB plus twice the input, from 4 GiB up to
    three quarters of this machine's memory. Sized when the report cached every parsed event (10 million
    events, 3.2 GB of JSON, took twice as long with 4 GiB then). JSON lines are now converted to Parquet
    in Spark's tasks and no event is held in memory: the same report ran in 60.7 s twice with 4 GiB,
    52-64 s with the 8 GiB this gives. The rule stays as room for the queries' aggregates on large fleets."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        physical = 8 * _GIB
    wanted = 2 * _GIB + 2 * input_bytes
    return f"{max(4, min(wanted, physical * 3 // 4) // _GIB)}g"


def spark_session(
    master: str = "local[*]",
    *,
    progress: bool = True,
    driver_memory: str = "4g",
    short_job: bool = False,
    class_archive: bool = False,
    kafka_source: bool = False,
) -> SparkSession:
    """Start (or reuse) the session the pipeline runs in.

    Settings that matter for speed: no adaptive execution (AQE), and as many shuffle
    partitions as the session has cores (set once it runs, so a cluster gets its own
    count). Every aggregate the report keeps is small: with AQE each of its ~40
    queries became several Spark jobs (91 for one report), and 16 partitions per
    aggregate meant 900 tasks where 190 do (a report of 6,000 events: 50 s -> 40 s).
    No web UI. Files that vanish (rotated away) or cannot be decoded while being
    read are skipped and reported by :mod:`pipeline.events`, not fatal. With
    ``class_archive``, a JVM started here maps (or, the first time, writes) the
    archive of Spark's classes; :func:`stop_session` puts a new one in place. With
    ``kafka_source``, Spark's Kafka source (:func:`kafka_source_jars`) is given to the session with
    ``spark.jars``, which reach a cluster's executors as well.
    """
    _java()
    # Spark's Python tasks (pipeline.json_lines) run this interpreter, which has pyarrow, unless the
    # operator names another; on a cluster the same path must exist on every worker. PySpark reads the
    # variable, not a setting, when the session starts.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName("kafka-admission-proxy report")
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.adaptive.enabled", "false")
        # Cached events stored as they are: dictionary-encoding them took longer than every query
        # over them saved (1 million events: 8.0 s to cache compressed, 5.5 s not).
        .config("spark.sql.inMemoryColumnarStorage.compressed", "false")
        # Window functions (the rankings of the largest pairs and of the impact's subjects) buffer
        # each partition: above 4,096 rows (the default) in a slower sorter-backed array.
        .config("spark.sql.windowExec.buffer.in.memory.threshold", str(1 << 20))
        # The audit files are local paths, listed by the driver in milliseconds: above 32 paths Spark
        # lists them in a job of one task per path instead (60 files: 0.9 s).
        .config("spark.sql.sources.parallelPartitionDiscovery.threshold", str(100_000))
        .config("spark.sql.files.ignoreMissingFiles", "true")
        .config("spark.sql.files.ignoreCorruptFiles", "true")
        # PySpark records the Python call site of every function building a column, for error messages:
        # 5 round trips to the JVM and a stack walk each, 3,700 of the impact's 6,500 round trips while
        # it builds its plans, the cores idle (10 million events: impact 7.0-7.1 s -> 5.2-5.8 s)
        .config("spark.python.sql.dataFrameDebugging.enabled", "false")
        # Spark checks every analyzer and optimizer rule's output for its own bugs (duplicate ids...): a
        # quarter of planning the impact's tables, which the driver does alone (2.1 -> 1.6 s, warm)
        .config("spark.sql.lightweightPlanChangeValidation", "false")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "true" if progress else "false")
    )
    if kafka_source:
        jars = kafka_source_jars()
        if not jars:
            raise KafkaSourceMissingError(
                f"Spark's Kafka source is not installed: run tools/fetch-spark-kafka (make spark-kafka),"
                f" or set {KAFKA_JARS_VARIABLE} to a directory of its jars"
            )
        builder = builder.config("spark.jars", ",".join(jars))
    driver_options = [*_collector_options(os.environ), _METASPACE, *([_QUICK_JIT] if short_job else [])]
    mapping = None
    if class_archive and SparkContext._gateway is None:  # options reach a JVM only when this starts it
        archive = class_archive_path()
        options = _class_archive_options(archive)
        if options:
            driver_options.append(options)
            mapping = archive
    builder = builder.config("spark.driver.extraJavaOptions", " ".join(driver_options))
    builder = builder.config(
        "spark.executor.extraJavaOptions", " ".join([_METASPACE, *([_QUICK_JIT] if short_job else [])])
    )
    host = urlparse(master).hostname if master.startswith("spark://") else "127.0.0.1"
    if host in _LOOPBACK:
        # Executors on this machine reach the driver on loopback, whatever the hostname resolves to.
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    spark = builder.getOrCreate()
    if mapping is not None and mapping.is_file():
        _drop_refused_archive(spark, mapping)
    spark.sparkContext.setLogLevel("ERROR")
    # py4j logs each connection to the JVM it closes at INFO ("Closing down clientserver connection"):
    # nothing an operator acts on, and several such lines in the middle of the report's own.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    spark.conf.set("spark.sql.shuffle.partitions", str(max(2, spark.sparkContext.defaultParallelism)))
    return spark


# Below this much input as Parquet (Inputs.parquet_bytes; the demo's 37 events, the tests' fleet of 7,000)
# a report's ~30 queries are fixed cost: Spark generating and compiling Java for each, and a shuffle's
# tasks for each core over a handful of rows. Interpreted, in one partition, they take less CPU
# (bench/RESULTS.md: the demo's report).
SMALL_INPUT_BYTES = 4 << 20
_SMALL_INPUT_SETTINGS = {
    "spark.sql.shuffle.partitions": "1",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}


@contextmanager
def sized_for(spark: SparkSession, parquet_bytes: int | None) -> Iterator[None]:
    """The session's settings for an input of about ``parquet_bytes`` as Parquet (None: not known, such as
    a topic's), while a report runs over it; the session's own again after."""
    if parquet_bytes is None or parquet_bytes >= SMALL_INPUT_BYTES:
        yield
        return
    before = {name: spark.conf.get(name, None) for name in _SMALL_INPUT_SETTINGS}
    for name, value in _SMALL_INPUT_SETTINGS.items():
        spark.conf.set(name, value)
    try:
        yield
    finally:
        for name, was in before.items():
            if was is None:
                spark.conf.unset(name)
            else:
                spark.conf.set(name, was)


def _jvm_pid(spark: SparkSession) -> int | None:
    gateway: Any = getattr(spark.sparkContext, "_gateway", None)
    pid = getattr(getattr(gateway, "proc", None), "pid", None)
    return pid if isinstance(pid, int) else None


def _drop_refused_archive(spark: SparkSession, archive: Path) -> None:
    """An archive the JVM did not map (stale, or broken) is deleted, so the next run writes a new one."""
    pid = _jvm_pid(spark)
    if pid is None:
        return
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return  # no /proc here: nothing to tell by
    if str(archive) not in maps:
        archive.unlink(missing_ok=True)


def stop_session(spark: SparkSession, say: Callable[[str], None] = lambda _: None, timeout: float = 300.0) -> None:
    """End a report's session. When its JVM is writing the class archive, stop Spark, let the JVM exit
    (it writes the archive as it does: 10-20 s) and move the archive into place for the next run."""
    global _archive_being_written
    if _archive_being_written is None:
        return
    partial, archive = _archive_being_written
    _archive_being_written = None
    say(f"saving Spark's classes for faster starts, once per machine ({archive})")
    gateway: Any = spark.sparkContext._gateway
    proc = getattr(gateway, "proc", None)
    spark.stop()
    if proc is None:
        return
    proc.stdin.close()  # Spark's gateway exits when its stdin closes
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return
    if proc.returncode == 0 and partial.is_file():
        os.replace(partial, archive)
        _drop_unused_archives(archive)
    else:
        partial.unlink(missing_ok=True)


def release_jvm() -> None:
    """The process is ending: shut py4j's gateway down first. Spark's JVM exits when the process's stdin
    closes, running Spark's shutdown hooks (its temporary directories deleted) as ever, but its exit then
    idles some 0.3 s while py4j's threads stay blocked reading their sockets (bench/RESULTS.md: HotSpot
    waits for threads in native code as it exits). A JVM already gone (its class archive written) is
    left be."""
    gateway: Any = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if proc is not None and proc.poll() is None:
        gateway.shutdown()


UNUSED_ARCHIVE_DAYS = 30


def _drop_unused_archives(kept: Path) -> None:
    """Delete the archives beside ``kept`` made for its place and PySpark version (a .venv since replaced
    at its path, or the Java runtime at its path since updated) and those no session has mapped for
    ``UNUSED_ARCHIVE_DAYS`` (of PySpark installs or Java runtimes since removed): 190 MB each, one per
    virtualenv and Java runtime."""
    replaced = kept.name.rsplit("-", 1)[0] + "-"  # spark-<version>-classes-<place>-
    oldest = time.time() - UNUSED_ARCHIVE_DAYS * 86400
    for other in kept.parent.glob(_ARCHIVE_NAME.format(version="*", key="*")):
        try:
            if other != kept and (other.name.startswith(replaced) or other.stat().st_mtime < oldest):
                other.unlink()
        except OSError:
            pass  # gone already, or not ours to delete


def jvm_cpu_seconds(spark: SparkSession) -> float | None:
    """CPU time (user + system) of the local Spark JVM so far, from /proc; None where unknown.

    In local mode the JVM does all of the work, so this is the job's CPU cost whatever
    else the machine is running (wall time on a shared machine is not)."""
    pid = _jvm_pid(spark)
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
