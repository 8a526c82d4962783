"""Audit under pressure, in the real proxy (subprocess, real Tansu broker): while
the disk under ``audit.path`` stops answering (a FUSE mount whose writes block,
tests/stalled_fs.py), a flood of observe-mode decisions keeps being forwarded,
the events that do not fit the bounded queue are counted as dropped, and the
proxy's memory stays bounded. When the disk answers again, the writer carries on."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.audit_files import assert_valid, read_events
from tests.conftest import wait_until
from tests.raw_kafka import RawConnection, api_versions_frame
from tests.stalled_fs import StalledFilesystem

QUEUE_EVENTS = 2000
LONG_CLIENT_ID = "flood-" + "x" * 244  # 250 characters: one over KIP-1233's 249
BATCH = 200  # requests pipelined on the connection before reading their responses


def _flood(address: str, requests: int) -> int:
    """``requests`` ApiVersions requests with the long client id (each one an observe-mode
    decision); the number answered, in order."""
    answered = 0
    with RawConnection(address, timeout=10) as conn:
        for start in range(0, requests, BATCH):
            ids = range(start, min(start + BATCH, requests))
            conn.send(b"".join(api_versions_frame(i, client_id=LONG_CLIENT_ID) for i in ids))
            for i in ids:
                response = conn.read_response(18, 3)
                assert response.header.correlation_id == i and response.body.error_code == 0
                answered += 1
    return answered


def test_a_stalled_audit_disk_costs_dropped_events_not_forwarding_or_memory(
    tansu: Any, start_proxy: Any, tmp_path: Path
) -> None:
    with StalledFilesystem(tmp_path / "disk", tmp_path / "mnt") as disk:
        audit = disk.mount / "audit"
        proxy = start_proxy(
            tansu.bootstrap,
            policies={"resource.identifier.limit.enable": True, "resource.identifier.limit.mode": "observe"},
            audit={"path": str(audit), "instance_id": "pressed", "queue_events": QUEUE_EVENTS},
        )
        # Each audit instance (with workers: the supervisor and each worker) has its own queue.
        queue_bound = QUEUE_EVENTS * len(proxy.audit_instances("pressed"))
        assert _flood(proxy.bootstrap, 50) == 50  # the disk answers: written, nothing dropped
        wait_until(lambda: proxy.metric("kafka_admission_audit_events_total", type="decision") >= 50)
        assert proxy.metric("kafka_admission_audit_events_dropped_total") == 0

        disk.stall()
        _flood(proxy.bootstrap, 10)  # the writer's next write blocks in the kernel
        wait_until(lambda: disk.writes_held >= 1, timeout=10)
        rss_before = proxy.rss_kib()
        started = time.monotonic()
        total = 20 * QUEUE_EVENTS
        assert _flood(proxy.bootstrap, total) == total  # every request forwarded and answered
        flood_seconds = time.monotonic() - started
        dropped = proxy.metric("kafka_admission_audit_events_dropped_total")
        queued = proxy.metric("kafka_admission_audit_queue_events")
        grown_kib = proxy.rss_kib() - rss_before
        # The queues hold at most their bound; every decision beyond the flooded worker's was counted as dropped.
        assert queued <= queue_bound
        assert dropped >= total - QUEUE_EVENTS - BATCH, (dropped, total)
        # 40,000 decisions held in memory would be tens of MB; the bound is the queue's 2,000.
        assert grown_kib < 20 * 1024, f"RSS grew {grown_kib} KiB during the flood"
        assert disk.writes_held >= 1  # still stalled: nothing above came from a disk that answered
        assert flood_seconds < 60

        disk.resume()
        # The writer wakes and writes what the queue held; then new decisions are written again, none dropped.
        wait_until(lambda: proxy.metric("kafka_admission_audit_queue_events") == 0)
        dropped = proxy.metric("kafka_admission_audit_events_dropped_total")
        written = proxy.metric("kafka_admission_audit_events_total", type="decision")
        assert _flood(proxy.bootstrap, 20) == 20
        wait_until(lambda: proxy.metric("kafka_admission_audit_events_total", type="decision") >= written + 20)
        assert proxy.metric("kafka_admission_audit_events_dropped_total") == dropped
        # Every decision was written or counted among the dropped events (which count every kind).
        decided = proxy.metric("kafka_admission_decisions_total")
        assert proxy.metric("kafka_admission_decisions_total", policy="identifier_limits") == 50 + 10 + total + 20
        written = proxy.metric("kafka_admission_audit_events_total", type="decision")
        assert written <= decided <= written + dropped
        proxy.stop()
        assert proxy.returncode == 0, proxy.log()[-3000:]
        events = read_events(audit, finished_only=True)
        assert_valid(events)
        assert len([e for e in events if e["type"] == "decision"]) == written
