"""The v2 audit sink on real files and a real writer thread: every line valid
against the JSON Schema, rotation by size and age, the disk bound, restarts,
close, and record() under a stalled destination."""

from __future__ import annotations

import logging
import os
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from proxy.config.model import Audit
from proxy.evidence.audit import AuditSink
from proxy.evidence.metrics import Metrics
from tests.audit_files import assert_valid, audit_files, read_events
from tests.conftest import wait_until

INSTANCE = "proxy-a"

DECISION: dict[str, Any] = {
    "type": "decision",
    "policy": "group_size",
    "mode": "observe",
    "action": "refuse",
    "reason": "group orders has 2 members, group.max.size is 2",
    "limit_key": "group.max.size",
    "limit": 2,
    "listener": "external",
    "client_address": "127.0.0.1:50412",
    "client_id": "orders-app",
    "api": "JoinGroup",
    "api_key": 11,
    "api_version": 9,
    "group_id": "orders",
    "size": 312,
}
CONNECTION: dict[str, Any] = {
    "type": "connection",
    "event": "close",
    "conn_id": "c-17",
    "listener": "external",
    "client_address": "127.0.0.1:50412",
    "tls": True,
    "reason": "client_closed",
    "duration_seconds": 12.5,
    "requests": 40,
    "bytes_in": 4000,
    "bytes_out": 9000,
}
WINDOW: dict[str, Any] = {
    "type": "window",
    "section": "pool",
    "window_start": 1_780_000_000.0,
    "window_seconds": 60.0,
    "capacity_bytes": -1,
    "high_water_mark_bytes": 1_048_576,
    "waits": 0,
}


def sink(tmp_path: Path, metrics: Metrics, **settings: Any) -> AuditSink:
    return AuditSink(Audit(path=str(tmp_path), instance_id=INSTANCE, **settings), metrics)


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (whatever the sink)."""
    return sum(
        (
            s.value
            for family in metrics.registry.collect()
            for s in family.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ),
        0.0,
    )


def numbered(n: int) -> dict[str, Any]:
    return {**DECISION, "correlation_id": n}


def test_every_event_is_a_valid_v2_line_stamped_with_the_instance(tmp_path: Path) -> None:
    metrics = Metrics()
    audit = sink(tmp_path, metrics)
    for event in (DECISION, CONNECTION, WINDOW):
        audit.record(event)
    audit.close()
    events = read_events(tmp_path, finished_only=True)
    assert_valid(events)
    assert [e["type"] for e in events] == ["decision", "connection", "window"]
    assert all(e["schema_version"] == 2 and e["instance"] == INSTANCE for e in events)
    assert all(abs(e["ts"] - time.time()) < 60 for e in events)
    assert sample(metrics, "kafka_admission_audit_events_total", type="decision") == 1
    assert sample(metrics, "kafka_admission_audit_bytes_written_total") == sum(
        p.stat().st_size for p in audit_files(tmp_path)
    )


def test_an_event_keeps_its_own_ts_but_not_a_foreign_instance_or_version(tmp_path: Path) -> None:
    audit = sink(tmp_path, Metrics())
    audit.record({**DECISION, "ts": 12.5, "instance": "someone-else", "schema_version": 1})
    audit.close()
    (event,) = read_events(tmp_path)
    assert (event["ts"], event["instance"], event["schema_version"]) == (12.5, INSTANCE, 2)


def test_file_names_carry_the_instance_and_finished_files_lose_the_open_suffix(tmp_path: Path) -> None:
    audit = sink(tmp_path, Metrics())
    audit.record(DECISION)
    (open_file,) = wait_until(lambda: audit_files(tmp_path))
    assert open_file.name.startswith(f"{INSTANCE}-") and open_file.name.endswith("-000001.jsonl.open")
    audit.close()
    (finished,) = audit_files(tmp_path)
    assert finished.name == open_file.name.removesuffix(".open")


def test_files_rotate_by_size_without_losing_or_reordering_events(tmp_path: Path) -> None:
    metrics = Metrics()
    audit = sink(tmp_path, metrics, max_file_bytes=4096)
    for n in range(300):
        audit.record(numbered(n))
    audit.close()
    files = audit_files(tmp_path)
    assert len(files) >= 300 * 350 // 4096  # each line is ~390 bytes
    assert all(p.stat().st_size <= 4096 for p in files)
    assert all(not p.name.endswith(".open") for p in files)
    assert [e["correlation_id"] for e in read_events(tmp_path)] == list(range(300))
    assert sample(metrics, "kafka_admission_audit_events_total", type="decision") == 300


def test_a_file_is_finished_when_it_is_old_even_if_no_event_follows(tmp_path: Path) -> None:
    audit = sink(tmp_path, Metrics(), max_file_seconds=0.3)
    audit.record(numbered(1))
    (first,) = wait_until(lambda: audit_files(tmp_path, finished_only=True), timeout=5)
    audit.record(numbered(2))
    wait_until(lambda: len(audit_files(tmp_path, finished_only=True)) == 2, timeout=5)
    audit.close()
    assert [e["correlation_id"] for e in read_events(first.parent)] == [1, 2]
    assert [e["correlation_id"] for e in read_events(tmp_path) if e] == [1, 2]


def test_the_disk_bound_deletes_the_oldest_files_of_this_instance_and_counts_them(tmp_path: Path) -> None:
    other = tmp_path / "other-proxy-20260101T000000Z-000001.jsonl"
    other.write_text("{}\n" * 3000)  # another instance's file: never ours to delete
    metrics = Metrics()
    audit = sink(tmp_path, metrics, max_file_bytes=4096, max_total_bytes=3 * 4096)
    for n in range(500):
        audit.record(numbered(n))
    audit.close()
    ours = audit_files(tmp_path)
    ours.remove(other)
    assert sum(p.stat().st_size for p in ours) <= 3 * 4096
    seqs = [int(p.name.split("-")[-1].split(".")[0]) for p in ours]
    deleted = sample(metrics, "kafka_admission_audit_files_deleted_total")
    assert deleted >= 10
    assert seqs == list(range(int(deleted) + 1, int(deleted) + 1 + len(ours)))  # the newest survive
    kept = [e["correlation_id"] for e in read_events(tmp_path) if e.get("type") == "decision"]
    assert kept == list(range(500 - len(kept), 500))
    assert other.exists()


def test_a_restart_finishes_the_file_left_open_and_continues_its_numbers(tmp_path: Path) -> None:
    left = tmp_path / f"{INSTANCE}-20260101T000000Z-000007.jsonl.open"
    left.write_text('{"schema_version":2,"type":"decision"}\n{"trunc')  # a proxy died mid-batch
    audit = sink(tmp_path, Metrics())
    audit.record(DECISION)
    audit.close()
    names = [p.name for p in audit_files(tmp_path)]
    assert names[0] == left.name.removesuffix(".open")
    assert names[1].endswith("-000008.jsonl") and len(names) == 2


def test_close_writes_everything_queued(tmp_path: Path) -> None:
    metrics = Metrics()
    audit = sink(tmp_path, metrics)
    for n in range(20_000):
        audit.record(numbered(n))
    audit.close()
    assert len(read_events(tmp_path, finished_only=True)) == 20_000
    assert sample(metrics, "kafka_admission_audit_events_dropped_total") == 0
    audit.record(DECISION)  # after close: dropped and counted, not raised
    assert sample(metrics, "kafka_admission_audit_events_dropped_total") == 1


def test_a_removed_directory_is_made_again(tmp_path: Path) -> None:
    directory = tmp_path / "audit"
    audit = sink(directory, Metrics(), max_file_bytes=4096)
    for n in range(30):
        audit.record(numbered(n))
    wait_until(lambda: audit_files(directory, finished_only=True))
    for path in directory.iterdir():
        path.unlink()
    directory.rmdir()
    time.sleep(0.1)
    audit.record(numbered(99))
    audit.close()
    assert 99 in [e["correlation_id"] for e in read_events(directory)]


def test_without_a_path_events_go_to_the_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kafka_admission_proxy.audit")
    audit = AuditSink(Audit(instance_id=INSTANCE), Metrics())
    audit.record(DECISION)
    audit.close()
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("audit {")]
    assert '"schema_version":2' in line and f'"instance":"{INSTANCE}"' in line


# --- under pressure: the destination stalls, record() must not -----------------------------


def _stalled_fifo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[AuditSink, Metrics, int]:
    """The sink's file is a FIFO nobody reads: once its 64 KiB buffer is full, the writer's
    write() blocks in the kernel, as on a stalled disk. (The one stand-in in this file:
    the sink opens the FIFO instead of a regular file; everything else is the real sink.)"""
    fifo = tmp_path / "stalled.fifo"
    os.mkfifo(fifo)
    import proxy.evidence.audit as audit_module

    def open_fifo(self: Any) -> None:
        self._file = os.fdopen(os.open(fifo, os.O_RDWR), "wb")
        self._path, self._size, self._opened_at = fifo, 0, time.monotonic()

    monkeypatch.setattr(audit_module._Directory, "_open", open_fifo)
    metrics = Metrics()
    audit = sink(tmp_path / "audit", metrics, queue_events=1000)
    return audit, metrics, os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)


def _stalled_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[AuditSink, Metrics, int]:
    """``audit.path: null`` and the log goes to a pipe nobody reads (a stuck stderr)."""
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    handler = logging.StreamHandler(os.fdopen(write_end, "w"))
    logger = logging.getLogger("kafka_admission_proxy.audit.events")
    monkeypatch.setattr(logger, "handlers", [handler])
    monkeypatch.setattr(logger, "propagate", False)
    monkeypatch.setattr(logger, "level", logging.INFO)
    metrics = Metrics()
    return AuditSink(Audit(instance_id=INSTANCE, queue_events=1000), metrics), metrics, read_end


@pytest.mark.parametrize("stall", [_stalled_fifo, _stalled_log], ids=["file", "log"])
def test_record_returns_at_once_and_drops_when_the_destination_stalls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stall: Any
) -> None:
    others = set(threading.enumerate())  # an earlier test's sink may still have its writer
    audit, metrics, drain_fd = stall(tmp_path, monkeypatch)
    tracemalloc.start()
    try:
        slowest = 0.0
        for n in range(50_000):
            started = time.perf_counter()
            audit.record(numbered(n))
            slowest = max(slowest, time.perf_counter() - started)
            if n == 10_000:
                baseline, _ = tracemalloc.get_traced_memory()
        grown = tracemalloc.get_traced_memory()[0] - baseline
    finally:
        tracemalloc.stop()
    dropped = sample(metrics, "kafka_admission_audit_events_dropped_total")
    written = sample(metrics, "kafka_admission_audit_events_total", type="decision")
    # The destination takes ~64 KiB (a few hundred lines), the queue 1000 events: the rest is dropped.
    assert dropped >= 50_000 - 1000 - 4096 - 1000 and written < 1000
    assert sample(metrics, "kafka_admission_audit_queue_events") == 1000
    assert slowest < 0.5, f"a record() call took {slowest:.3f}s"
    assert grown < 1_000_000, f"memory grew {grown} bytes over 40,000 dropped events"
    started = time.monotonic()
    audit.close(timeout=0.3)  # bounded, though the writer is stuck
    assert time.monotonic() - started < 2
    # Unstall: read what the writer is blocked on until it finishes.
    writer = next(t for t in threading.enumerate() if t.name.startswith("audit-") and t not in others)
    while writer.is_alive():
        try:
            os.read(drain_fd, 1 << 16)
        except BlockingIOError:
            time.sleep(0.01)
    os.close(drain_fd)
