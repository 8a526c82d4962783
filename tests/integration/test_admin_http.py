"""/healthz, /readyz and /metrics of the admin HTTP server."""

from __future__ import annotations

from demo.tansu import free_port
from tests.raw_kafka import RawConnection, api_versions_frame


def test_healthz_and_readyz_with_a_reachable_broker(tansu, start_proxy) -> None:
    proxy = start_proxy(tansu.bootstrap)
    assert proxy.get("/healthz") == (200, "ok\n")
    assert proxy.get("/readyz") == (200, "ready\n")


def test_readyz_names_an_unreachable_upstream(start_proxy) -> None:
    nowhere = f"127.0.0.1:{free_port()}"
    proxy = start_proxy(nowhere)
    status, body = proxy.get("/readyz")
    assert status == 503
    assert f"no upstream broker reachable: cannot connect to broker {nowhere}" in body
    assert proxy.get("/healthz")[0] == 200  # alive, just not ready


def test_a_client_whose_broker_is_down_is_closed_and_counted(start_proxy) -> None:
    nowhere = f"127.0.0.1:{free_port()}"
    proxy = start_proxy(nowhere)
    with RawConnection(proxy.bootstrap) as conn:
        conn.send(api_versions_frame(1))
        assert conn.closed_by_peer()
    assert proxy.metric("kafka_admission_upstream_connect_failures_total", upstream=nowhere) >= 1
    assert proxy.metric("kafka_admission_connection_failures_total", cause="upstream_unavailable") == 1
    assert "cannot connect to broker" in proxy.log()


def test_metrics_cover_connections_requests_bytes_and_latency(tansu, start_proxy) -> None:
    proxy = start_proxy(tansu.bootstrap)
    with RawConnection(proxy.bootstrap) as conn:
        for i in range(5):
            conn.send(api_versions_frame(i))
            conn.read_frame()
    assert proxy.metric("kafka_admission_connections_accepted_total", listener="external", tls="false") == 1
    assert proxy.metric("kafka_admission_requests_total", listener="external", api="api_versions") == 5
    assert proxy.metric("kafka_admission_request_bytes_total", listener="external") > 0
    assert proxy.metric("kafka_admission_response_bytes_total", listener="external") > 0
    assert proxy.metric("kafka_admission_proxy_added_latency_seconds_count", listener="external") == 5
    status, _ = proxy.get("/nope")
    assert status == 404
