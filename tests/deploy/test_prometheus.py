"""A real Prometheus server scrapes a proxy that has carried traffic, loads the
alert rules, answers PromQL over kafka_admission_ metrics with the values the
proxy exports, evaluates every dashboard query, and sees an alert turn pending
when its event happens."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.tansu import free_port, wait_for_port
from tests.conftest import ProxyProcess, wait_until
from tests.deploy.conftest import breach_an_identifier_limit, system_tool
from tests.deploy.test_alerts_and_dashboard import RULES, dashboard_expressions

JOB = "kafka-admission-proxy"


class Prometheus:
    def __init__(self, port: int) -> None:
        self.port = port

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as err:
            body = json.load(err)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.api("query", query=expr)["result"]  # type: ignore[no-any-return]

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=5) as resp:
            return bool(resp.status == 200)
    except OSError:  # HTTPError 503 while it starts, or refused
        return False


@pytest.fixture(scope="module")
def prometheus(busy_proxy: ProxyProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    binary = system_tool("prometheus", "prometheus")
    folder = tmp_path_factory.mktemp("prometheus")
    (folder / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{RULES}']\n"
        "scrape_configs:\n"
        f"  - job_name: {JOB}\n    static_configs: [{{targets: ['{busy_proxy.config['admin']['bind']}']}}]\n"
    )
    port = free_port()
    server = subprocess.Popen(
        [binary, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(folder / "prometheus.log").open("wb"),
    )
    try:
        wait_for_port("127.0.0.1", port, timeout=30)
        wait_until(lambda: _ready(port), timeout=30, interval=0.2)
        yield Prometheus(port)
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_promql_over_the_scraped_proxy_gives_the_values_it_exports(
    prometheus: Prometheus, busy_proxy: ProxyProcess
) -> None:
    expr = f'kafka_admission_requests_total{{job="{JOB}", listener="external", api="produce"}}'
    produced = wait_until(lambda: prometheus.value(expr), timeout=30, interval=0.5)
    assert produced == busy_proxy.metric("kafka_admission_requests_total", listener="external", api="produce") >= 1
    assert prometheus.value(f'up{{job="{JOB}"}}') == 1
    assert prometheus.value('sum(kafka_admission_config_reloads_total{outcome="invalid"})') == 1
    evicted = 'sum(kafka_admission_decisions_total{policy="connections",limit="max.ssl.connections"})'
    assert prometheus.value(evicted) == busy_proxy.metric(
        "kafka_admission_decisions_total", policy="connections", limit="max.ssl.connections")
    days_left = prometheus.value('(kafka_admission_tls_certificate_expiry_timestamp_seconds - time()) / 86400')
    assert days_left is not None and days_left > 30


def test_every_dashboard_query_evaluates(prometheus: Prometheus) -> None:
    wait_until(lambda: prometheus.value("count(up)"), timeout=30, interval=0.5)
    time.sleep(3)  # a few scrapes, so that rate() has two samples
    empty = []
    for expr in dashboard_expressions():
        concrete = (expr.replace("$job", ".*").replace("$instance", ".*")
                    .replace("$__rate_interval", "10s").replace("$__range", "1m"))
        if not prometheus.query(concrete):  # a PromQL error fails inside query()
            empty.append(expr)
    # Rates of counters that moved only before Prometheus started are empty or 0; the rest answer.
    assert len(empty) <= len(dashboard_expressions()) // 2, empty


def test_an_alert_turns_pending_when_its_event_happens(prometheus: Prometheus, busy_proxy: ProxyProcess) -> None:
    alert = 'ALERTS{alertname="KafkaAdmissionIdentifierRefusals", alertstate="pending"}'
    rule = f'kafka_admission_decisions_total{{policy="identifier_limits",job="{JOB}"}}'
    wait_until(lambda: prometheus.value(rule), timeout=30, interval=0.5)
    assert prometheus.query(alert) == []  # the breach so far happened before the first scrape
    breach_an_identifier_limit(busy_proxy.bootstrap)
    [pending] = wait_until(lambda: prometheus.query(alert), timeout=30, interval=0.5)
    assert pending["metric"]["limit"] == "resource.identifier.max.length" and pending["metric"]["severity"] == "warning"
    rules = prometheus.api("rules")["groups"][0]["rules"]
    assert {r["name"] for r in rules} >= {"KafkaAdmissionIdentifierRefusals", "KafkaAdmissionConfigReloadFailed"}
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]


def test_the_rules_file_loads_in_the_server(prometheus: Prometheus) -> None:
    files = {group["file"] for group in prometheus.api("rules")["groups"]}
    assert files == {str(Path(RULES))}
