"""The soak (``make soak``; SOAK_SECONDS, default 600): mixed traffic through the
proxy in front of a real Tansu for minutes, sampling the proxy's RSS, open file
descriptors and trio tasks (``kafka_admission_trio_tasks``) every few seconds, and
failing on growth. With ``--proxy-workers=N`` (``make soak SOAK_WORKERS=N``) the proxy is a
supervisor and N workers: each process is sampled and held to the bound on its own, and
none may have been restarted. Not in the default suite (marked ``slow``). Writes every sample
to ``.soak-report.json`` and prints a summary line for RELIABILITY.md.

Traffic: two idempotent producers (a record every 10 ms each), a consumer group
member reading them, a new metadata client every second, and every 5 s an HTTP
probe, a malformed frame, and a sender that stalls mid-request (dropped by
request.body.timeout.ms).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from tests.clients import GROUP_CONF, create_topic, unique
from tests.faults import ProducerTraffic, open_fds, serves
from tests.integration.test_faults import figures
from tests.processes import rss_kib

SOAK_SECONDS = float(os.environ.get("SOAK_SECONDS", "600"))
SAMPLE_EVERY_S = 5.0
REPORT = Path(__file__).resolve().parents[2] / ".soak-report.json"


def hostile(address: str) -> None:
    """An HTTP probe, a frame with a negative length, a stalled request body."""
    host, port = address.rsplit(":", 1)
    for data in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\xff\xff\xff\xf0\x00\x12\x00\x03"):
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(data)
            try:
                while sock.recv(4096):
                    pass
            except OSError:
                pass
    stalled = socket.create_connection((host, int(port)), timeout=5)
    stalled.sendall((1000).to_bytes(4, "big") + b"\x00\x12\x00\x03")  # 1000 bytes announced, 4 sent
    threading.Timer(4, stalled.close).start()


def consume_forever(bootstrap: str, topic: str, stop: threading.Event, counted: list[int]) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("soak"), **GROUP_CONF})
    consumer.subscribe([topic])
    while not stop.is_set():
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            counted[0] += 1
    consumer.close()


@pytest.mark.slow
def test_soak_mixed_traffic_without_growth(tansu: Any, start_proxy: Any) -> None:
    proxy = start_proxy(tansu.bootstrap, policies={"request.body.timeout.ms": 2000})
    pids = proxy.pids()  # the proxy, or a supervisor and its workers
    topic = unique("soak")
    create_topic(proxy.bootstrap, topic, partitions=2)
    producers = [ProducerTraffic(proxy.bootstrap, topic, name=f"p{i}").start() for i in range(2)]
    stop = threading.Event()
    consumed = [0]
    consumer = threading.Thread(target=consume_forever, args=(proxy.bootstrap, topic, stop, consumed))
    consumer.start()
    samples: list[dict[str, float]] = []
    started = time.monotonic()
    next_sample = started
    clients = 0
    try:
        while (now := time.monotonic()) - started < SOAK_SECONDS:
            AdminClient({"bootstrap.servers": proxy.bootstrap}).list_topics(timeout=10)
            clients += 1
            if now >= next_sample:
                hostile(proxy.bootstrap)
                alive = proxy.pids()
                assert alive == pids, f"at {now - started:.0f} s the proxy's processes were {alive}, not {pids}"
                samples.append(
                    {
                        "t": round(now - started, 1),
                        "rss_kib": {str(pid): rss_kib(pid) for pid in pids},
                        "fds": {str(pid): open_fds(pid) for pid in pids},
                        "tasks": proxy.metric("kafka_admission_trio_tasks"),
                        "connections": proxy.metric("kafka_admission_connections_active"),
                        "acked": sum(len(p.acked) for p in producers),
                        "consumed": consumed[0],
                    }
                )
                next_sample += SAMPLE_EVERY_S
            time.sleep(1)
    finally:
        stop.set()
        for p in producers:
            p.stop()
        consumer.join(30)
    REPORT.write_text(json.dumps({"seconds": SOAK_SECONDS, "samples": samples}, indent=1))
    assert proxy.process.poll() is None
    assert serves(proxy.bootstrap)
    assert [p.failed for p in producers] == [[], []]
    assert len(samples) >= 10

    # Growth: the last fifth against the second fifth (the first is warm-up), per process.
    fifth = len(samples) // 5
    early, late = samples[fifth : 2 * fifth], samples[-fifth:]
    tasks_growth = max(s["tasks"] for s in late) - max(s["tasks"] for s in early)
    shown, grown = {}, {}
    for pid in map(str, pids):
        rss_early = statistics.median(s["rss_kib"][pid] for s in early)
        rss_late = statistics.median(s["rss_kib"][pid] for s in late)
        fds = [s["fds"][pid] for s in samples]
        shown[f"pid {pid}"] = (
            f"rss_mib_early {rss_early / 1024:.1f}, rss_mib_late {rss_late / 1024:.1f}, "
            f"rss_mib_max {max(s['rss_kib'][pid] for s in samples) / 1024:.1f}, fds_range {min(fds)}-{max(fds)}"
        )
        fds_growth = max(s["fds"][pid] for s in late) - max(s["fds"][pid] for s in early)
        grown[pid] = (rss_late - rss_early, max(8 * 1024, 0.1 * rss_early), fds_growth)
    figures(
        f"soak {SOAK_SECONDS:g} s, {len(pids)} process(es)",
        samples=len(samples),
        metadata_clients=clients,
        acked=samples[-1]["acked"],
        consumed=samples[-1]["consumed"],
        tasks_range=f"{min(s['tasks'] for s in samples):g}-{max(s['tasks'] for s in samples):g}",
        **shown,
    )
    for pid, (rss_growth_kib, rss_bound_kib, fds_growth) in grown.items():
        assert rss_growth_kib <= rss_bound_kib, f"process {pid}: RSS grew {rss_growth_kib} KiB"
        assert fds_growth <= 10, f"process {pid}: open fds grew by {fds_growth}"
    assert tasks_growth <= 20, f"trio tasks grew by {tasks_growth}"
    assert samples[-1]["consumed"] > 0
