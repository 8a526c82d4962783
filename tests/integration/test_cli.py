"""The console script's run/demo commands and its log formats."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.raw_kafka import RawConnection


def test_json_logs_name_peer_listener_and_cause_of_a_connection_failure(tansu, start_proxy) -> None:
    proxy = start_proxy(tansu.bootstrap, extra_args=["--log-format", "json"])
    with RawConnection(proxy.bootstrap) as conn:
        conn.send(b"\xff\xff\xff\xff")
        assert conn.closed_by_peer()
    proxy.stop()
    entries = [json.loads(line) for line in proxy.log().splitlines() if line.startswith("{")]
    failures = [e for e in entries if e["msg"].startswith("connection closed:")]
    assert len(failures) == 1
    failure = failures[0]
    assert failure["listener"] == "external"
    assert failure["cause"] == "request_invalid_size"
    assert failure["peer"].startswith("127.0.0.1:")
    assert failure["level"] == "warning"


@pytest.mark.demo_ports
def test_demo_runs_the_workload_through_the_proxy_and_stops_everything() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "demo", "--exit-after-workload", "--records", "300"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "produced 300, consumed 300 records" in result.stdout
    assert "metrics:                   http://127.0.0.1:9464/metrics" in result.stdout
    assert "proxy listener:            127.0.0.1:29092" in result.stdout
