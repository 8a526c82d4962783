"""Resources a client controls, held against the running proxy (a subprocess) in front of
a real Tansu (issue 33, "Attacks to close" 5): connections held in observe mode, the
observation window's memory, /readyz's broker connections, TLS handshake floods. Each
test reproduces the attack and fails on the code before its fix.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tests.conftest import wait_until
from tests.fake_upstreams import OversizeRelay
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


def test_a_readyz_flood_opens_at_most_one_broker_connection_per_second(tansu: Any, start_proxy: Any) -> None:
    """Bursts of 50 concurrent /readyz for at least 2.5 s share one upstream probe in flight
    and its answer for a second. The broker connections are counted where they arrive: a
    relay in front of the real Tansu that accepts and counts each one
    (fake_upstreams.OversizeRelay; no request carries its victim client id, so it passes
    everything). Before the fix each request opened one (hundreds); now at most one a
    second, and at least two over 2.5 s (the answer expires)."""
    relay = OversizeRelay(victim_client_id="no client sends this", announced=0)
    relay.broker = tansu.bootstrap
    try:
        proxy = start_proxy(relay.address)
        wait_until(lambda: "proxy ready" in proxy.log())
        before = relay.connections
        started = time.monotonic()
        answers: list[tuple[int, str]] = []
        with ThreadPoolExecutor(50) as pool:
            for _ in range(60):  # bounded: 60 bursts at most, 0.1 s apart
                answers += pool.map(lambda _: proxy.get("/readyz"), range(50))
                if time.monotonic() - started >= 2.5:
                    break
                time.sleep(0.1)
        took = time.monotonic() - started
        assert answers == [(200, "ready\n")] * len(answers)
        probes = relay.connections - before
        assert 2 <= probes <= math.ceil(took) + 1, (probes, len(answers), took)
    finally:
        relay.stop()
