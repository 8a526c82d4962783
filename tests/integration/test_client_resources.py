"""Resources a client controls, held against the running proxy (a subprocess) in front of
a real Tansu (issue 33, "Attacks to close" 5): connections held in observe mode, the
observation window's memory, /readyz's broker connections, TLS handshake floods. Each
test reproduces the attack and fails on the code before its fix.
"""

from __future__ import annotations

import time
from typing import Any

from tests.conftest import wait_until
from tests.faults import StoppedClient
from tests.raw_kafka import RawConnection


def test_observe_mode_still_closes_silent_and_non_reading_clients(tansu: Any, start_proxy: Any) -> None:
    """Observe mode dry-runs the limits, not the proxy's hygiene: a client that never
    speaks, one that went silent after a round trip, and one that never reads its responses
    (the proxy's send stalls) are all closed after connections.max.idle.ms (2 s), within a
    generous 15 s. Before the fix all three were held for ever in observe mode."""
    proxy = start_proxy(tansu.bootstrap, policies={"mode": "observe", "connections.max.idle.ms": 2000})
    clients = [StoppedClient(proxy.bootstrap, "idle")]
    silent = RawConnection(proxy.bootstrap, timeout=0.2)
    opened = time.monotonic()
    try:
        clients.append(StoppedClient(proxy.bootstrap, "unread"))
        assert clients[1].sent > 1000  # it got ahead of the proxy, which stopped reading it
        assert wait_until(silent.closed_by_peer, timeout=15)
        assert time.monotonic() - opened >= 1.5  # by the idle clock (2 s), not at once
        wait_until(lambda: proxy.metric("kafka_admission_connections_active") == 0, timeout=15)
        # The two idle ones by the reaper, enforced although every policy observes; the
        # non-reading one by the send stall.
        assert (
            proxy.metric(
                "kafka_admission_decisions_total", action="close", limit="connections.max.idle.ms", mode="enforce"
            )
            == 3
        )
    finally:
        silent.close()
        for client in clients:
            client.kill()
