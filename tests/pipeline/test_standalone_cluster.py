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
from conftest import FLEET_CANDIDATES, report_process

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


def _rows(spark: Any, path: Path) -> list[tuple[Any, ...]]:
    frame = spark.read.parquet(str(path))
    return sorted((tuple(r) for r in frame.collect()), key=repr)


def _cluster_report(master: str, work: Path, events: str, out: Path) -> dict[str, Any]:
    """``report --master`` over ``events`` into ``out``; the run.json. It asserts that the work ran on the
    worker's executors (an application directory of its own), and that the lines were converted there,
    in Python tasks (the executor's log, at Spark's default level INFO): a local session's driver
    converts input this small itself."""
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
    return dict(json.loads((out / "run.json").read_text()))


def _assert_same_as_local(spark: Any, out: Path, on_cluster_run: dict[str, Any], local: Path) -> None:
    # The conversion's counts and input problems (lines not valid) are the local run's.
    local_run = json.loads((local / "run.json").read_text())
    for key in ("events", "by_kind", "candidates"):
        assert on_cluster_run[key] == local_run[key], key
    assert on_cluster_run["problem_lines"] == local_run["problem_lines"]
    for table in ("summary", "subjects", "timeline"):
        on_cluster, in_local = _rows(spark, out / "impact" / table), _rows(spark, local / "impact" / table)
        assert on_cluster and on_cluster == in_local, table
    assert (out / "recommended-policies.yaml").read_text() == (local / "recommended-policies.yaml").read_text()


def test_the_report_on_a_standalone_cluster_equals_the_local_one(
    standalone_cluster: tuple[str, Path], spark: Any, fleet: Any, fleet_report: Any, tmp_path: Path
) -> None:
    master, work = standalone_cluster
    out = tmp_path / "cluster-report"
    on_cluster_run = _cluster_report(master, work, str(fleet.path), out)
    _assert_same_as_local(spark, out, on_cluster_run, fleet_report.out)


def test_a_report_from_a_topic_on_a_standalone_cluster_equals_the_local_one_from_files(
    standalone_cluster: tuple[str, Path], spark: Any, fleet_topic: tuple[str, int], fleet_report: Any, tmp_path: Path
) -> None:
    """``--master spark://...`` with ``--events kafka://...``: the executors read the topic with Spark's
    Kafka source (its jars given to the application), and the worker converts the values."""
    master, work = standalone_cluster
    url, _ = fleet_topic
    out = tmp_path / "cluster-topic-report"
    on_cluster_run = _cluster_report(master, work, url, out)
    _assert_same_as_local(spark, out, on_cluster_run, fleet_report.out)
