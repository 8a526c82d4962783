"""A real Prometheus server scrapes the proxy; promtool lints the exposition."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from proxy.tansu import free_port, wait_for_port
from tests.raw_kafka import RawConnection, api_versions_frame


def require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} not installed (apt-get install prometheus)")
    return path


def test_promtool_accepts_the_metrics_exposition(tansu, start_proxy, tmp_path: Path) -> None:
    promtool = require("promtool")
    proxy = start_proxy(tansu.bootstrap)
    with RawConnection(proxy.bootstrap) as conn:
        conn.send(api_versions_frame(1))
        conn.read_frame()
    _, text = proxy.get("/metrics")
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def query(port: int, expr: str) -> list[dict]:  # type: ignore[type-arg]
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.load(resp)["data"]["result"]  # type: ignore[no-any-return]


def test_prometheus_scrapes_request_counts_from_the_proxy(tansu, start_proxy, tmp_path: Path) -> None:
    prometheus = require("prometheus")
    proxy = start_proxy(tansu.bootstrap)
    with RawConnection(proxy.bootstrap) as conn:
        for i in range(3):
            conn.send(api_versions_frame(i))
            conn.read_frame()
    port = free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: kafka-admission-proxy\n    static_configs: [{{targets: ['{proxy.config['admin']['bind']}']}}]\n"
    )
    server = subprocess.Popen(
        [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port("127.0.0.1", port, timeout=30)
        expr = 'kafka_admission_requests_total{api="api_versions",listener="external"}'
        deadline = time.monotonic() + 30
        result: list[dict] = []  # type: ignore[type-arg]
        while time.monotonic() < deadline and not result:
            try:
                result = query(port, expr)
            except OSError:
                pass
            time.sleep(0.5)
        assert result, "Prometheus never saw the proxy's request counter"
        assert float(result[0]["value"][1]) == 3
        assert result[0]["metric"]["job"] == "kafka-admission-proxy"
        assert query(port, 'up{job="kafka-admission-proxy"}')[0]["value"][1] == "1"
    finally:
        server.terminate()
        server.wait(timeout=10)
