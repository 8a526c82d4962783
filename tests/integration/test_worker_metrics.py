"""One /metrics for N worker processes with prometheus-client's multiprocess mode
(proxy/workers/metrics.py): real processes write their metrics to the files, the supervisor's
scrape asks each to flush over a real link and serves the merge with the owner's collectors."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from proxy.evidence.metrics import Metrics
from proxy.workers.link import Link
from proxy.workers.metrics import ENV, MetricsFiles, WholeProxyMetrics, flush_workers
from tests.clients import create_topic, unique
from tests.conftest import ROOT, ProxyProcess, wait_until
from tests.integration.test_connection_admission import FETCH, KafkaSocket
from tests.integration.test_workers import close_all, connections_on_every_worker, round_trip
from tests.raw_kafka import RawConnection
from tests.workers_util import start_workers, worker_of, worker_pids


class _OwnerCounts(Collector):
    """Stands for a shared service's collector (connection counts the owner holds)."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("kafka_admission_connections_counted", "Connections counted", value=5)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    families = list(text_string_to_metric_families(text))
    names = [f.name for f in families]
    assert len(names) == len(set(names)), f"a family served twice: {sorted(n for n in names if names.count(n) > 1)}"
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


PLAIN = (("listener", "plain"),)
METADATA = (("api", "metadata"), ("listener", "plain"))
ACTIVE = (("listener", "plain"), ("tls", "false"))


class Worker:
    def __init__(self, files: MetricsFiles) -> None:
        parent, child = socket.socketpair()
        env = {**os.environ, ENV: files.path, "PYTHONPATH": str(ROOT)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.metrics_worker", str(child.fileno())], pass_fds=[child.fileno()], env=env
        )
        child.close()
        self.link = Link(trio.SocketStream(trio.socket.from_stdlib_socket(parent)))


@pytest.fixture
def files(tmp_path: Path) -> Iterator[MetricsFiles]:
    files = MetricsFiles.open(str(tmp_path / "metrics"))
    yield files
    files.close()


async def test_one_scrape_sums_the_workers_flushed_on_ask_and_a_dead_workers_live_gauges_drop(
    files: MetricsFiles,
) -> None:
    workers = [Worker(files), Worker(files)]
    whole = WholeProxyMetrics(files, Metrics(role="supervisor"), [_OwnerCounts()])

    async def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return samples((await whole.exposition(lambda: flush_workers(w.link for w in live))).decode())

    live = list(workers)
    try:
        async with trio.open_nursery() as nursery:
            for worker in workers:
                nursery.start_soon(worker.link.run)
            pids = [await w.link.ask("test.pid") for w in workers]
            assert pids == [w.process.pid for w in workers]
            workers[0].link.tell("test.connections", 2)
            workers[1].link.tell("test.connections", 3)
            workers[0].link.tell("test.requests", 10, 0.0002)
            workers[1].link.tell("test.requests", 5, 0.002)
            await workers[1].link.ask("test.pid")  # its tells are applied (in order, before the answer)
            await workers[0].link.ask("test.pid")
            # Nothing reaches the files per request: only a flush writes the traffic.
            assert ("kafka_admission_requests_total", METADATA) not in samples_of(files)

            seen = await scrape()
            assert seen[("kafka_admission_requests_total", METADATA)] == 15
            assert seen[("kafka_admission_request_bytes_total", PLAIN)] == 1500
            assert seen[("kafka_admission_response_bytes_total", PLAIN)] == 15000
            assert seen[("kafka_admission_proxy_added_latency_seconds_count", PLAIN)] == 15
            assert seen[("kafka_admission_proxy_added_latency_seconds_bucket", (("le", "0.00025"), *PLAIN))] == 10
            assert seen[("kafka_admission_proxy_added_latency_seconds_bucket", (("le", "0.0025"), *PLAIN))] == 15
            assert seen[("kafka_admission_proxy_added_latency_seconds_sum", PLAIN)] == pytest.approx(0.012)
            assert seen[("kafka_admission_connections_active", ACTIVE)] == 5  # livesum
            assert seen[("kafka_admission_connections_counted", ())] == 5  # the owner's collector
            build = [k for k in seen if k[0] == "kafka_admission_build_info"]
            assert len(build) == 1 and seen[build[0]] == 1  # max over the processes, no pid label

            workers[0].link.tell("test.requests", 7, 0.0002)
            seen = await scrape()
            assert seen[("kafka_admission_requests_total", METADATA)] == 22  # each request once
            assert seen[("kafka_admission_proxy_added_latency_seconds_count", PLAIN)] == 22

            workers[1].process.send_signal(signal.SIGKILL)
            await workers[1].link.closed.wait()
            assert await trio.to_thread.run_sync(workers[1].process.wait) == -signal.SIGKILL
            await trio.to_thread.run_sync(files.process_gone, workers[1].process.pid)
            live = [workers[0]]
            seen = await scrape()
            assert seen[("kafka_admission_connections_active", ACTIVE)] == 2  # its connections are gone
            assert seen[("kafka_admission_requests_total", METADATA)] == 22  # a counter never goes down
            nursery.cancel_scope.cancel()
    finally:
        for worker in workers:
            worker.process.kill()
            worker.process.wait()


def samples_of(files: MetricsFiles) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in files.collect() for s in f.samples}


def test_the_directory_starts_empty_and_is_removed_or_emptied_at_exit(tmp_path: Path) -> None:
    configured = tmp_path / "configured"
    configured.mkdir()
    (configured / "counter_12345.db").write_bytes(b"left by a previous run")
    (configured / "keep.txt").write_text("not ours")
    files = MetricsFiles.open(str(configured))
    assert sorted(p.name for p in configured.iterdir()) == ["keep.txt"]
    (configured / "gauge_livesum_1.db").write_bytes(b"")
    files.close()
    assert sorted(p.name for p in configured.iterdir()) == ["keep.txt"]

    temporary = MetricsFiles.open(None) if ENV not in os.environ else None
    if temporary is not None:
        assert Path(temporary.path).is_dir()
        temporary.close()
        assert not Path(temporary.path).exists()


def cpu_seconds(pid: int) -> float:
    """A process's user and system CPU time so far, from /proc (as prometheus-client reads it)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def served_metrics(proxy: ProxyProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = proxy.get("/metrics")
    assert status == 200
    return samples(text)


def metric(seen: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return sum(v for (n, found), v in seen.items() if n == name and set(labels.items()) <= set(found))


@pytest.mark.kills_workers
def test_the_supervisors_metrics_count_each_request_once_across_workers_and_forget_a_dead_workers_connections(
    tansu: Any, start_proxy: Any
) -> None:
    """workers: 2 under traffic: one scrape of the supervisor's /metrics counts every round trip
    once whichever worker served it (each worker flushed when asked, none per request), open
    connections are the sum over the workers, and when a worker is SIGKILLed its connections
    leave the gauge while the requests it served stay counted."""
    proxy = start_workers(start_proxy, tansu.bootstrap, 2)
    by_worker = connections_on_every_worker(proxy, 2, 16)
    try:
        before = served_metrics(proxy)
        served_before = metric(before, "kafka_admission_requests_total", api="api_versions")
        assert served_before == 16  # one round trip on each connection, on both workers
        for i, conn in enumerate(conn for conns in by_worker.values() for conn in conns):
            for k in range(5):
                assert round_trip(conn, 1000 + 10 * i + k) == 0
        seen = served_metrics(proxy)
        assert metric(seen, "kafka_admission_requests_total", api="api_versions") == served_before + 16 * 5
        assert metric(seen, "kafka_admission_proxy_added_latency_seconds_count") == metric(
            seen, "kafka_admission_requests_total"
        )
        assert metric(seen, "kafka_admission_connections_active") == 16
        assert metric(seen, "kafka_admission_connections_accepted_total") == 16
        # process_*: every process's (prometheus-client has none of its own in multiprocess mode)
        pids = worker_pids(proxy)
        workers_cpu = sum(cpu_seconds(pid) for pid in pids.values())
        assert metric(seen, "process_cpu_seconds_total") >= workers_cpu * 0.9  # the supervisor's too
        assert metric(seen, "process_resident_memory_bytes") > 3 * 20e6  # three Python processes
        assert metric(seen, "process_open_fds") >= 2 + 4  # the fullest worker: its listener, link and clients
        assert not [k for k in seen if ("pid", str(worker_pids(proxy)[0])) in k[1]]  # no per-process series

        victim, survivor = 0, 1
        requests = metric(seen, "kafka_admission_requests_total")
        os.kill(worker_pids(proxy)[victim], signal.SIGKILL)
        wait_until(lambda: proxy.metric("kafka_admission_worker_restarts_total", worker=str(victim)) == 1, timeout=15)
        seen = served_metrics(proxy)
        assert metric(seen, "kafka_admission_connections_active") == len(by_worker[survivor])
        assert metric(seen, "kafka_admission_requests_total") == requests  # a counter never goes down
        assert metric(seen, "kafka_admission_worker_restarts_total") == 1  # the supervisor's own, from its file
    finally:
        close_all(by_worker)


def test_one_process_under_prometheus_multiproc_dir_starts_from_empty_files_and_leaves_none(
    tansu: Any, start_proxy: Any, tmp_path: Path
) -> None:
    """The chart sets PROMETHEUS_MULTIPROC_DIR for `workers: auto`, which may come to one process
    (here: the affinity of one CPU, by taskset). That process writes its metrics to files there;
    what a previous run left is removed first (a restarted container keeps its emptyDir and its
    pid, whose old values it would carry on from), and its own files at exit."""
    directory = tmp_path / "metrics"
    directory.mkdir()
    (directory / "counter_1.db").write_bytes(b"left by the container's previous run")
    proxy = start_proxy(
        tansu.bootstrap,
        workers="auto",
        command_prefix=["env", f"{ENV}={directory}", "taskset", "-c", "0"],
    )
    assert "supervisor" not in proxy.log()  # auto came to one process
    assert "counter_1.db" not in os.listdir(directory)
    conns = [RawConnection(proxy.bootstrap) for _ in range(3)]
    try:
        for i, conn in enumerate(conns):
            assert round_trip(conn, i) == 0
        wait_until(lambda: proxy.metric("kafka_admission_connections_active") == 3)
        assert proxy.metric("kafka_admission_requests_total", api="api_versions") == 3
        assert any(name.startswith("counter_") for name in os.listdir(directory))  # its values are in files
    finally:
        for conn in conns:
            conn.close()
    proxy.stop()
    assert os.listdir(directory) == []


def test_requests_in_flight_are_counted_busy_over_every_worker(tansu: Any, start_proxy: Any) -> None:
    """`kafka_admission_connections_counted_busy` with workers: only the worker holding a
    connection sees its requests in flight; each sets its share at a flush and the scrape sums
    them (livesum), here with Fetches parked at the broker on connections of both workers."""
    proxy = start_workers(start_proxy, tansu.bootstrap, 2)
    topic = unique("empty")
    create_topic(tansu.bootstrap, topic)
    conns: list[KafkaSocket] = []
    try:
        while len({worker_of(proxy, c) for c in conns}) < 2 or len(conns) < 4:
            assert len(conns) < 16, "SO_REUSEPORT put 16 connections on one worker"
            conns.append(KafkaSocket(proxy.bootstrap))
            conns[-1].api_versions()
        parked = [(conn, conn.park_fetch(conn.topic_id(topic), max_wait_ms=4000)) for conn in conns]
        wait_until(lambda: proxy.metric("kafka_admission_connections_counted_busy") == len(conns))
        for conn, correlation_id in parked:
            assert conn.read_response(FETCH, 13).header.correlation_id == correlation_id
        wait_until(lambda: proxy.metric("kafka_admission_connections_counted_busy") == 0)
    finally:
        for conn in conns:
            conn.close()


def monotonic_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples that must never go down: counters' and histograms' (not ``_created``)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        if f.type in ("counter", "histogram")
        for s in f.samples
        if not s.name.endswith("_created")
    }


@pytest.mark.kills_workers
def test_a_worker_killed_again_and_again_leaves_no_files_behind_and_no_counter_goes_down(
    tansu: Any, start_proxy: Any, tmp_path: Path
) -> None:
    """A crash loop: worker 0 is SIGKILLed three times. Its live gauges leave /metrics with it
    (mark_process_dead); its other files are folded into the kept ``*_dead.db`` ones, so the
    directory holds the live processes' files and those, the same kept files after the third
    death as after the first, and no counter or histogram sample scraped ever goes down."""
    directory = tmp_path / "metrics"
    proxy = start_workers(start_proxy, tansu.bootstrap, 2, command_prefix=["env", f"{ENV}={directory}"])
    by_worker = connections_on_every_worker(proxy, 2, 16)
    survivor = by_worker[1]
    try:
        status, text = proxy.get("/metrics")
        assert status == 200
        last = monotonic_samples(text)
        kept: list[list[str]] = []
        for death in (1, 2, 3):
            pid = worker_pids(proxy)[0]
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda pid=pid: worker_pids(proxy)[0] != pid, timeout=20)  # restarted (after a growing pause)
            for i, conn in enumerate(survivor):
                assert round_trip(conn, 100 * death + i) == 0  # the counters keep counting meanwhile
            status, text = proxy.get("/metrics")
            assert status == 200
            seen = monotonic_samples(text)
            went_down = {key: (value, seen.get(key)) for key, value in last.items() if seen.get(key, -1) < value}
            assert not went_down, f"after death {death}: {went_down}"
            last = seen
            assert seen[("kafka_admission_worker_restarts_total", (("worker", "0"),))] == death
            assert metric(samples(text), "kafka_admission_connections_active") == len(survivor)
            names = os.listdir(directory)
            live = {str(proxy.process.pid), *map(str, worker_pids(proxy).values())}  # type: ignore[union-attr]
            owners = {name.rsplit("_", 1)[1].removesuffix(".db") for name in names}
            assert owners <= live | {"dead"}, f"files of a dead process after death {death}: {sorted(names)}"
            assert "counter_dead.db" in names
            kept.append(sorted(name for name in names if name.endswith("_dead.db")))
        assert kept[2] == kept[0], kept  # bounded: one kept file per type, however many deaths
        assert metric(samples(text), "kafka_admission_requests_total", api="api_versions") >= 8 + 3 * len(survivor)
    finally:
        close_all(by_worker)
