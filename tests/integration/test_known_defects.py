"""Black-box regression tests for defects found by trying the proxy as a new user
would and by fuzzing, run against the proxy as a subprocess.

The first group was fixed by the request-path rewrite (issue 15). The last one
was found by the wire fuzzing of issue 13: kio 0.6.5 takes an array's element
count from the wire and allocates for it before checking that the frame can hold
that many elements; a count near 2**32 asks for ~34 GB and Rust aborts the process
(KAFKA-14063 is the same bug, fixed in Kafka's own parser). proxy/protocol/count_guard.py
refuses such frames before kio reads them.
"""

from __future__ import annotations

import re
import socket
import struct
import subprocess
import time

import pytest
from confluent_kafka import Consumer

from tests.clients import unique
from tests.conftest import wait_until
from tests.fake_upstreams import tls_alert_broker
from tests.raw_kafka import RawConnection, api_versions_frame


def curl(address: str) -> str:
    result = subprocess.run(
        ["curl", "-s", "-i", "--max-time", "5", f"http://{address}/"], capture_output=True, text=True
    )
    return result.stdout


def test_http_during_the_tls_mismatch_backoff_gets_the_400(start_proxy) -> None:  # type: ignore[no-untyped-def]
    upstream = tls_alert_broker()
    try:
        proxy = start_proxy(upstream.address)
        with RawConnection(proxy.bootstrap) as conn:  # meets the TLS alert: the backoff starts
            conn.send(api_versions_frame(1))
            assert conn.closed_by_peer()
        wait_until(lambda: "speaks TLS; set upstream.tls.enabled" in proxy.log())
        assert curl(proxy.bootstrap).startswith("HTTP/1.1 400 Bad Request")
    finally:
        upstream.stop()


@pytest.fixture
def proxy_with_the_upstream_down(start_proxy):  # type: ignore[no-untyped-def]
    from demo.tansu import free_port

    return start_proxy(f"127.0.0.1:{free_port()}")


def test_with_the_upstream_down_the_log_does_not_say_ready(proxy_with_the_upstream_down) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_with_the_upstream_down
    assert proxy.get("/readyz")[0] == 503
    assert "proxy ready" not in proxy.log()


def thirty_clients(proxy) -> None:  # type: ignore[no-untyped-def]
    """Thirty clients in about two seconds, each sending ApiVersions once."""
    for i in range(30):
        with RawConnection(proxy.bootstrap) as conn:
            conn.send(api_versions_frame(i))
            assert conn.closed_by_peer()
        time.sleep(0.05)


def test_with_the_upstream_down_clients_do_not_flood_the_log(proxy_with_the_upstream_down) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_with_the_upstream_down
    thirty_clients(proxy)
    warnings = [line for line in proxy.log().splitlines() if " WARNING " in line]
    assert len(warnings) <= 10, f"{len(warnings)} warning lines for 30 clients"


def doubling_attempts(seconds: float, first: float, most: float) -> int:
    """Attempts in ``seconds`` when each failure blocks the next for twice as long as the last,
    from ``first`` up to ``most`` seconds."""
    attempts, blocked_until, delay = 1, first, first
    while blocked_until <= seconds:
        delay = min(delay * 2, most)
        attempts, blocked_until = attempts + 1, blocked_until + delay
    return attempts


def test_with_the_upstream_down_the_proxy_backs_off_from_the_broker(proxy_with_the_upstream_down) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_with_the_upstream_down
    thirty_clients(proxy)
    attempts = proxy.metric("kafka_admission_upstream_connect_failures_total")
    # Without a backoff: one attempt per client (30). With it, at most what doubling allows in
    # the time the proxy has run (in 3 s: 5 and 3), as Kafka's clients back off per node (from
    # 0.2 s, up to 10 s), and the readiness probes' own retries (1 s doubling, up to 30 s). The
    # bound follows that time, so a slow machine does not turn a longer run into a failure.
    # With `workers: N` each worker probes on its own: N times the probes. The clients' attempts are
    # one process's (the workers share their blocks, docs/workers.md); the bound allows N times those
    # too, still far below one per client.
    ran = time.time() - proxy.metric("process_start_time_seconds")
    workers = proxy.config.get("workers", 1)
    bound = workers * (doubling_attempts(ran, 0.2, 10.0) + doubling_attempts(ran, 1.0, 30.0))
    assert attempts <= bound, f"{attempts:.0f} attempts to a down broker for 30 clients in {ran:.1f} s"


def test_http_with_the_upstream_down_gets_the_400(proxy_with_the_upstream_down) -> None:  # type: ignore[no-untyped-def]
    assert curl(proxy_with_the_upstream_down.bootstrap).startswith("HTTP/1.1 400 Bad Request")


def test_kip848_group_reconcile_against_the_mock_cluster_reports_nothing_malformed(  # type: ignore[no-untyped-def]
    mock_cluster, start_proxy
) -> None:
    from confluent_kafka.admin import AdminClient

    proxy = start_proxy(mock_cluster.bootstrap_servers, node_ids=(1, 2, 3), policies={"group.consumer.max.size": 5})
    topic, group = unique("kip848"), unique("g848")
    AdminClient({"bootstrap.servers": proxy.bootstrap}).list_topics(topic, timeout=10)  # the mock creates it
    conf = {"bootstrap.servers": proxy.bootstrap, "group.id": group, "group.protocol": "consumer"}
    consumers = []
    try:
        # The second join is to a group the proxy knows but never reconciled: it asks the coordinator.
        for _ in range(2):
            consumer = Consumer(conf)
            consumer.subscribe([topic])
            consumers.append(consumer)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and not consumer.assignment():
                for c in consumers:
                    c.poll(0.1)
            assert consumer.assignment(), "a KIP-848 consumer was never assigned"
    finally:
        for c in consumers:
            c.close()
    assert proxy.metric("kafka_admission_requests_total", api="consumer_group_heartbeat") >= 1
    assert not re.search(r"could not describe group.*MalformedFrame", proxy.log()), proxy.log()[-2000:]


# A JoinGroup v6 (flexible) whose `protocols` compact array claims 4,294,967,294 elements.
JOIN_GROUP_V6_HEADER = b"\x00\x0b\x00\x06\x00\x00\x00\x01\x00\x01c\x00"
JOIN_GROUP_V6_BODY = (
    b"\x02g"
    + (10000).to_bytes(4, "big") * 2
    + b"\x01"
    + b"\x00"
    + b"\x09consumer"
    + b"\xff\xff\xff\xff\x0f"
    + b"\0" * 8
)


def test_a_join_group_claiming_four_billion_protocols_closes_only_that_connection(tansu, start_proxy) -> None:  # type: ignore[no-untyped-def]
    proxy = start_proxy(tansu.bootstrap, policies={"resource.identifier.limit.enable": True})
    frame_body = JOIN_GROUP_V6_HEADER + JOIN_GROUP_V6_BODY
    with RawConnection(proxy.bootstrap) as conn:
        conn.send(len(frame_body).to_bytes(4, "big") + frame_body)
        assert conn.closed_by_peer()
    # The proxy counted the frame as malformed (so it read it), then serves the next client.
    wait_until(lambda: proxy.metric("kafka_admission_connection_failures_total", cause="malformed_frame") == 1)
    with RawConnection(proxy.bootstrap) as conn:
        conn.send(api_versions_frame(2))
        assert conn.read_response(18, 3).header.correlation_id == 2
    assert proxy.process.poll() is None, f"the proxy died:\n{proxy.log()[-600:]}"


def test_clients_resetting_before_their_first_request_cost_only_their_connections(tansu, start_proxy) -> None:  # type: ignore[no-untyped-def]
    # Found by the connection storm: a reset read before the first length prefix was
    # complete escaped the connection and ended the proxy.
    proxy = start_proxy(tansu.bootstrap)
    host, port = proxy.bootstrap.rsplit(":", 1)
    for _ in range(20):
        sock = socket.create_connection((host, int(port)))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.sendall(b"\x00\x00")  # half a length prefix, then a reset
        sock.close()
    wait_until(lambda: proxy.metric("kafka_admission_connection_failures_total", cause="broken") == 20)
    with RawConnection(proxy.bootstrap) as conn:
        conn.send(api_versions_frame(1))
        assert conn.read_response(18, 3).header.correlation_id == 1
    assert proxy.process.poll() is None
