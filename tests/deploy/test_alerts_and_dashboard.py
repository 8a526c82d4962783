"""The Prometheus alert rules and the Grafana dashboard: promtool checks and
unit-tests the rules, and every metric they read exists in the /metrics of a
running proxy that has carried traffic and met each event they watch."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT, ProxyProcess
from tests.deploy.conftest import system_tool
from tests.markdown import github_anchors

RULES = ROOT / "deploy" / "prometheus" / "kafka-admission-proxy.rules.yaml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "kafka-admission-proxy.rules.test.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "kafka-admission-proxy.json"
# Where every runbook_url points (relative to the repository), one heading per alert.
RUNBOOKS = "docs/alerts.md"
# The alerts the operators asked for, by what they watch.
ALERTS = {
    "KafkaAdmissionMemoryPoolExhausted",
    "KafkaAdmissionTlsConnectionCapReached",
    "KafkaAdmissionEvictionsRising",
    "KafkaAdmissionGroupRefusals",
    "KafkaAdmissionIdentifierRefusals",
    "KafkaAdmissionUpstreamDown",
    "KafkaAdmissionConfigReloadFailed",
    "KafkaAdmissionCertificateExpiresSoon",
    "KafkaAdmissionCertificateExpiresVerySoon",
    "KafkaAdmissionAuditEventsDropped",
    "KafkaAdmissionFileDescriptorsNearLimit",
    "KafkaAdmissionProxyDown",
    "KafkaAdmissionProxyAbsent",
}
# The labels every aggregation keeps: the Kubernetes target's, and any scrape's.
TARGET_LABELS = {"namespace", "pod", "instance", "job"}
AGGREGATION = re.compile(r"\b(sum|min|max|avg|count|topk|bottomk|quantile|stddev|stdvar|group)\b\s*(by|without)?\s*\(")
METRIC = re.compile(r"\b((?:kafka_admission|process)_[a-z0-9_]+)\b")


def rules() -> dict[str, dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"]}


def rule_expressions() -> dict[str, str]:
    return {name: rule["expr"] for name, rule in rules().items()}


def dashboard_expressions() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


def exposition_names(text: str) -> set[str]:
    """Names of the samples in an exposition (a family with no sample yet does not count)."""
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


def test_promtool_checks_the_rules() -> None:
    result = subprocess.run(
        [system_tool("promtool", "prometheus"), "check", "rules", str(RULES)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def test_each_alert_fires_on_its_series_and_not_on_a_quiet_proxy() -> None:
    result = subprocess.run(
        [system_tool("promtool", "prometheus"), "test", "rules", str(RULES_TEST)],
        capture_output=True,
        text=True,
        cwd=RULES.parent,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    # Each alert has a case where it fires and one where it must stay quiet.
    cases = [case for test in yaml.safe_load(RULES_TEST.read_text())["tests"] for case in test["alert_rule_test"]]
    fires = {case["alertname"] for case in cases if case["exp_alerts"]}
    quiet = {case["alertname"] for case in cases if not case["exp_alerts"]}
    assert fires == quiet == set(rules()) == ALERTS


def test_every_alert_waits_and_links_its_runbook_in_the_docs() -> None:
    """Each runbook_url is docs/alerts.md#<the alert's anchor>, and that heading exists."""
    anchors = github_anchors((ROOT / RUNBOOKS).read_text())
    for name, rule in rules().items():
        assert re.fullmatch(r"[1-9][0-9]*m", rule.get("for", "")), name
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        document, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert (document, anchor) == (RUNBOOKS, name.lower()), name
        assert anchor in anchors, f"{RUNBOOKS} has no heading for {name}"


def test_every_aggregation_keeps_the_namespace_pod_instance_and_job() -> None:
    """An alert grouped without them cannot say which proxy it is about (the mixins' rule)."""
    for name, expr in rule_expressions().items():
        for match in AGGREGATION.finditer(expr):
            assert match.group(2) == "by", f"{name}: {match.group(0)} does not name what it keeps"
            kept = expr[match.end() : expr.index(")", match.end())]
            assert TARGET_LABELS <= {label.strip() for label in kept.split(",")}, f"{name}: by ({kept})"
        for join in re.finditer(r"\bon \(([^)]*)\)", expr):
            assert TARGET_LABELS <= {label.strip() for label in join.group(1).split(",")}, f"{name}: {join.group(0)}"


def test_every_dashboard_panel_queries_prometheus_through_the_chosen_datasource() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "job", "instance"}
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert 'job=~"$job"' in target["expr"] and 'instance=~"$instance"' in target["expr"], target["expr"]


def test_every_metric_the_rules_and_dashboard_read_is_in_a_live_exposition(busy_proxy: ProxyProcess) -> None:
    _, text = busy_proxy.get("/metrics")
    live = exposition_names(text)
    used: dict[str, set[str]] = {}
    for where, expressions in (("rules", rule_expressions().values()), ("dashboard", dashboard_expressions())):
        for expr in expressions:
            for name in METRIC.findall(expr):
                used.setdefault(name, set()).add(where)
    missing = {name: sorted(where) for name, where in used.items() if name not in live}
    assert missing == {}
    # Every alert reads a metric the proxy exports (or the scrape's `up`), and the dashboard shows
    # each family the rules use.
    assert all(METRIC.search(expr) or re.search(r"\bup\{", expr) for expr in rule_expressions().values())
    rule_metrics = {n for e in rule_expressions().values() for n in METRIC.findall(e)}
    assert rule_metrics <= {n for e in dashboard_expressions() for n in METRIC.findall(e)}


def test_the_busy_proxy_counted_each_event_the_alerts_watch(busy_proxy: ProxyProcess) -> None:
    metric = busy_proxy.metric
    decided = "kafka_admission_decisions_total"
    assert metric(decided, policy="connections", action="evict", limit="max.ssl.connections") >= 1
    assert metric(decided, policy="group_size", limit="group.max.size", mode="enforce") >= 1
    assert metric(decided, policy="identifier_limits", mode="enforce") >= 1
    assert metric("kafka_admission_upstream_connect_failures_total") >= 1
    assert metric("kafka_admission_config_reloads_total", outcome="invalid") == 1
    assert metric("kafka_admission_config_reloads_total", outcome="success") == 1
    assert abs(metric("kafka_admission_config_last_reload_success_timestamp_seconds") - time.time()) < 600
    assert metric("kafka_admission_config_last_reload_successful") == 1  # the good reload came last
    # trustme certificates are valid for decades: the expiry is far in the future.
    assert metric("kafka_admission_tls_certificate_expiry_timestamp_seconds", listener="secure") > time.time() + 86400
    assert metric("kafka_admission_memory_pool_capacity_bytes") == 209715200
    assert metric("process_resident_memory_bytes") > 10e6
    assert metric("process_open_fds") > 5


def test_build_info_names_the_running_versions(busy_proxy: ProxyProcess) -> None:
    import platform

    import trio

    from proxy.version import package_version

    _, text = busy_proxy.get("/metrics")
    [info] = [
        s for f in text_string_to_metric_families(text) for s in f.samples if s.name == "kafka_admission_build_info"
    ]
    labels: dict[str, Any] = info.labels
    assert labels == {"version": package_version(), "python": platform.python_version(), "trio": trio.__version__}
    assert info.value == 1


def test_promtool_accepts_the_live_exposition(busy_proxy: ProxyProcess, tmp_path: Path) -> None:
    _, text = busy_proxy.get("/metrics")
    result = subprocess.run(
        [system_tool("promtool", "prometheus"), "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
