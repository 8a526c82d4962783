"""The Helm chart, with a real helm binary: lint (strict) and template in both
modes, the rendered manifests validated against Kubernetes' schemas
(kubernetes-validate) and scanned by checkov, the fields that matter asserted,
and the config it renders run by the proxy with the rendered container's exact
command line, carrying a produce and a consume against Tansu."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from demo.tansu import TansuBroker, free_port
from proxy.config.model import parse_config_text
from tests.conftest import ROOT, free_node_port_base
from tests.deploy.conftest import deploy_tool, produce_and_consume, system_tool
from tests.deploy.crd_schema import crd_validator

CHART = ROOT / "helm" / "kafka-admission-proxy"
SIDECAR_VALUES = CHART / "examples" / "sidecar-values.yaml"
SIDECAR_EXAMPLE = CHART / "examples" / "sidecar-broker-statefulset.yaml"
DIGEST = "sha256:" + "0123456789abcdef" * 4
RULES = ROOT / "deploy" / "prometheus" / "kafka-admission-proxy.rules.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "kafka-admission-proxy.json"
CRDS = Path(__file__).parent / "crds" / "prometheus-operator"  # tests/deploy/crds/prometheus-operator/SOURCE.md
# Monitoring and the extension points, in both modes.
MONITORING = [
    "--set",
    "podMonitor.enabled=true",
    "--set",
    "prometheusRule.enabled=true",
    "--set",
    "grafanaDashboard.enabled=true",
]
EXTENSIONS = [
    "--set-json",
    'extraEnv=[{"name": "TZ", "value": "UTC"}]',
    "--set-json",
    'extraVolumes=[{"name": "broker-certs", "secret": {"secretName": "kafka-broker-certs"}}]',
    "--set-json",
    'extraVolumeMounts=[{"name": "broker-certs", "mountPath": "/etc/broker-certs", "readOnly": true}]',
    "--set-json",
    'podLabels={"team": "streaming"}',
    "--set",
    "priorityClassName=kafka-critical",
    "--set-json",
    'topologySpreadConstraints=[{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", '
    '"whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": '
    '{"app.kubernetes.io/name": "kafka-admission-proxy"}}}]',
]
# standalone: the upstream brokers (another release's pods) admit the proxy only.
BROKER_POLICY = [
    "--set",
    "brokerNetworkPolicy.enabled=true",
    "--set",
    "brokerNetworkPolicy.namespace=kafka-brokers",
    "--set-json",
    'brokerNetworkPolicy.podSelector={"app.kubernetes.io/name": "kafka", "app.kubernetes.io/component": "broker"}',
    "--set-json",
    "brokerNetworkPolicy.proxiedPorts=[9092]",
    "--set-json",
    "brokerNetworkPolicy.peerPorts=[9093, 9094]",
    "--set-json",
    'brokerNetworkPolicy.extraIngress=[{"ports": [{"port": 9404}], "from": [{"namespaceSelector": '
    '{"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]}]',
]
# Every optional part on, so that lint, validation and checkov see all of it.
ALL_OPTIONS = [
    "--set",
    "serviceMonitor.enabled=true",
    "--set",
    "networkPolicy.enabled=true",
    "--set",
    "autoscaling.enabled=true",
    "--set",
    "auditVolume.enabled=true",
    "--set",
    "config.audit.topic=kafka-admission-audit",
    "--set-json",
    'tlsSecrets=[{"name": "server", "secretName": "proxy-tls"}]',
    "--set-json",
    'networkPolicy.clientsFrom=[{"namespaceSelector": {"matchLabels": {"kafka-client": "true"}}}]',
    "--set",
    "service.type=LoadBalancer",
    "--set",
    "service.externalTrafficPolicy=Local",
    # Two workers: the metrics directory's env and memory volume are linted and validated too.
    "--set",
    "resources.limits.cpu=2",
    *MONITORING,
    *EXTENSIONS,
    *BROKER_POLICY,
]
MODES = {
    "standalone": ALL_OPTIONS,
    "sidecar": ["-f", str(SIDECAR_VALUES), *MONITORING, *EXTENSIONS],
    "native-sidecar": ["-f", str(SIDECAR_VALUES), "--set", "nativeSidecar=true", *MONITORING, *EXTENSIONS],
}
WORKLOADS = {"standalone": "Deployment", "sidecar": "StatefulSet", "native-sidecar": "StatefulSet"}
# Each mode with nothing else set.
MODE_BASE: dict[str, list[str]] = {
    "standalone": [],
    "sidecar": ["-f", str(SIDECAR_VALUES)],
    "native-sidecar": ["-f", str(SIDECAR_VALUES), "--set", "nativeSidecar=true"],
}


class Helm:
    def __init__(self, binary: str, home: Path) -> None:
        self.binary = binary
        self.env = {f"HELM_{kind}_HOME": str(home / kind.lower()) for kind in ("CACHE", "CONFIG", "DATA")}

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.binary, *args], capture_output=True, text=True, env={**os.environ, **self.env})

    def template(self, *args: str) -> str:
        result = self.run("template", "kafka", str(CHART), "--namespace", "kafka", *args)
        assert result.returncode == 0, result.stderr
        return result.stdout


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(deploy_tool("helm"), tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="session")
def rendered(helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each mode rendered once (image by digest, as production should pull it)."""
    folder = tmp_path_factory.mktemp("rendered")
    files = {}
    for mode, args in MODES.items():
        files[mode] = folder / f"{mode}.yaml"
        files[mode].write_text(helm.template("--set", f"image.digest={DIGEST}", *args))
    return files


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def kind(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    [found] = [d for d in docs if d["kind"] == name]
    return found


def proxy_container(workload: dict[str, Any]) -> dict[str, Any]:
    """The proxy's container, a native sidecar (an init container) or not."""
    pod = workload["spec"]["template"]["spec"]
    containers = pod["containers"] + pod.get("initContainers", [])
    [container] = [c for c in containers if c["name"] == "kafka-admission-proxy"]
    return container


def config_map(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The ConfigMap of the proxy's config file (not the dashboard's)."""
    [found] = [d for d in docs if d["kind"] == "ConfigMap" and "config.yaml" in d["data"]]
    return found


def rendered_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return yaml.safe_load(config_map(docs)["data"]["config.yaml"])  # type: ignore[no-any-return]


# --- helm itself ------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_the_audit_topic_sink_is_configured_in_both_modes(rendered: dict[str, Path], mode: str) -> None:
    """standalone: the topic on the upstream's brokers (the default); sidecar (native or not): on
    the brokers' REPLICATION listener, which the proxy does not front. The proxy takes the rendered
    config."""
    config = rendered_config(documents(rendered[mode].read_text()))
    audit = config["audit"]
    assert audit["topic"] == "kafka-admission-audit"
    if mode != "standalone":
        assert audit["bootstrap_servers"] == ["kafka-broker-headless.kafka.svc.cluster.local:9094"]
    else:
        assert "bootstrap_servers" not in audit
    config["listeners"] = [{k: v for k, v in lst.items() if k != "tls"} for lst in config["listeners"]]
    parsed = parse_config_text(yaml.safe_dump(config))
    assert parsed.audit.topic == "kafka-admission-audit"


@pytest.mark.parametrize("mode", MODES)
def test_helm_lint_strict_passes(helm: Helm, mode: str) -> None:
    result = helm.run("lint", "--strict", str(CHART), *MODES[mode])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("--set", "replicaCont=3", "'replicaCont' not allowed"),
        ("--set-json", 'config.policies={"group.max.sise": 3}', "'group.max.sise' not allowed"),
        (
            "--set-json",
            'config.listeners=[{"name": "x", "bind": "0.0.0.0:1", "advertized_host": "h"}]',
            "/config/listeners/0",
        ),
        ("--set", "mode=daemon", "/mode"),
        ("--set", "configReload=inotify", "/configReload"),
    ],
)
def test_a_misspelt_or_invalid_value_fails_helm_lint(helm: Helm, flag: str, value: str, named: str) -> None:
    result = helm.run("lint", "--strict", str(CHART), flag, value)
    assert result.returncode != 0
    assert named in result.stdout + result.stderr


def test_values_schema_config_part_is_generated_from_the_config_model() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "chart_values_schema.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_the_committed_sidecar_example_is_what_the_chart_renders(helm: Helm) -> None:
    assert SIDECAR_EXAMPLE.read_text() == helm.template("-f", str(SIDECAR_VALUES)), (
        f"re-render: helm template kafka {CHART.relative_to(ROOT)} -n kafka -f {SIDECAR_VALUES.relative_to(ROOT)}"
    )


# --- validators -------------------------------------------------------------------


def test_rendered_manifests_validate_against_kubernetes_schemas(rendered: dict[str, Path]) -> None:
    result = subprocess.run(
        [deploy_tool("kubernetes-validate"), "--strict", "--quiet", *map(str, rendered.values())],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # A CRD has no schema there; everything else is validated.
    warnings = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert all(re.search(r"kind (ServiceMonitor|PodMonitor|PrometheusRule)\b", line) for line in warnings), warnings


def test_checkov_passes_and_every_skip_is_named_and_justified(rendered: dict[str, Path], tmp_path: Path) -> None:
    config_file = CHART / ".checkov.yaml"
    result = subprocess.run(
        [
            deploy_tool("checkov"),
            "--config-file",
            str(config_file),
            "--output",
            "json",
            *[arg for path in rendered.values() for arg in ("-f", str(path))],
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    assert sum(r["summary"]["passed"] for r in reports) > 100
    assert all(r["summary"]["failed"] == 0 for r in reports)
    # Skips in the config file carry a comment above them; skips on resources carry a reason.
    lines = config_file.read_text().splitlines()
    for index, line in enumerate(lines):
        if re.match(r"\s*- CKV_", line):
            assert lines[index - 1].strip().startswith("#"), f"{line.strip()} has no justification"
    for path in rendered.values():
        for doc in documents(path.read_text()):
            for key, value in (doc["metadata"].get("annotations") or {}).items():
                if key.startswith("checkov.io/skip"):
                    check, _, reason = value.partition("=")
                    assert re.fullmatch(r"CKV_K8S_\d+", check) and len(reason) > 20, value


# --- the fields that matter ---------------------------------------------------------


def test_standalone_service_and_container_expose_bootstrap_broker_and_admin_ports(rendered: dict[str, Path]) -> None:
    docs = documents(rendered["standalone"].read_text())
    container = proxy_container(kind(docs, "Deployment"))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"kafka-0": 29092, "l0-b0": 29100, "l0-b1": 29101, "l0-b2": 29102, "admin": 9464}
    service = kind(docs, "Service")
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        name: (port, name) for name, port in ports.items()
    }
    assert service["spec"]["selector"] == kind(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    config = rendered_config(docs)
    assert config["mode"] == "cluster"
    assert config["listeners"][0]["advertised_host"] == "kafka-kafka-admission-proxy.kafka.svc"  # the Service
    assert kind(docs, "ServiceMonitor")["spec"]["endpoints"][0]["port"] == "admin"
    assert kind(docs, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    assert kind(docs, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]["name"] == service["metadata"]["name"]
    [own] = [d for d in docs if d["kind"] == "NetworkPolicy" and not d["metadata"]["name"].endswith("-brokers")]
    policy_ports = {p["port"] for rule in own["spec"]["ingress"] for p in rule["ports"]}
    assert policy_ports == {29092, 29100, 29101, 29102, "admin"}


def test_an_hpa_is_off_by_default_and_then_replicas_are_fixed(helm: Helm) -> None:
    docs = documents(helm.template())
    assert [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"] == []
    assert kind(docs, "Deployment")["spec"]["replicas"] == 2


@pytest.mark.parametrize(("mode", "workload"), WORKLOADS.items())
def test_the_proxy_runs_hardened_with_probes_and_a_grace_period_that_covers_the_drain(
    rendered: dict[str, Path], mode: str, workload: str
) -> None:
    pod = kind(documents(rendered[mode].read_text()), workload)["spec"]["template"]["spec"]
    container = proxy_container(kind(documents(rendered[mode].read_text()), workload))
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] >= 10000
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    assert set(container["resources"]) == {"requests", "limits"}
    assert container["image"] == f"kafka-admission-proxy@{DIGEST}"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    args = container["args"]
    drain = float(args[args.index("--drain-timeout") + 1])
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert drain == 30 and pre_stop == 5
    # In a broker pod, the broker's controlled shutdown (brokerShutdownSeconds) comes first.
    broker_shutdown = 60 if mode != "standalone" else 0
    assert pod["terminationGracePeriodSeconds"] == broker_shutdown + pre_stop + drain + 5


@pytest.mark.parametrize(("mode", "workload"), WORKLOADS.items())
def test_config_and_certificates_are_mounted_as_directories_so_updates_reach_the_proxy(
    rendered: dict[str, Path], mode: str, workload: str
) -> None:
    docs = documents(rendered[mode].read_text())
    pod = kind(docs, workload)["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in proxy_container(kind(docs, workload))["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert all("subPath" not in m for m in mounts.values())  # a subPath mount never sees an update
    config_mount = mounts["kafka-admission-proxy-config"]
    assert config_mount == {
        "name": "kafka-admission-proxy-config",
        "mountPath": "/etc/kafka-admission-proxy",
        "readOnly": True,
    }
    assert volumes["kafka-admission-proxy-config"]["configMap"]["name"] == config_map(docs)["metadata"]["name"]
    args = proxy_container(kind(docs, workload))["args"]
    assert args[args.index("--config") + 1] == "/etc/kafka-admission-proxy/config.yaml"
    if mode == "standalone":  # ALL_OPTIONS mounts one TLS Secret and the audit volume
        assert mounts["kafka-admission-proxy-tls-server"]["mountPath"] == "/etc/kafka-admission-proxy-tls/server"
        assert mounts["kafka-admission-proxy-tls-server"]["readOnly"] is True
        assert volumes["kafka-admission-proxy-tls-server"]["secret"]["secretName"] == "proxy-tls"
        assert "emptyDir" in volumes["kafka-admission-proxy-audit"]


def test_the_sidecar_sits_in_the_broker_pod_and_takes_the_client_port(rendered: dict[str, Path]) -> None:
    docs = documents(rendered["sidecar"].read_text())
    statefulset = kind(docs, "StatefulSet")
    containers = {c["name"]: c for c in statefulset["spec"]["template"]["spec"]["containers"]}
    assert set(containers) == {"kafka", "kafka-admission-proxy"}
    env = {e["name"]: e.get("value") for e in containers["kafka"]["env"]}
    config = rendered_config(docs)
    values = yaml.safe_load(SIDECAR_VALUES.read_text())
    assert config["mode"] == "sidecar"
    # The broker's client listener is on localhost, and it is the proxy's upstream ...
    client_listener = re.search(r"CLIENT://([^,]+)", env["KAFKA_LISTENERS"])
    assert client_listener and client_listener.group(1) == "127.0.0.1:19092"
    assert config["upstream"]["bootstrap_servers"] == ["127.0.0.1:19092"]
    # ... and the broker advertises the proxy's port.
    advertised = re.search(r"CLIENT://[^,]+:(\d+)", env["KAFKA_ADVERTISED_LISTENERS"])
    proxy_port = int(config["listeners"][0]["bind"].rsplit(":", 1)[1])
    assert advertised and int(advertised.group(1)) == proxy_port == values.get("exampleBroker", {}).get(
        "clientPort", 9092
    )
    assert {p["containerPort"] for p in containers["kafka-admission-proxy"]["ports"]} == {proxy_port, 9464}
    assert not {p["containerPort"] for p in containers["kafka"]["ports"]} & {proxy_port, 19092}
    headless = kind(docs, "Service")
    assert headless["spec"]["clusterIP"] == "None"
    assert {p["port"]: p["targetPort"] for p in headless["spec"]["ports"] if p["name"] == "client"} == {
        proxy_port: "kafka-0"
    }
    assert config["policies"] == values["config"]["policies"]


# --- no way around the proxy ----------------------------------------------------------


def policy_rules(policy: dict[str, Any]) -> dict[Any, list[dict[str, Any]] | None]:
    """Each port a NetworkPolicy opens, with the peers it admits to it (None: any peer)."""
    rules: dict[Any, list[dict[str, Any]] | None] = {}
    for rule in policy["spec"]["ingress"]:
        for port in rule["ports"]:
            assert port["protocol"] == "TCP" and port["port"] not in rules
            rules[port["port"]] = rule.get("from")
    return rules


def test_the_sidecar_brokers_admit_clients_only_at_the_proxy_and_each_other_at_replication_and_controller(
    rendered: dict[str, Path],
) -> None:
    """Sidecar example (brokerNetworkPolicy on). Rules checked:
    1. the policy selects exactly the broker pods (its selector matches their labels, not more pods
       of the release: the selector carries the broker component label);
    2. the proxy's client port is open to clients (networkPolicy.clientsFrom, empty: any), and the
       proxy's admin port to Prometheus;
    3. the broker's client listener is bound to 127.0.0.1 and no rule opens its port;
    4. the replication and controller ports, which are every port the broker container declares and
       the ports of its KAFKA_LISTENERS other than CLIENT, admit only pods the same selector picks;
    5. no other port is opened (a NetworkPolicy closes every port it does not name)."""
    docs = documents(rendered["sidecar"].read_text())
    [policy] = [d for d in docs if d["kind"] == "NetworkPolicy"]
    statefulset = kind(docs, "StatefulSet")
    labels = statefulset["spec"]["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= labels.items() and selector["app.kubernetes.io/component"] == "broker"
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    rules = policy_rules(policy)
    brokers = [{"podSelector": {"matchLabels": selector}}]
    assert rules == {9092: None, "admin": None, 9094: brokers, 9093: brokers}
    [broker] = [c for c in statefulset["spec"]["template"]["spec"]["containers"] if c["name"] == "kafka"]
    env = {e["name"]: e.get("value") for e in broker["env"]}
    listeners = dict(re.findall(r"(\w+)://([^,]*)", env["KAFKA_LISTENERS"]))
    assert listeners["CLIENT"] == "127.0.0.1:19092" and 19092 not in rules
    assert {int(address.rsplit(":", 1)[1]) for name, address in listeners.items() if name != "CLIENT"} == {9093, 9094}
    assert {p["containerPort"] for p in broker["ports"]} == {9093, 9094}
    # The headless Service offers clients the proxy's port only.
    assert [p["port"] for p in kind(docs, "Service")["spec"]["ports"]] == [9092]
    assert "INTERNAL" not in env["KAFKA_LISTENERS"] + env["KAFKA_ADVERTISED_LISTENERS"]


def test_the_sidecar_brokers_take_clients_and_prometheus_from_the_configured_peers(helm: Helm) -> None:
    """networkPolicy.clientsFrom and metricsFrom narrow the proxy's ports in the broker pods'
    policy; the broker-only ports keep admitting the broker pods alone."""
    clients = [{"namespaceSelector": {"matchLabels": {"kafka-client": "true"}}}]
    prometheus = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    docs = documents(
        helm.template(
            "-f",
            str(SIDECAR_VALUES),
            "--set-json",
            f"networkPolicy.clientsFrom={json.dumps(clients)}",
            "--set-json",
            f"networkPolicy.metricsFrom={json.dumps(prometheus)}",
        )
    )
    [policy] = [d for d in docs if d["kind"] == "NetworkPolicy"]
    rules = policy_rules(policy)
    assert (rules[9092], rules["admin"]) == (clients, prometheus)
    assert rules[9093] == rules[9094] == [{"podSelector": policy["spec"]["podSelector"]}]


def test_the_standalone_brokers_admit_only_the_proxy_pods_at_the_proxied_listener(rendered: dict[str, Path]) -> None:
    """Standalone, brokers in another namespace (BROKER_POLICY). Rules checked:
    1. the policy lives in the brokers' namespace and selects the broker pods by the configured labels;
    2. the proxied listener (9092) admits only this release's proxy pods: their selector labels,
       from the release's namespace (a podSelector alone would mean the brokers' namespace);
    3. replication and controller ports admit only the broker pods;
    4. extraIngress is kept as given; no other port is opened."""
    docs = documents(rendered["standalone"].read_text())
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-brokers"))
    assert policy["metadata"]["namespace"] == "kafka-brokers"
    selector = {"app.kubernetes.io/name": "kafka", "app.kubernetes.io/component": "broker"}
    assert policy["spec"]["podSelector"] == {"matchLabels": selector}
    proxy_labels = kind(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    *own_rules, extra = policy["spec"]["ingress"]
    [proxied] = policy_rules({"spec": {"ingress": own_rules}})[9092] or []
    assert proxied["podSelector"]["matchLabels"].items() <= proxy_labels.items()
    assert proxied["podSelector"]["matchLabels"] == kind(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert proxied["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "kafka"}}
    brokers = [{"podSelector": {"matchLabels": selector}}]
    monitoring = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    assert policy_rules({"spec": {"ingress": own_rules}}) == {9092: [proxied], 9093: brokers, 9094: brokers}
    assert extra == {"ports": [{"port": 9404}], "from": monitoring}


def test_the_broker_policy_is_off_by_default_and_refuses_to_select_every_pod(helm: Helm) -> None:
    """Off by default: it selects pods the chart does not own. On, it needs the brokers' labels
    (an empty podSelector would close every pod of the namespace) and, standalone, the proxied port."""
    for args in ((), ("-f", str(SIDECAR_VALUES), "--set", "brokerNetworkPolicy.enabled=false")):
        assert not [
            d
            for d in documents(helm.template(*args))
            if d["metadata"]["name"].endswith("-brokers") and d["kind"] == "NetworkPolicy"
        ]
    assert yaml.safe_load((CHART / "values.yaml").read_text())["brokerNetworkPolicy"]["enabled"] is False
    result = helm.run("template", "kafka", str(CHART), "--set", "brokerNetworkPolicy.enabled=true")
    assert result.returncode != 0 and "brokerNetworkPolicy.podSelector: the broker pods' labels are required" in (
        result.stderr
    )
    result = helm.run(
        "template",
        "kafka",
        str(CHART),
        "--set",
        "brokerNetworkPolicy.enabled=true",
        "--set",
        "brokerNetworkPolicy.podSelector.app=kafka",
    )
    assert result.returncode != 0 and "brokerNetworkPolicy.proxiedPorts: standalone mode needs" in result.stderr


# --- native sidecar -------------------------------------------------------------------


def test_a_native_sidecar_proxy_starts_before_the_broker_and_stops_after_it(rendered: dict[str, Path]) -> None:
    """nativeSidecar: the proxy is an init container with restartPolicy Always (Kubernetes 1.29+):
    the kubelet starts the broker once the proxy's startupProbe passes, and stops the proxy after
    the broker has exited; so the grace period is the broker's shutdown plus the proxy's drain.
    The startup probe is /healthz, which needs no broker: /readyz would wait for the broker,
    which waits for the probe."""
    pod = kind(documents(rendered["native-sidecar"].read_text()), "StatefulSet")["spec"]["template"]["spec"]
    [proxy] = pod["initContainers"]
    assert proxy["name"] == "kafka-admission-proxy" and proxy["restartPolicy"] == "Always"
    assert proxy["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert [c["name"] for c in pod["containers"]] == ["kafka"]
    assert pod["terminationGracePeriodSeconds"] == 60 + 5 + 30 + 5
    ordinary = kind(documents(rendered["sidecar"].read_text()), "StatefulSet")["spec"]["template"]["spec"]
    assert "initContainers" not in ordinary
    assert "restartPolicy" not in proxy_container({"spec": {"template": {"spec": ordinary}}})
    assert {k: v for k, v in proxy.items() if k != "restartPolicy"} == proxy_container(
        {"spec": {"template": {"spec": ordinary}}}
    )


def test_native_sidecar_does_not_change_a_standalone_deployment(helm: Helm) -> None:
    deployment = kind(documents(helm.template("--set", "nativeSidecar=true")), "Deployment")
    assert "initContainers" not in deployment["spec"]["template"]["spec"]
    assert "restartPolicy" not in proxy_container(deployment)


def test_live_reload_is_the_default_and_the_checksum_option_rolls_the_pods_on_a_config_change(
    helm: Helm, rendered: dict[str, Path]
) -> None:
    def annotations(*args: str) -> dict[str, str]:
        pod = kind(documents(helm.template(*args)), "Deployment")["spec"]["template"]
        return pod["metadata"].get("annotations") or {}

    # watch: the proxy re-reads what kubelet swaps in; no checksum, so an edit rolls no pod.
    assert yaml.safe_load((CHART / "values.yaml").read_text())["configReload"] == "watch"
    assert annotations() == {}
    assert annotations("--set", "config.policies.group\\.max\\.size=5") == {}
    sidecar = kind(documents(rendered["sidecar"].read_text()), "StatefulSet")["spec"]["template"]["metadata"]
    assert not any(key.startswith("checksum/") for key in sidecar.get("annotations") or {})
    # checksum: the config's hash in the pod template, so a config change rolls the pods.
    first = annotations("--set", "configReload=checksum")["checksum/kafka-admission-proxy-config"]
    second = annotations("--set", "configReload=checksum", "--set", "config.policies.group\\.max\\.size=5")
    assert re.fullmatch(r"[0-9a-f]{64}", first)
    assert second["checksum/kafka-admission-proxy-config"] != first


def test_the_chart_readme_documents_every_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()

    def keys(data: Any, prefix: str = "") -> Iterator[str]:
        for key, value in data.items():
            path = f"{prefix}{key}"
            if isinstance(value, dict) and value and key not in ("config", "resources") and "Context" not in key:
                yield from keys(value, path + ".")
            else:
                yield path

    missing = [key for key in keys(values) if f"`{key}`" not in readme]
    assert missing == []


# --- Prometheus Operator and Grafana ------------------------------------------------


def test_monitoring_is_off_by_default(helm: Helm) -> None:
    for args in ((), ("-f", str(SIDECAR_VALUES))):
        kinds = {d["kind"] for d in documents(helm.template(*args))}
        assert not kinds & {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
        assert [d for d in documents(helm.template(*args)) if d["metadata"]["name"].endswith("-dashboard")] == []


def test_the_podmonitor_scrapes_the_admin_port_of_the_sidecar_in_every_broker_pod(rendered: dict[str, Path]) -> None:
    """PodMonitor is a CRD kubernetes-validate has no schema for: its shape is checked here,
    as the Prometheus Operator reads it (monitoring.coreos.com/v1 PodMonitorSpec)."""
    docs = documents(rendered["sidecar"].read_text())
    monitor = kind(docs, "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor["spec"]) == {"selector", "podMetricsEndpoints"}
    pod = kind(docs, "StatefulSet")["spec"]["template"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()  # it selects the broker pods
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert set(endpoint) == {"port", "path", "interval", "relabelings"}
    assert (endpoint["port"], endpoint["path"], endpoint["interval"]) == ("admin", "/metrics", "30s")
    # The job the alert rules select `up` and process_* by.
    job = {"action": "replace", "targetLabel": "job", "replacement": "kafka-admission-proxy"}
    assert endpoint["relabelings"] == [job]
    assert re.search(r'job=~"\.\*kafka-admission-proxy\.\*"', RULES.read_text())
    # The admin port is a named port of the proxy container, bound on the pod's address.
    admin = [p for p in proxy_container(kind(docs, "StatefulSet"))["ports"] if p["name"] == "admin"]
    assert admin == [{"name": "admin", "containerPort": 9464, "protocol": "TCP"}]
    assert rendered_config(docs)["admin"]["bind"] == "0.0.0.0:9464"
    service_monitor = kind(documents(rendered["standalone"].read_text()), "ServiceMonitor")
    assert service_monitor["spec"]["endpoints"][0]["relabelings"] == endpoint["relabelings"]


@pytest.mark.parametrize("monitor", ["podMonitor", "serviceMonitor"])
def test_a_monitor_of_a_loopback_admin_port_fails_to_render_with_the_reason(helm: Helm, monitor: str) -> None:
    result = helm.run(
        "template", "kafka", str(CHART), "--set", f"{monitor}.enabled=true", "--set", "config.admin.bind=127.0.0.1:9464"
    )
    assert result.returncode != 0
    assert f"{monitor}.enabled: config.admin.bind is 127.0.0.1:9464, which Prometheus cannot reach" in result.stderr


@pytest.mark.parametrize(
    ("mode", "kinds"),
    [
        ("standalone", {"ServiceMonitor", "PodMonitor", "PrometheusRule"}),
        ("sidecar", {"PodMonitor", "PrometheusRule"}),
        ("native-sidecar", {"PodMonitor", "PrometheusRule"}),
    ],
)
def test_the_prometheus_operator_resources_validate_against_its_crds(
    rendered: dict[str, Path], mode: str, kinds: set[str]
) -> None:
    resources = [d for d in documents(rendered[mode].read_text()) if d["apiVersion"] == "monitoring.coreos.com/v1"]
    assert {d["kind"] for d in resources} == kinds
    for resource in resources:
        validator = crd_validator(CRDS, resource["apiVersion"], resource["kind"])
        assert [error.message for error in validator.iter_errors(resource)] == [], resource["kind"]
        # The validation can fail: a field the CRD does not have is refused.
        misspelt = {**resource, "spec": {**resource["spec"], "scrapeIntervall": "30s"}}
        assert any("scrapeIntervall" in error.message for error in validator.iter_errors(misspelt))


def test_promtool_checks_the_rules_as_the_chart_renders_them(rendered: dict[str, Path], tmp_path: Path) -> None:
    rule = kind(documents(rendered["sidecar"].read_text()), "PrometheusRule")
    rules_file = tmp_path / "rendered.rules.yaml"
    rules_file.write_text(yaml.safe_dump(rule["spec"]))
    result = subprocess.run(
        [system_tool("promtool", "prometheus"), "check", "rules", str(rules_file)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rule['spec']['groups'][0]['rules'])} rules found" in result.stdout


@pytest.mark.parametrize("mode", MODES)
def test_the_prometheusrule_is_the_deploy_rules_file(rendered: dict[str, Path], mode: str) -> None:
    """One source: the chart reads deploy/prometheus/'s file through a symlink in files/."""
    link = CHART / "files" / RULES.name
    assert link.is_symlink() and link.resolve() == RULES.resolve()
    rule = kind(documents(rendered[mode].read_text()), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == "kafka"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    assert len(rule["spec"]["groups"][0]["rules"]) >= 13


def test_a_packaged_chart_carries_the_rules_and_the_dashboard_themselves(helm: Helm, tmp_path: Path) -> None:
    """`helm package` follows the symlinks in files/: the .tgz holds the files' content."""
    result = helm.run("package", str(CHART), "--destination", str(tmp_path))
    assert result.returncode == 0, result.stderr
    [package] = tmp_path.glob("kafka-admission-proxy-*.tgz")
    with tarfile.open(package) as archive:
        for source in (RULES, DASHBOARD):
            member = archive.getmember(f"kafka-admission-proxy/files/{source.name}")
            assert member.isfile()
            packed = archive.extractfile(member)
            assert packed is not None and packed.read() == source.read_bytes()


def test_the_prometheusrule_takes_the_labels_a_rule_selector_asks_for(helm: Helm) -> None:
    rule = kind(
        documents(
            helm.template(
                "--set", "prometheusRule.enabled=true", "--set", "prometheusRule.labels.release=kube-prometheus-stack"
            )
        ),
        "PrometheusRule",
    )
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"


@pytest.mark.parametrize("mode", MODES)
def test_the_dashboard_configmap_holds_the_deploy_dashboard_for_the_grafana_sidecar(
    rendered: dict[str, Path], mode: str
) -> None:
    link = CHART / "files" / DASHBOARD.name
    assert link.is_symlink() and link.resolve() == DASHBOARD.resolve()
    [configmap] = [
        d
        for d in documents(rendered[mode].read_text())
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")
    ]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert list(configmap["data"]) == [DASHBOARD.name]
    assert json.loads(configmap["data"][DASHBOARD.name]) == json.loads(DASHBOARD.read_text())


# --- extension points -------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_the_extension_points_reach_the_pod_in_both_modes(rendered: dict[str, Path], mode: str) -> None:
    workload = kind(documents(rendered[mode].read_text()), WORKLOADS[mode])
    pod = workload["spec"]["template"]
    container = proxy_container(workload)
    assert {"name": "TZ", "value": "UTC"} in container["env"]
    assert {"name": "broker-certs", "mountPath": "/etc/broker-certs", "readOnly": True} in container["volumeMounts"]
    assert {"name": "broker-certs", "secret": {"secretName": "kafka-broker-certs"}} in pod["spec"]["volumes"]
    labels = pod["metadata"]["labels"]
    assert labels["team"] == "streaming"
    assert {
        "app.kubernetes.io/name",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/version",
        "app.kubernetes.io/managed-by",
    } <= set(labels)
    assert workload["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pod["spec"]["priorityClassName"] == "kafka-critical"
    assert pod["spec"]["topologySpreadConstraints"][0]["topologyKey"] == "topology.kubernetes.io/zone"


@pytest.mark.parametrize("mode", MODES)
def test_a_startup_probe_holds_liveness_until_the_proxy_first_answers(rendered: dict[str, Path], mode: str) -> None:
    container = proxy_container(kind(documents(rendered[mode].read_text()), WORKLOADS[mode]))
    startup = container["startupProbe"]
    assert startup["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert startup["periodSeconds"] * startup["failureThreshold"] == 60


def test_pod_labels_cannot_take_over_the_selector_labels(helm: Helm) -> None:
    deployment = kind(
        documents(helm.template("--set-json", 'podLabels={"app.kubernetes.io/name": "other"}')), "Deployment"
    )
    assert deployment["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == "kafka-admission-proxy"


def test_external_traffic_policy_local_keeps_client_ips_and_needs_an_external_service(
    helm: Helm, rendered: dict[str, Path]
) -> None:
    service = kind(documents(rendered["standalone"].read_text()), "Service")
    assert (service["spec"]["type"], service["spec"]["externalTrafficPolicy"]) == ("LoadBalancer", "Local")
    assert "externalTrafficPolicy" not in kind(documents(helm.template()), "Service")["spec"]
    result = helm.run("template", "kafka", str(CHART), "--set", "service.externalTrafficPolicy=Local")
    assert result.returncode != 0
    assert "service.externalTrafficPolicy applies to service.type NodePort or LoadBalancer only" in result.stderr
    assert "`Local` keeps each client's source IP" in (CHART / "README.md").read_text()
    assert "Local keeps the client's source IP" in (CHART / "values.yaml").read_text()


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("--set", "service.externalTrafficPolicy=local", "/service/externalTrafficPolicy"),
        ("--set-json", 'extraEnv=[{"value": "x"}]', "/extraEnv/0"),
        ("--set-json", 'extraVolumeMounts=[{"name": "x"}]', "/extraVolumeMounts/0"),
        ("--set", "startupProbe.periodSecond=2", "'periodSecond' not allowed"),
        ("--set", "podMonitor.enable=true", "'enable' not allowed"),
        ("--set", "grafanaDashboard.labels.grafana_dashboard=1", "/grafanaDashboard/labels/grafana_dashboard"),
    ],
)
def test_a_misspelt_extension_or_monitoring_value_fails_helm_lint(
    helm: Helm, flag: str, value: str, named: str
) -> None:
    result = helm.run("lint", "--strict", str(CHART), flag, value)
    assert result.returncode != 0
    assert named in result.stdout + result.stderr


# --- the environment: POD_NAME and Secret keys, for ${NAME} and key_password_env ---

POD_NAME_ENV = {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
KEY_PASSWORD = ["--set-json", 'secretEnv=[{"name": "KEY_PASSWORD", "secretName": "proxy-tls", "key": "password"}]']
PER_POD_TLS = {
    "cert_file": "/etc/kafka-admission-proxy-tls/server/${POD_NAME}.crt",
    "key_file": "/etc/kafka-admission-proxy-tls/server/${POD_NAME}.key",
    "key_password_env": "KEY_PASSWORD",
}


@pytest.mark.parametrize("mode", MODES)
def test_pod_name_comes_first_in_the_proxy_env_in_both_modes_for_per_pod_config_values(
    rendered: dict[str, Path], mode: str
) -> None:
    container = proxy_container(kind(documents(rendered[mode].read_text()), WORKLOADS[mode]))
    assert container["env"][0] == POD_NAME_ENV
    assert [e["name"] for e in container["env"]].count("POD_NAME") == 1


@pytest.mark.parametrize("mode", MODES)
def test_a_key_password_from_a_secret_reaches_the_env_var_key_password_env_names(helm: Helm, mode: str) -> None:
    """Sidecar mode: each broker's own certificate by ${POD_NAME}, its key's password from a Secret."""
    listener = {"name": "client", "bind": "0.0.0.0:9092", "tls": PER_POD_TLS}
    args = MODE_BASE[mode]
    docs = documents(helm.template(*args, *KEY_PASSWORD, "--set-json", f"config.listeners={json.dumps([listener])}"))
    container = proxy_container(kind(docs, WORKLOADS[mode]))
    assert container["env"][:2] == [
        POD_NAME_ENV,
        {"name": "KEY_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "proxy-tls", "key": "password"}}},
    ]
    tls = rendered_config(docs)["listeners"][0]["tls"]
    assert tls == PER_POD_TLS  # the proxy expands ${POD_NAME}, not helm


@pytest.mark.parametrize(
    ("config", "named"),
    [
        (
            {"listeners": [{"name": "client", "bind": "0.0.0.0:9092", "tls": PER_POD_TLS}]},
            "config.listeners[0].tls.key_password_env: environment variable KEY_PASSWORD is not set",
        ),
        (
            {
                "upstream": {
                    "bootstrap_servers": ["k:9092"],
                    "tls": {"enabled": True, "cert_file": "/c.crt", "key_file": "/c.key", "key_password_env": "UP"},
                }
            },
            "config.upstream.tls.key_password_env: environment variable UP is not set",
        ),
        (
            {"upstream": {"bootstrap_servers": ["${BROKER_HOST}:9092"]}},
            "config, a ${NAME} reference: environment variable BROKER_HOST is not set",
        ),
    ],
)
def test_a_config_naming_a_variable_the_container_lacks_fails_to_render(
    helm: Helm, config: dict[str, Any], named: str
) -> None:
    args = [arg for key, value in config.items() for arg in ("--set-json", f"config.{key}={json.dumps(value)}")]
    result = helm.run("template", "kafka", str(CHART), *args)
    assert result.returncode != 0
    assert named in result.stderr, result.stderr


def test_a_literal_dollar_brace_needs_no_variable_and_extra_env_counts_as_set(helm: Helm) -> None:
    upstream = {"bootstrap_servers": ["$${LITERAL}:9092", "${FROM_EXTRA}:9092"]}
    docs = documents(
        helm.template(
            "--set-json",
            f"config.upstream={json.dumps(upstream)}",
            "--set-json",
            'extraEnv=[{"name": "FROM_EXTRA", "value": "kafka-0"}]',
        )
    )
    assert rendered_config(docs)["upstream"]["bootstrap_servers"] == upstream["bootstrap_servers"]


# --- workers from the CPU limit ----------------------------------------------------

METRICS_DIR = "/run/kafka-admission-proxy/metrics"


def workers_of(docs: list[dict[str, Any]]) -> tuple[object, dict[str, Any]]:
    """(config.workers as rendered, the metrics directory: its env value, mount and volume)."""
    workload = next(d for d in docs if d["kind"] in ("Deployment", "StatefulSet"))
    container = proxy_container(workload)
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    name = "kafka-admission-proxy-metrics"
    return rendered_config(docs)["workers"], {
        "env": env.get("PROMETHEUS_MULTIPROC_DIR"),
        "mount": mounts.get(name),
        "volume": volumes.get(name),
    }


@pytest.mark.parametrize(
    ("cpu", "workers"),
    [("1", 1), ("2", 2), ("1500m", 2), ("1.5", 2), ("500m", 1), ("250m", 1), ("4000m", 4), ("3", 3), ("0.1", 1)],
)
@pytest.mark.parametrize("mode", ["standalone", "sidecar"])
def test_workers_follow_the_cpu_limit_rounded_up_at_least_one_with_a_memory_volume_for_the_metrics(
    helm: Helm, mode: str, cpu: str, workers: int
) -> None:
    rendered_workers, metrics_dir = workers_of(
        documents(helm.template(*MODE_BASE[mode], "--set-string", f"resources.limits.cpu={cpu}"))
    )
    assert rendered_workers == workers
    if workers == 1:  # one process, as before: no metric files
        assert metrics_dir == {"env": None, "mount": None, "volume": None}
    else:
        assert metrics_dir == {
            "env": METRICS_DIR,
            "mount": METRICS_DIR,
            "volume": {
                "name": "kafka-admission-proxy-metrics",
                "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"},
            },
        }


def test_workers_default_to_one_and_config_workers_wins_over_the_cpu_limit(helm: Helm) -> None:
    assert yaml.safe_load((CHART / "values.yaml").read_text())["resources"]["limits"]["cpu"] == "1"
    assert workers_of(documents(helm.template()))[0] == 1
    assert workers_of(documents(helm.template("--set", "resources.limits.cpu=null")))[0] == 1  # no limit
    assert workers_of(documents(helm.template("--set", "resources.limits.cpu=8")))[0] == 8  # a number, not a string
    workers, metrics_dir = workers_of(
        documents(helm.template("--set", "resources.limits.cpu=8", "--set", "config.workers=3"))
    )
    assert workers == 3 and metrics_dir["env"] == METRICS_DIR
    workers, metrics_dir = workers_of(documents(helm.template("--set", "config.workers=auto")))
    assert workers == "auto" and metrics_dir["env"] == METRICS_DIR  # auto may be more than one
    assert workers_of(documents(helm.template("--set", "config.workers=2", "--set", "resources.limits.cpu=4")))[0] == 2
    result = helm.run("lint", "--strict", str(CHART), "--set", "config.workers=many")
    assert result.returncode != 0 and "workers" in result.stdout + result.stderr


# --- the rendered config, run as rendered -----------------------------------------


def _run_rendered(
    helm: Helm, runtime_venv: Path, launch: Any, tmp_path: Path, upstream: str, listener: dict[str, Any], *args: str
) -> Any:
    admin = f"127.0.0.1:{free_port()}"
    docs = documents(
        helm.template(
            *args,
            "--set-json",
            f"config.upstream.bootstrap_servers={json.dumps([upstream])}",
            "--set-json",
            f"config.listeners={json.dumps([listener])}",
            "--set-json",
            f"config.admin={json.dumps({'bind': admin})}",
        )
    )
    workload = next(d for d in docs if d["kind"] in ("Deployment", "StatefulSet"))
    container = proxy_container(workload)
    config_path = tmp_path / "etc-kafka-admission-proxy" / "config.yaml"
    config_path.parent.mkdir()
    mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "kafka-admission-proxy-config")
    command = [str(runtime_venv / "bin" / container["command"][0])] + [
        arg.replace(mount, str(config_path.parent)) for arg in container["command"][1:] + container["args"]
    ]
    return launch(rendered_config(docs), command, config_path)


def test_the_standalone_config_runs_with_the_rendered_command_line_against_tansu(
    helm: Helm, tansu: TansuBroker, runtime_venv: Path, launch: Any, tmp_path: Path
) -> None:
    listener = {
        "name": "external",
        "bind": f"127.0.0.1:{free_port()}",
        "advertised_host": "127.0.0.1",
        "node_port_base": free_node_port_base([TansuBroker.NODE_ID]),
    }
    proxy = _run_rendered(
        helm,
        runtime_venv,
        launch,
        tmp_path,
        tansu.bootstrap,
        listener,
        "--set-json",
        f"brokerNodeIds=[{TansuBroker.NODE_ID}]",
    )
    assert proxy.config["mode"] == "cluster"
    assert len(produce_and_consume(proxy.bootstrap)) == 20
    # Clients were sent to the proxy's per-broker port, which the chart exposes.
    assert proxy.metric("kafka_admission_responses_rewritten_total", api="metadata") >= 1


def test_the_standalone_config_of_a_two_cpu_limit_runs_two_workers_against_tansu(
    helm: Helm, tansu: TansuBroker, runtime_venv: Path, launch: Any, tmp_path: Path
) -> None:
    """resources.limits.cpu: 2 renders workers: 2, and the rendered command line runs it: a
    supervisor and two workers, one /metrics counting the traffic of both."""
    listener = {
        "name": "external",
        "bind": f"127.0.0.1:{free_port()}",
        "advertised_host": "127.0.0.1",
        "node_port_base": free_node_port_base([TansuBroker.NODE_ID]),
    }
    proxy = _run_rendered(
        helm,
        runtime_venv,
        launch,
        tmp_path,
        tansu.bootstrap,
        listener,
        "--set-json",
        f"brokerNodeIds=[{TansuBroker.NODE_ID}]",
        "--set",
        "resources.limits.cpu=2",
    )
    assert proxy.config["workers"] == 2
    assert len(produce_and_consume(proxy.bootstrap)) == 20
    assert proxy.metric("kafka_admission_requests_total", api="produce") >= 1
    assert proxy.metric("kafka_admission_worker_restarts_total") == 0
    log = proxy.log()
    assert '"worker": 0' in log and '"worker": 1' in log  # log lines of both workers


def test_the_sidecar_config_runs_with_the_rendered_command_line_against_a_broker_advertising_the_proxy(
    helm: Helm, runtime_venv: Path, launch: Any, tmp_path: Path
) -> None:
    proxy_address = f"127.0.0.1:{free_port()}"
    # As in the broker pod: the broker advertises the proxy's address, the proxy dials the broker.
    with TansuBroker(advertised=proxy_address) as broker:
        proxy = _run_rendered(
            helm,
            runtime_venv,
            launch,
            tmp_path,
            broker.bootstrap,
            {"name": "client", "bind": proxy_address},
            "-f",
            str(SIDECAR_VALUES),
        )
        assert proxy.config["mode"] == "sidecar"
        assert len(produce_and_consume(proxy.bootstrap)) == 20
        assert proxy.metric("kafka_admission_requests_total", api="produce") >= 1
        assert proxy.metric("kafka_admission_responses_rewritten_total", api="metadata") == 0
