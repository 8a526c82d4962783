"""Bad bytes from a client close only that connection, are counted, and cost no memory."""

from __future__ import annotations

import pytest

from tests.conftest import wait_until
from tests.raw_kafka import RawConnection, api_versions_frame


def assert_still_serving(address: str) -> None:
    with RawConnection(address) as conn:
        conn.send(api_versions_frame(correlation_id=99))
        response = conn.read_response(18, 3)
        assert response.header.correlation_id == 99
        assert response.body.error_code == 0


@pytest.fixture
def proxy(tansu, start_proxy):  # type: ignore[no-untyped-def]
    return start_proxy(tansu.bootstrap)


def test_garbage_bytes_close_only_that_connection(proxy) -> None:  # type: ignore[no-untyped-def]
    with RawConnection(proxy.bootstrap) as healthy, RawConnection(proxy.bootstrap) as bad:
        healthy.send(api_versions_frame(1))
        assert healthy.read_response(18, 3).header.correlation_id == 1
        bad.send(b"this is not the kafka protocol at all\r\n")
        assert bad.closed_by_peer()
        # The other connection, opened before, is untouched.
        healthy.send(api_versions_frame(2))
        assert healthy.read_response(18, 3).header.correlation_id == 2
    assert proxy.metric("kafka_admission_decisions_total", policy="request_size", limit="socket.request.max.bytes") == 1
    assert "socket.request.max.bytes=104857600" in proxy.log()
    assert_still_serving(proxy.bootstrap)


def test_a_length_prefix_of_max_int_is_refused_without_allocating(proxy) -> None:  # type: ignore[no-untyped-def]
    before = proxy.rss_kib()
    for _ in range(20):
        with RawConnection(proxy.bootstrap) as conn:
            conn.send((2**31 - 1).to_bytes(4, "big") + b"\0" * 64)
            assert conn.closed_by_peer()
    assert proxy.metric("kafka_admission_decisions_total", policy="request_size", action="close") == 20
    assert proxy.rss_kib() - before < 20 * 1024  # 20 x 2 GiB were never allocated
    assert_still_serving(proxy.bootstrap)


def test_a_connection_closed_mid_frame_is_counted(proxy) -> None:  # type: ignore[no-untyped-def]
    with RawConnection(proxy.bootstrap) as conn:
        conn.send((1000).to_bytes(4, "big") + b"\0\x12\0\x03" + b"x" * 20)
    wait_until(lambda: proxy.metric("kafka_admission_connection_failures_total", cause="truncated_frame") == 1)
    assert "stream closed mid-frame (24 of 1000 bytes)" in proxy.log()
    assert_still_serving(proxy.bootstrap)


def test_a_frame_too_short_for_a_request_header_is_malformed(proxy) -> None:  # type: ignore[no-untyped-def]
    with RawConnection(proxy.bootstrap) as conn:
        conn.send((3).to_bytes(4, "big") + b"\0\x12\0")
        assert conn.closed_by_peer()
    assert proxy.metric("kafka_admission_connection_failures_total", cause="malformed_frame") == 1
    assert_still_serving(proxy.bootstrap)
