"""The console script's run/demo commands and its log formats."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.raw_kafka import RawConnection, api_versions_frame


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


def test_the_proxy_and_its_workers_serve_without_the_test_tools_kio_would_import(tansu, start_proxy) -> None:
    """This environment has hypothesis, which kio imports whenever it can (and pytest comes with
    it through trio's hypothesis plugin); the serving processes leave both out (`leave_out_test_tools`).
    PYTHONPROFILEIMPORTTIME makes each process write every module it imports to the log."""
    proxy = start_proxy(tansu.bootstrap, workers=2, command_prefix=["env", "PYTHONPROFILEIMPORTTIME=1"])
    with RawConnection(proxy.bootstrap) as conn:  # a served request: each module it needs is loaded
        conn.send(api_versions_frame(1))
        assert conn.read_frame()
    proxy.stop()
    imported = [line.rsplit("|", 1)[1].strip() for line in proxy.log().splitlines() if line.startswith("import time:")]
    assert imported.count("kio") == 3, "the supervisor and both workers import kio, each once"
    # kio's `import hypothesis.strategies` is still tried (a line of its own, which loads nothing);
    # the package itself, whose line comes once it is loaded, never is.
    assert "hypothesis" not in imported
    assert not [name for name in imported if name.split(".")[0] in ("pytest", "_pytest")]
