"""The report's JVM runs the parallel garbage collector (a batch job's choice), unless the
operator's own JVM options choose a collector: with two, the JVM refuses to start. Each
session is a real Spark JVM in a process of its own; the collector is read from the
JVM's garbage collector beans."""

from __future__ import annotations

import os
import subprocess
import sys

from pipeline.session import _OPERATOR_JVM_OPTIONS
from tests.conftest import ROOT

SESSION = """
from pipeline.session import spark_session
spark = spark_session("local[1]", progress=False, driver_memory="1g", short_job=True)
assert spark.range(5).count() == 5
beans = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
print("collectors:", ", ".join(sorted(str(bean.getName()) for bean in beans)))
"""


def collectors(**env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if k not in _OPERATOR_JVM_OPTIONS}
    run = subprocess.run(
        [sys.executable, "-c", SESSION],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**environment, **env},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    (line,) = [line for line in run.stdout.splitlines() if line.startswith("collectors:")]
    return line


def test_the_report_jvm_runs_the_parallel_collector() -> None:
    assert collectors() == "collectors: PS MarkSweep, PS Scavenge"


def test_a_collector_chosen_in_the_operators_jvm_options_stays() -> None:
    # With the parallel collector added to it, the JVM would end at once: "Multiple garbage collectors selected".
    assert collectors(JAVA_TOOL_OPTIONS="-XX:+UseSerialGC") == "collectors: Copy, MarkSweepCompact"
