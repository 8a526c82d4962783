"""One ``/metrics`` for a proxy of N worker processes, with prometheus-client's own
multiprocess mode: every process writes its counters, gauges and histograms to files in
one directory (``PROMETHEUS_MULTIPROC_DIR``), and the supervisor serves
``MultiProcessCollector``'s merge of them with the collectors of the state it owns
(connection counts, pool, group sizes). Each gauge's ``multiprocess_mode`` says how the
processes' values combine (proxy/evidence/metrics.py).

With ``workers: 1`` nothing here runs: the one process serves its own registry.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence

import trio
from prometheus_client import generate_latest, values
from prometheus_client.metrics_core import Metric
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from proxy.evidence.metrics import Metrics
from proxy.workers.link import Link, LinkClosed, RemoteError

log = logging.getLogger("kafka_admission_proxy.metrics")

ENV = "PROMETHEUS_MULTIPROC_DIR"
FLUSH_KIND = "worker.flush_metrics"
# A worker folds its traffic into the files this often when no scrape asks: what a
# SIGKILLed worker's counters can miss.
FLUSH_INTERVAL_S = 5.0
# A scrape waits at most this long for the workers' flushes: a stuck worker delays the
# scrape, it does not fail it (its last flushed values are served).
FLUSH_WAIT_S = 1.0
# The process part of the files that keep every dead process's values, folded: counters
# and histograms stay in the sums, and the directory holds the live processes' files and
# these, however often workers die. Never a pid, which is a number.
FOLDED = "dead"


# How a dead process's values fold into the kept ones, by the file's prefix (its type,
# and a gauge's multiprocess_mode); every other prefix adds (counters, histograms'
# buckets and sums, summaries, ``sum`` gauges). ``live*`` gauges are removed
# (mark_process_dead), never folded; ``all`` keeps a series per pid, so its files stay.
def _add(kept: tuple[float, float], dead: tuple[float, float]) -> tuple[float, float]:
    return kept[0] + dead[0], 0.0


_FOLD: dict[str, Callable[[tuple[float, float], tuple[float, float]], tuple[float, float]]] = {
    "gauge_max": max,
    "gauge_min": min,
    "gauge_mostrecent": lambda kept, dead: max(kept, dead, key=lambda value: value[1]),  # (value, timestamp)
}


class MetricsFiles:
    """The directory of every process's metric files, for one run of the supervisor.

    ``PROMETHEUS_MULTIPROC_DIR`` names it when set (e.g. a memory-backed volume where the
    root file system is read-only); otherwise a new temporary directory. Files a previous
    run left are removed at start (their counters would be added to this run's), and at
    exit (a temporary directory goes whole)."""

    def __init__(self, path: str, temporary: bool) -> None:
        self.path = path
        self._temporary = temporary
        # A fold replaces files a scrape reads (both run in threads): a scrape sees each dead
        # process's values once, before the fold or after it, so no counter dips or doubles.
        self._lock = threading.Lock()

    @classmethod
    def open(cls, configured: str | None = None) -> MetricsFiles:
        configured = configured if configured is not None else os.environ.get(ENV) or None
        if configured is None:
            return cls(tempfile.mkdtemp(prefix="kafka-admission-proxy-metrics-"), temporary=True)
        os.makedirs(configured, exist_ok=True)
        files = cls(configured, temporary=False)
        files._remove_files()
        return files

    def enter(self) -> None:
        """This process and every process it starts from now on write their metrics here.
        Called by the supervisor before it makes any metric: prometheus-client chooses its
        value class from the environment when imported, and the supervisor knows it runs
        workers only once it has read its config, after that import."""
        os.environ[ENV] = self.path
        if not getattr(values.ValueClass, "_multiprocess", False):
            values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]

    def process_gone(self, pid: int) -> None:
        """A worker process ended: its live gauges (connections open, ...) stop counting
        (``mark_process_dead``, which removes only those files); the rest of its files are
        folded into the kept ones (``FOLDED``), so its counters stay in the sums, as a
        counter never goes down, and a crash loop does not grow the directory and each
        scrape's reading without bound. Reads and writes files: run it in a thread."""
        with self._lock:
            mark_process_dead(pid, self.path)  # type: ignore[no-untyped-call]
            for path in glob.glob(os.path.join(self.path, f"*_{pid}.db")):
                prefix = os.path.basename(path)[: -len(f"_{pid}.db")]
                if prefix != "gauge_all":  # live ones are gone (mark_process_dead)
                    self._fold(prefix, path)

    def _fold(self, prefix: str, dead: str) -> None:
        """Add ``dead``'s values to those kept in ``<prefix>_dead.db`` (MmapedDict's format: the
        keys name the metric, sample and labels, the same in every process), written whole to a
        new file that replaces it, then remove ``dead``."""
        combine = _FOLD.get(prefix, _add)
        kept = os.path.join(self.path, f"{prefix}_{FOLDED}.db")
        folded: dict[str, tuple[float, float]] = {}
        for path in (kept, dead):
            if not os.path.exists(path):
                continue
            for key, value, timestamp, _ in MmapedDict.read_all_values_from_file(path):  # type: ignore[no-untyped-call]
                folded[key] = combine(folded[key], (value, timestamp)) if key in folded else (value, timestamp)
        if os.path.exists(kept + ".new"):  # MmapedDict would carry on from it
            os.remove(kept + ".new")
        written = MmapedDict(kept + ".new")  # type: ignore[no-untyped-call]
        try:
            for key, (value, timestamp) in folded.items():
                written.write_value(key, value, timestamp)  # type: ignore[no-untyped-call]
        finally:
            written.close()  # type: ignore[no-untyped-call]
        os.replace(kept + ".new", kept)
        os.remove(dead)

    def collect(self) -> list[Metric]:
        """Every process's metrics, merged (reads the files: run it in a thread)."""
        collector = MultiProcessCollector(None, self.path)  # type: ignore[no-untyped-call]
        with self._lock:
            return list(collector.collect())  # type: ignore[no-untyped-call]

    def __enter__(self) -> MetricsFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._temporary:
            shutil.rmtree(self.path, ignore_errors=True)
        else:
            self._remove_files()

    def _remove_files(self) -> None:
        for path in glob.glob(os.path.join(self.path, "*.db")) + glob.glob(os.path.join(self.path, "*.db.new")):
            os.remove(path)


class _Families(Collector):
    """Metric families already collected, for generate_latest."""

    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families


class WholeProxyMetrics:
    """The supervisor's ``/metrics``: the files of every process (the supervisor's own
    counters and gauges among them, and every process's process_* metrics), then
    ``collectors``: the owner's services' state. A family comes from one place: the services' collectors
    are registered in the supervisor alone, never written to the files."""

    def __init__(self, files: MetricsFiles, metrics: Metrics, collectors: Iterable[Collector]) -> None:
        self._files = files
        self._metrics = metrics
        self._collectors = list(collectors)

    async def exposition(self, flush_workers: Callable[[], Awaitable[None]]) -> bytes:
        """Ask the workers to flush, then read and render. The owner's state is collected
        on the trio thread (it changes there); reading and merging the files, the slow
        part, runs in a thread so admissions are not held up by a scrape."""
        await flush_workers()
        self._metrics.flush()
        owned = [family for collector in self._collectors for family in collector.collect()]
        merged = await trio.to_thread.run_sync(self._files.collect)
        return await trio.to_thread.run_sync(generate_latest, _Families([*merged, *owned]))


async def flush_workers(links: Iterable[Link]) -> None:
    """Ask every worker to flush its metrics, all at once; return when all have answered,
    or after FLUSH_WAIT_S. A worker that is gone or failed is skipped."""

    async def ask(link: Link) -> None:
        try:
            await link.ask(FLUSH_KIND)
        except (LinkClosed, RemoteError) as exc:
            log.debug("metrics flush skipped: %s", exc)

    with trio.move_on_after(FLUSH_WAIT_S):
        async with trio.open_nursery() as nursery:
            for link in links:
                nursery.start_soon(ask, link)


async def flush_periodically(metrics: Metrics, interval: float = FLUSH_INTERVAL_S) -> None:
    """A worker's flush between scrapes, so a worker killed between two scrapes loses at
    most ``interval`` of its counts."""
    while True:
        await trio.sleep(interval)
        metrics.flush()


def serve_flush(link: Link, metrics: Metrics) -> None:
    """A worker answers the supervisor's flush before a scrape."""
    link.handlers[FLUSH_KIND] = metrics.flush
