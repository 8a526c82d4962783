"""SIGTERM: stop accepting, let requests in flight finish (bounded), exit 0."""

from __future__ import annotations

import socket
import time
import uuid

import pytest

from tests.clients import create_topic
from tests.raw_kafka import RawConnection, fetch_frame, metadata_frame


def topic_id(conn: RawConnection, topic: str):  # type: ignore[no-untyped-def]
    conn.send(metadata_frame(1))
    metadata = conn.read_response(3, 12).body
    return next(t.topic_id for t in metadata.topics if t.name == topic)


def refuses_connections(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.fixture
def waiting_fetch(tansu, start_proxy):  # type: ignore[no-untyped-def]
    """A proxy and a connection through it, ready to send a Fetch the broker holds for a while."""

    def make(max_wait_ms: int, drain_timeout: float = 30):  # type: ignore[no-untyped-def]
        proxy = start_proxy(tansu.bootstrap, extra_args=["--drain-timeout", str(drain_timeout)])
        topic = f"empty-{uuid.uuid4().hex[:8]}"
        create_topic(proxy.bootstrap, topic)
        conn = RawConnection(proxy.bootstrap, timeout=15)
        tid = topic_id(conn, topic)
        conn.send(fetch_frame(7, tid, max_wait_ms=max_wait_ms))
        time.sleep(0.3)  # the Fetch is now parked at the broker
        return proxy, conn

    return make


def test_in_flight_request_completes_after_sigterm(waiting_fetch) -> None:  # type: ignore[no-untyped-def]
    proxy, conn = waiting_fetch(max_wait_ms=2000)
    with conn:
        proxy.signal()
        time.sleep(0.3)
        assert refuses_connections(proxy.bootstrap), "still accepting after SIGTERM"
        response = conn.read_response(1, 13)
        assert response.header.correlation_id == 7
        assert response.body.error_code == 0
        assert conn.closed_by_peer()  # then the drained connection is closed
    assert proxy.wait(timeout=15) == 0


def test_drain_time_is_bounded(waiting_fetch) -> None:  # type: ignore[no-untyped-def]
    proxy, conn = waiting_fetch(max_wait_ms=10000, drain_timeout=0.5)
    with conn:
        started = time.monotonic()
        proxy.signal()
        assert proxy.wait(timeout=15) == 0
        assert time.monotonic() - started < 5
    assert "drain time over; closing 1 connections" in proxy.log()
