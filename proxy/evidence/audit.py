"""The one audit interface, schema_version 2 (``schema/audit-event-v2.schema.json``):
``record`` puts an event on each sink's bounded queue and that sink's writer thread
turns its queue into rotated JSON-line files in ``audit.path``, into records of the
Kafka topic ``audit.topic`` (proxy/evidence/audit_kafka.py), or into log lines when neither
is set. The event loop never waits on the disk or a broker: when a writer falls
behind, events are dropped and counted in
``kafka_admission_audit_events_dropped_total{sink=file|topic|log}``.

Files, for the pipeline that reads these directories (many proxies may share one)::

    <instance>-<UTC start, yyyymmddThhmmssZ>-<seq>.jsonl.open   being written (may end mid-line)
    <instance>-<UTC start, yyyymmddThhmmssZ>-<seq>.jsonl        finished: complete, never touched again
                                                                 (except deleted by the disk bound)

A file is renamed from ``.jsonl.open`` to ``.jsonl`` when it reaches
``audit.max_file_bytes`` or ``audit.max_file_seconds``, when the proxy stops, or,
for a file left by a proxy that died, when the next proxy with the same instance
id starts. Readers that want complete files take ``*.jsonl`` only. ``seq``
(6+ digits) grows per instance across restarts: it orders one instance's files.
To stay within ``audit.max_total_bytes`` the oldest finished files of this
instance are deleted first (``kafka_admission_audit_files_deleted_total``).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from proxy.config.model import Audit, Upstream
from proxy.evidence.metrics import Metrics

SCHEMA_VERSION = 2
CLOSE_TIMEOUT_S = 5.0
_BATCH = 4096  # events per write and flush
_IDLE_POLL_S = 1.0  # the writer looks at file age and at close() at least this often
_DISK_RETRY_S = 1.0  # after a failed write, batches are dropped (counted) this long before trying again
_PROBLEM_LOG_INTERVAL_S = 60.0
_log = logging.getLogger("kafka_admission_proxy.audit")  # the sink's own troubles
_events_log = logging.getLogger("kafka_admission_proxy.audit.events")  # the events, when audit.path is null


class AuditSink:
    """``record`` events from the event loop; ``close`` once at shutdown.

    Each sink (``file``, ``topic``, or ``log`` when neither is set) has its own bounded
    queue and writer thread: a stalled disk does not hold up the topic, nor a down broker
    the files."""

    def __init__(
        self, settings: Audit, metrics: Metrics, upstream: Upstream | None = None, proxy: str | None = None
    ) -> None:
        self.instance = settings.instance
        # With workers: N, the whole proxy's instance (the supervisor's), stamped beside each
        # worker's own so the report counts the workers as one proxy (docs/workers.md).
        self.proxy = proxy
        # Connection lifecycle and observation windows go to files and the topic only: into the
        # log they would be a line per connection. Decisions go wherever the audit goes.
        self.keeps_evidence = settings.path is not None or settings.topic is not None
        outputs: list[tuple[str, _Output]] = []
        if settings.path is not None:
            outputs.append(("file", _Directory(settings, metrics)))
        if settings.topic is not None:
            from proxy.evidence.audit_kafka import TopicOutput  # confluent-kafka only where a topic is configured

            assert upstream is not None, "the topic sink needs the upstream (its default brokers and TLS)"
            outputs.append(("topic", TopicOutput(settings, upstream, metrics)))
        if not outputs:
            outputs.append(("log", _Log()))
        self._lanes = [_Lane(sink, out, settings.queue_events, metrics) for sink, out in outputs]
        self._closed = False

    def record(self, event: dict[str, Any]) -> None:
        """Queue one v2 event (``type`` and that kind's fields) for every sink; never blocks,
        never raises on disk or broker trouble. Stamps ``schema_version``, ``instance`` (and
        ``proxy`` when set), and ``ts`` unless set."""
        if self._closed:
            for lane in self._lanes:
                lane.dropped.inc()
            return
        stamped = {"schema_version": SCHEMA_VERSION, **event}
        stamped["schema_version"] = SCHEMA_VERSION
        stamped["instance"] = self.instance
        if self.proxy is not None:
            stamped["proxy"] = self.proxy
        if "ts" not in stamped:
            stamped["ts"] = time.time()
        for lane in self._lanes:
            lane.put(stamped)

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Write what is queued (waiting at most ``timeout`` seconds in all), finish the
        current file, flush the producer and stop the writers."""
        if self._closed:
            return
        self._closed = True
        for lane in self._lanes:
            lane.stop()
        deadline = time.monotonic() + timeout
        for lane in self._lanes:
            lane.join(max(deadline - time.monotonic(), 0.0), timeout)


class _Output(Protocol):
    # True: the output counts its events written (delivered) and dropped itself, later
    # (the topic: on the broker's acknowledgement); False: ``write``'s answer is final.
    counts_delivery: bool

    def start(self) -> None: ...
    def write(self, lines: list[bytes], kinds: list[str]) -> int:
        """Write ``lines`` (each ending in a newline; ``kinds`` their event types); returns how
        many were written (or taken, for an output that counts deliveries)."""
        ...

    def tick(self) -> None: ...
    def wait_seconds(self) -> float: ...
    def finish(self) -> None: ...


class _Lane:
    """One sink's bounded queue and the writer thread that drains it into its output."""

    def __init__(self, sink: str, out: _Output, capacity: int, metrics: Metrics) -> None:
        self.sink = sink
        self._capacity = capacity
        self.dropped = metrics.audit_events_dropped.labels(sink)
        # One producer (the event loop) appends, one consumer (the writer) pops: a deque's
        # append and popleft are atomic, so the hot path takes no lock.
        self._queue: collections.deque[dict[str, Any]] = collections.deque()
        metrics.watch_audit_queue(sink, lambda: len(self._queue))
        self._writer = _Writer(self._queue, out, metrics, sink)
        self._thread = threading.Thread(target=self._writer.run, name=f"audit-{sink}-writer", daemon=True)
        self._thread.start()

    def put(self, event: dict[str, Any]) -> None:
        if len(self._queue) >= self._capacity:
            self.dropped.inc()
            return
        self._queue.append(event)
        if not self._writer.wake.is_set():
            self._writer.wake.set()

    def stop(self) -> None:
        self._writer.stopping = True
        self._writer.wake.set()

    def join(self, wait: float, timeout: float) -> None:
        self._thread.join(wait)
        if self._thread.is_alive():
            _log.warning(
                "audit: the %s writer did not finish within %gs (%s); %d queued events may be lost",
                self.sink,
                timeout,
                "broker unreachable?" if self.sink == "topic" else "disk stalled?",
                len(self._queue),
            )


class _Writer:
    """The writer thread: drains the queue in batches into an output."""

    def __init__(self, events: collections.deque[dict[str, Any]], out: _Output, metrics: Metrics, sink: str) -> None:
        self._queue = events
        self._out = out
        self._sink = sink
        self._written = metrics.audit_events
        self._dropped = metrics.audit_events_dropped.labels(sink)
        self.wake = threading.Event()  # set by put() when the writer may be asleep
        self.stopping = False

    def run(self) -> None:
        self._out.start()
        while not (self.stopping and not self._queue):
            self.wake.wait(self._out.wait_seconds())
            self.wake.clear()  # before draining: an event queued after this sets it again
            while True:
                batch = self._take()
                try:
                    self._out.tick()
                    if batch:
                        self._write(batch)
                except Exception:  # a bug must not stop the evidence; the queue would only fill
                    _log.exception("audit: %s writer error; %d events dropped", self._sink, len(batch))
                    self._dropped.inc(len(batch))
                if len(batch) < _BATCH:
                    break
        self._out.finish()

    def _take(self) -> list[dict[str, Any]]:
        pop = self._queue.popleft  # only this thread pops, so len() is a floor
        return [pop() for _ in range(min(len(self._queue), _BATCH))]

    def _write(self, batch: list[dict[str, Any]]) -> None:
        lines = [json.dumps(event, separators=(",", ":"), default=str).encode() + b"\n" for event in batch]
        kinds = [str(event.get("type")) for event in batch]
        written = self._out.write(lines, kinds)
        if written < len(batch):
            self._dropped.inc(len(batch) - written)
        if not self._out.counts_delivery:
            for kind, n in collections.Counter(kinds[:written]).items():
                self._written.labels(kind, self._sink).inc(n)


class _Log:
    """Neither ``audit.path`` nor ``audit.topic``: one log line per event."""

    counts_delivery = False

    def start(self) -> None:
        pass

    def write(self, lines: list[bytes], kinds: list[str]) -> int:
        for line in lines:
            _events_log.info("audit %s", line.decode().rstrip("\n"))
        return len(lines)

    def tick(self) -> None:
        pass

    def wait_seconds(self) -> float:
        return _IDLE_POLL_S

    def finish(self) -> None:
        pass


class _Directory:
    """Rotated, disk-bounded files of one instance in ``audit.path`` (writer thread only)."""

    counts_delivery = False

    def __init__(self, settings: Audit, metrics: Metrics) -> None:
        assert settings.path is not None
        self._dir = Path(settings.path)
        self._instance = settings.instance
        self._names = re.compile(rf"^{re.escape(self._instance)}-\d{{8}}T\d{{6}}Z-(\d{{6,}})\.jsonl(\.open)?$")
        self._max_file_bytes = settings.max_file_bytes
        self._max_file_seconds = settings.max_file_seconds
        self._max_total_bytes = settings.max_total_bytes
        self._deleted = metrics.audit_files_deleted
        self._bytes_written = metrics.audit_bytes_written
        self._finished: collections.deque[tuple[Path, int]] = collections.deque()  # oldest first
        self._finished_bytes = 0
        self._seq = 0
        self._file: BinaryIO | None = None
        self._path = Path()
        self._size = 0
        self._opened_at = 0.0
        self._retry_at = 0.0
        self._problems = 0
        self._next_problem_log = 0.0

    def start(self) -> None:
        """Carry on from an earlier run of this instance: its files count toward the
        disk bound, its ``seq`` continues, a file it left open is finished."""
        try:
            found = []
            for name in os.listdir(self._dir):
                match = self._names.match(name)
                if match is None:
                    continue
                path = self._dir / name
                if match.group(2):
                    path = path.rename(path.with_suffix(""))
                found.append((int(match.group(1)), path, path.stat().st_size))
            found.sort()
            for seq, path, size in found:
                self._seq = seq
                self._finished.append((path, size))
                self._finished_bytes += size
            self._trim(0)
        except OSError as exc:
            self._problem(exc)

    def write(self, lines: list[bytes], kinds: list[str]) -> int:
        if time.monotonic() < self._retry_at:
            return 0
        done = 0
        try:
            pending: list[bytes] = []
            pending_bytes = 0
            for line in lines:
                if pending_bytes + len(line) > self._max_file_bytes - self._size:
                    self._append(pending, pending_bytes)
                    done += len(pending)
                    pending, pending_bytes = [], 0
                    self._rotate()  # a line longer than a whole file goes alone into one
                pending.append(line)
                pending_bytes += len(line)
            self._append(pending, pending_bytes)
            done += len(pending)
        except OSError as exc:
            self._problem(exc)
            self._abandon()
        return done

    def tick(self) -> None:
        if self._file is not None and time.monotonic() - self._opened_at >= self._max_file_seconds:
            try:
                self._rotate()
            except OSError as exc:
                self._problem(exc)
                self._abandon()

    def wait_seconds(self) -> float:
        if self._file is None:
            return _IDLE_POLL_S
        age_left = self._max_file_seconds - (time.monotonic() - self._opened_at)
        return min(max(age_left, 0.001), _IDLE_POLL_S)

    def finish(self) -> None:
        try:
            self._rotate()
        except OSError as exc:
            self._problem(exc)
            self._abandon()

    def _append(self, chunks: list[bytes], size: int) -> None:
        if not chunks:
            return
        if self._file is not None and os.fstat(self._file.fileno()).st_nlink == 0:
            self._lost_current()
        if self._file is None:
            self._open()
            assert self._file is not None
        self._trim(size)
        self._file.write(b"".join(chunks))
        self._file.flush()
        self._size += size
        self._bytes_written.inc(size)

    def _open(self) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)  # it may have been removed since start
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        while True:
            self._seq += 1
            path = self._dir / f"{self._instance}-{stamp}-{self._seq:06d}.jsonl.open"
            try:
                self._file = path.open("xb")
                break
            except FileExistsError:
                continue  # another process with our instance id; its file stays its own
        self._path, self._size, self._opened_at = path, 0, time.monotonic()

    def _rotate(self) -> None:
        """Finish the current file: flushed to disk, then renamed to ``.jsonl``."""
        if self._file is None or self._size == 0:
            return
        file, self._file = self._file, None
        try:
            file.flush()
            os.fsync(file.fileno())
        finally:
            file.close()
        finished = self._path.rename(self._path.with_suffix(""))
        self._finished.append((finished, self._size))
        self._finished_bytes += self._size
        self._size = 0

    def _trim(self, incoming: int) -> None:
        """Delete this instance's oldest finished files until ``incoming`` more bytes fit."""
        while self._finished and self._finished_bytes + self._size + incoming > self._max_total_bytes:
            path, size = self._finished.popleft()
            self._finished_bytes -= size
            try:
                path.unlink()
            except FileNotFoundError:
                continue  # someone (a pipeline run) removed it already
            self._deleted.inc()

    def _lost_current(self) -> None:
        """Someone deleted the file being written (cleared the directory): start a new one
        rather than write into a file nobody can read."""
        _log.warning("audit: %s was deleted while being written; starting a new file", self._path)
        file, self._file, self._size = self._file, None, 0
        if file is not None:
            file.close()

    def _abandon(self) -> None:
        """After a write error: give up the current file, retry a new one later."""
        self._retry_at = time.monotonic() + _DISK_RETRY_S
        file, self._file = self._file, None
        size, self._size = self._size, 0
        if file is None:
            return
        try:
            file.close()
            if size == 0:
                self._path.unlink()
            else:
                self._finished.append((self._path.rename(self._path.with_suffix("")), size))
                self._finished_bytes += size
        except OSError:
            pass  # the disk is in trouble; the problem is already logged

    def _problem(self, exc: OSError) -> None:
        self._problems += 1
        now = time.monotonic()
        if now >= self._next_problem_log:
            _log.error(
                "audit: cannot write to %s: %s (%d problems since the last report; events are dropped and counted)",
                self._dir,
                exc,
                self._problems,
            )
            self._problems = 0
            self._next_problem_log = now + _PROBLEM_LOG_INTERVAL_S
