"""A real Prometheus server scrapes a proxy that has carried traffic, loads the
alert rules, answers PromQL over kafka_admission_ metrics with the values the
proxy exports, shows data in every dashboard panel (each series a query selects was
scraped), and sees an alert turn pending when its event happens."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from demo.tansu import free_port, wait_for_port
from tests.conftest import ProxyProcess, wait_until
from tests.deploy.conftest import breach_an_identifier_limit, system_tool
from tests.deploy.test_alerts_and_dashboard import DASHBOARD, RULES
from tests.integration.test_workers import close_all, connections_on_every_worker, round_trip
from tests.workers_util import start_workers

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


@contextmanager
def running_prometheus(folder: Path, job: str, target: str) -> Iterator[Prometheus]:
    """A Prometheus server with the alert rules, scraping ``target`` as ``job`` each second."""
    binary = system_tool("prometheus", "prometheus")
    (folder / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{RULES}']\n"
        "scrape_configs:\n"
        f"  - job_name: {job}\n    static_configs: [{{targets: ['{target}']}}]\n"
    )
    port = free_port()
    server = subprocess.Popen(
        [
            binary,
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(folder / "prometheus.log").open("wb"),
    )
    try:
        wait_for_port("127.0.0.1", port, timeout=30)
        wait_until(lambda: _ready(port), timeout=30, interval=0.2)
        yield Prometheus(port)
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture(scope="module")
def prometheus(busy_proxy: ProxyProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    with running_prometheus(tmp_path_factory.mktemp("prometheus"), JOB, busy_proxy.config["admin"]["bind"]) as server:
        yield server


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
        "kafka_admission_decisions_total", policy="connections", limit="max.ssl.connections"
    )
    days_left = prometheus.value("(kafka_admission_tls_certificate_expiry_timestamp_seconds - time()) / 86400")
    assert days_left is not None and days_left > 30


# A series selector in PromQL (``name{matchers}``), and the labels a ``by (...)`` keeps.
SELECTOR = re.compile(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\{[^}]*\}")
GROUPED_BY = re.compile(r"\bby \(([^)]*)\)")


def test_every_dashboard_panel_shows_series_prometheus_scraped(
    prometheus: Prometheus, busy_proxy: ProxyProcess
) -> None:
    """Each panel's every query, as Grafana would send it for this proxy: each series it selects
    exists in Prometheus after the scrapes, the query answers, and each label it groups by is in
    the answer (a missing one leaves a legend blank). A panel over a metric or label that the
    proxy does not export would show "No data" for ever."""
    # Three scrapes: a rate() over the last ones answers (0 for a counter that did not move).
    scrapes = f'count_over_time(up{{job="{JOB}"}}[1m])'
    wait_until(lambda: (prometheus.value(scrapes) or 0) >= 3, timeout=30, interval=0.5)
    variables = {
        "$job": JOB,
        "$instance": busy_proxy.config["admin"]["bind"],
        "$__rate_interval": "10s",
        "$__range": "1m",
    }
    problems = []
    panels = [panel for panel in json.loads(DASHBOARD.read_text())["panels"] if panel["type"] != "row"]
    for panel in panels:
        title = panel["title"]
        if not panel.get("targets"):
            problems.append(f"{title}: no query")
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in variables.items():
                expr = expr.replace(variable, value)
            problems += [f"{title}: no series {s}" for s in SELECTOR.findall(expr) if not prometheus.query(s)]
            answer = prometheus.query(expr)  # a PromQL error fails inside query()
            if not answer:
                problems.append(f"{title}: no answer to {expr}")
            grouped = {label.strip() for by in GROUPED_BY.findall(expr) for label in by.split(",")} - {"le"}
            shown = {label for series in answer for label in series["metric"]}
            if answer and grouped - shown:
                problems.append(f"{title}: no label {sorted(grouped - shown)} in the answer to {expr}")
    assert problems == []
    assert len(panels) >= 20  # every panel of the dashboard was read


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


def test_the_reload_alert_follows_the_proxy_gauge_and_the_down_alert_a_stopped_proxy(  # type: ignore[no-untyped-def]
    tansu, start_proxy, tmp_path
) -> None:
    """End to end, a proxy of its own under a real Prometheus with the rules: a refused
    reload turns KafkaAdmissionConfigReloadFailed pending (its `for:` is minutes) with the
    target's labels, a good one ends it; a stopped proxy turns KafkaAdmissionProxyDown pending."""
    proxy = start_proxy(tansu.bootstrap)
    target = proxy.config["admin"]["bind"]
    job = "kafka-admission-proxy-reload"  # a job the rules' `job=~".*kafka-admission-proxy.*"` selects
    reload_alert = 'ALERTS{alertname="KafkaAdmissionConfigReloadFailed"}'
    with running_prometheus(tmp_path, job, target) as prometheus:
        wait_until(
            lambda: prometheus.value("kafka_admission_config_last_reload_successful") == 1, timeout=30, interval=0.5
        )
        assert prometheus.query(reload_alert) == []
        proxy.reload("policies: {group.max.size: -5}\n" + yaml.safe_dump(proxy.config), expect="invalid")
        [pending] = wait_until(lambda: prometheus.query(reload_alert), timeout=30, interval=0.5)
        assert pending["metric"]["alertstate"] == "pending"
        assert (pending["metric"]["instance"], pending["metric"]["job"]) == (target, job)
        proxy.reload(yaml.safe_dump(proxy.config))
        wait_until(lambda: prometheus.query(reload_alert) == [], timeout=30, interval=0.5)
        down_alert = 'ALERTS{alertname="KafkaAdmissionProxyDown"}'
        assert prometheus.query(down_alert) == []
        proxy.stop()
        [down] = wait_until(lambda: prometheus.query(down_alert), timeout=30, interval=0.5)
        assert (down["metric"]["alertstate"], down["metric"]["instance"]) == ("pending", target)


def test_prometheus_scraping_a_proxy_of_two_workers_counts_each_request_once(
    tansu: Any, start_proxy: Any, tmp_path: Path
) -> None:
    """workers: 2 (issue 29): Prometheus scrapes the supervisor's one /metrics, and PromQL's
    sum over the series gives every round trip once, whichever worker served it: the series
    carry no per-process label (prometheus-client's multiprocess mode merges the workers)."""
    proxy = start_workers(start_proxy, tansu.bootstrap, 2)
    by_worker = connections_on_every_worker(proxy, 2, 16)  # one round trip each
    try:
        for i, conn in enumerate(conn for conns in by_worker.values() for conn in conns):
            for k in range(4):
                assert round_trip(conn, 100 + 10 * i + k) == 0
        with running_prometheus(tmp_path, JOB, proxy.config["admin"]["bind"]) as prometheus:
            expr = f'kafka_admission_requests_total{{job="{JOB}", api="api_versions"}}'
            wait_until(lambda: prometheus.value(expr), timeout=30, interval=0.5)
            series = prometheus.query(expr)
            assert len(series) == 1, series  # one series for both workers
            assert prometheus.value(f"sum({expr})") == 16 * 5
            assert prometheus.value(f'sum(kafka_admission_connections_active{{job="{JOB}"}})') == 16
            assert prometheus.value(f'kafka_admission_build_info{{job="{JOB}"}}') == 1
    finally:
        close_all(by_worker)
