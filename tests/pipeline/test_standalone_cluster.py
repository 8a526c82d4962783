"""The same report on a real Spark standalone cluster: a master and a worker
started from the pyspark install on 127.0.0.1 (free ports), and ``report --master
spark://...`` run as an operator runs it, over the fleet's JSON lines and over the
same lines in a Kafka topic (conftest.py's ``fleet_topic``). The cluster converts
the lines (pyarrow parses them in Python tasks on its worker; a local session's
driver converts input this small itself) before its executors run the queries;
its impact tables and recommended policies equal those of the job in ``local``
mode over the files. (``--to-parquet`` is that conversion written out:
test_events_input.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import FLEET_CANDIDATES, assert_same_report, impact_tables, report_process

from demo.tansu import free_port, stop_process, wait_for_port

pytestmark = pytest.mark.spark


def spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def _start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([spark_class(), *args], stdout=out, stderr=subprocess.STDOUT, env=env)


@pytest.fixture(scope="module")
def standalone_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``spark://127.0.0.1:PORT`` of a master with one worker (2 cores), and the worker's work directory."""
    tmp_path = tmp_path_factory.mktemp("standalone")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(tmp_path / "logs")}
    port = free_port()
    master = _start(
        ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port), "--webui-port", "0"],
        tmp_path / "master.log",
        env,
    )
    processes = [master]
    work = tmp_path / "work"
    try:
        wait_for_port("127.0.0.1", port, timeout=60)
        url = f"spark://127.0.0.1:{port}"
        processes.append(
            _start(
                [
                    "org.apache.spark.deploy.worker.Worker",
                    url,
                    "--host",
                    "127.0.0.1",
                    "--webui-port",
                    "0",
                    "--cores",
                    "2",
                    "--memory",
                    "2g",
                    "--work-dir",
                    str(work),
                ],
                tmp_path / "worker.log",
                env,
            )
        )
        deadline = time.monotonic() + 60
        while "Registering worker" not in (tmp_path / "master.log").read_text(errors="replace"):
            assert time.monotonic() < deadline, (tmp_path / "master.log").read_text(errors="replace")
            assert all(p.poll() is None for p in processes), (tmp_path / "worker.log").read_text(errors="replace")
            time.sleep(0.2)
        yield url, work
    finally:
        for process in reversed(processes):
            stop_process(process, timeout=15)


def _assert_cluster_report_equals_local(cluster: tuple[str, Path], events: str, out: Path, local: Path) -> None:
    """``report --master`` over ``events`` into ``out`` says what the local report under ``local`` says. The
    work ran on the worker's executors (an application directory of its own), and the lines were converted
    there, in Python tasks (the executor's log, at Spark's default level INFO): a local session's driver
    converts input this small itself."""
    master, work = cluster
    apps_before = set(work.glob("app-*"))
    candidates = [arg for c in FLEET_CANDIDATES for arg in ("--candidate", c)]
    run = report_process("--master", master, "--events", events, "--out", str(out), *candidates, "--headroom", "20")
    assert run.returncode == 0, run.stderr[-4000:]
    assert f"Spark ({master})" in run.stderr
    [app] = set(work.glob("app-*")) - apps_before
    executor_logs = list(app.glob("*/stderr"))
    assert executor_logs, "no executor ran on the worker"
    assert any("PythonRunner: Starting Python task" in log.read_text(errors="replace") for log in executor_logs), (
        "no Python task ran on the worker: the JSON lines were not converted there"
    )
    assert_same_report(local, out)
    assert all(impact_tables(out).values()), "no impact rows to compare"
    # The conversion's input problems (lines not valid) are the local run's.
    problems = [json.loads((report / "run.json").read_text())["problem_lines"] for report in (out, local)]
    assert problems[0] == problems[1]


def test_the_report_on_a_standalone_cluster_equals_the_local_one(
    standalone_cluster: tuple[str, Path], fleet: Any, fleet_report: Any, tmp_path: Path
) -> None:
    out = tmp_path / "cluster-report"
    _assert_cluster_report_equals_local(standalone_cluster, str(fleet.path), out, fleet_report.out)


def test_a_report_from_a_topic_on_a_standalone_cluster_equals_the_local_one_from_files(
    standalone_cluster: tuple[str, Path], fleet_topic: tuple[str, int], fleet_report: Any, tmp_path: Path
) -> None:
    """``--master spark://...`` with ``--events kafka://...``: the executors read the topic with Spark's
    Kafka source (its jars given to the application), and the worker converts the values."""
    url, _ = fleet_topic
    out = tmp_path / "cluster-topic-report"
    _assert_cluster_report_equals_local(standalone_cluster, url, out, fleet_report.out)
