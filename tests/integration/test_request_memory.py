"""What one large request costs the running proxy: its size, which is what the memory pool
reserves for it (KIP-72), not twice that."""

from __future__ import annotations

import socket
from typing import Any

from tests.conftest import wait_until
from tests.processes import peak_rss_kib, rss_kib

MIB = 1 << 20


def test_a_48_mib_request_costs_the_proxy_its_size_once(tansu: Any, start_proxy: Any) -> None:
    """One ApiVersions frame of 48 MiB, sent whole: the proxy gathers it across receives.
    Joined from a list of receives it was held twice for an instant (peak RSS +95.7 MiB);
    copied into one buffer of its size as it arrives, +49.9 to +51.5 MiB (three runs)."""
    size = 48 * MIB
    proxy = start_proxy(tansu.bootstrap, policies={"socket.request.max.bytes": size})
    # Per process of the proxy (with workers, the worker that takes the connection grows):
    # a process whose peak (VmHWM: what is held only for an instant too) has moved grew from
    # its resident memory before to that peak.
    before = {pid: (rss_kib(pid), peak_rss_kib(pid)) for pid in proxy.pids()}
    host, port = proxy.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(size.to_bytes(4, "big") + b"\0\x12\0\x03" + bytes(size - 4))
        wait_until(lambda: proxy.metric("kafka_admission_requests_total", api="api_versions") == 1, timeout=30)
    assert proxy.pids() == sorted(before)
    grown_mib = sum(peak_rss_kib(pid) - rss for pid, (rss, peak) in before.items() if peak_rss_kib(pid) > peak) / 1024
    # Stated bound: the frame and a quarter (the receives in hand, the interpreter's own).
    assert grown_mib < 60, grown_mib
