"""The Strimzi recipe (helm/kafka-admission-proxy/examples/strimzi): its Kafka and
KafkaNodePool resources validated against Strimzi's own CRD schemas (tests/deploy/crds/strimzi,
source and checksums in SOURCE.md), the chart values for them rendered by a real helm and
validated (helm lint --strict, kubernetes-validate --strict, checkov), and the two held
against each other: the listener admits exactly the proxy's pods, the proxy dials that
listener with Strimzi's CA, and the node ids Strimzi assigns are the ports the chart exposes."""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import deploy_tool
from tests.deploy.crd_schema import CRDS, crd_validator
from tests.deploy.test_helm_chart import CHART, DIGEST, Helm, documents, kind, proxy_container, rendered_config

RECIPE = CHART / "examples" / "strimzi"
STRIMZI_CRDS = CRDS / "strimzi"
RELEASE, NAMESPACE = "kafka-proxy", "kafka"
# Kafka refuses node ids above reserved.broker-max.id (default 1000) unless raised.
KAFKA_MAX_NODE_ID = 999


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(deploy_tool("helm"), tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="module")
def recipe() -> list[dict[str, Any]]:
    return documents((RECIPE / "kafka.yaml").read_text())


@pytest.fixture(scope="module")
def values() -> dict[str, Any]:
    return yaml.safe_load((RECIPE / "values.yaml").read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def rendering(helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recipe's values, the image by digest (as production should pull it)."""
    result = helm.run(
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "-f",
        str(RECIPE / "values.yaml"),
        "--set",
        f"image.digest={DIGEST}",
    )
    assert result.returncode == 0, result.stderr
    path = tmp_path_factory.mktemp("strimzi") / "proxy.yaml"
    path.write_text(result.stdout)
    return path


def node_id_range(annotation: str) -> list[int]:
    """strimzi.io/next-node-ids as Strimzi reads it (NodeIdRange): "[0, 1, 10-20]", ranges either way."""
    match = re.fullmatch(r"\[(.*)\]", annotation.strip())
    assert match, f"not a Strimzi node id range: {annotation}"
    ids: list[int] = []
    for item in match.group(1).split(","):
        first, _, last = item.strip().partition("-")
        start, end = int(first), int(last or first)
        ids.extend(range(start, end + 1) if start <= end else range(start, end - 1, -1))
    return ids


def assigned_ids(pool: dict[str, Any]) -> list[int]:
    """The ids a new pool's replicas get: the lowest unused id of its range first (NodeIdAssignor)."""
    ids = node_id_range(pool["metadata"]["annotations"]["strimzi.io/next-node-ids"])
    return ids[: pool["spec"]["replicas"]]


def pools(recipe: list[dict[str, Any]], role: str) -> list[dict[str, Any]]:
    return [d for d in recipe if d["kind"] == "KafkaNodePool" and role in d["spec"]["roles"]]


def test_the_strimzi_crds_are_the_files_source_md_names() -> None:
    source = (STRIMZI_CRDS / "SOURCE.md").read_text()
    recorded = {name: digest for digest, name in re.findall(r"`([0-9a-f]{64})  ([^`]+)`", source)}
    assert (
        set(recorded)
        == {p.name for p in STRIMZI_CRDS.glob("*.yaml")}
        == {"040-Crd-kafka.yaml", "045-Crd-kafkanodepool.yaml"}
    )
    for name, digest in recorded.items():
        assert hashlib.sha256((STRIMZI_CRDS / name).read_bytes()).hexdigest() == digest, name


def test_the_kafka_and_node_pools_validate_against_strimzis_crds(recipe: list[dict[str, Any]]) -> None:
    assert sorted(d["kind"] for d in recipe) == ["Kafka", "KafkaNodePool", "KafkaNodePool"]
    for resource in recipe:
        validator = crd_validator(STRIMZI_CRDS, resource["apiVersion"], resource["kind"])
        assert [error.message for error in validator.iter_errors(resource)] == [], resource["metadata"]["name"]
    # The validation can fail: a misspelt field and a listener name Strimzi refuses.
    kafka = kind(recipe, "Kafka")
    validator = crd_validator(STRIMZI_CRDS, kafka["apiVersion"], "Kafka")
    listener = kafka["spec"]["kafka"]["listeners"][0]
    for bad, named in (
        ({**listener, "networkPolicyPeer": []}, "networkPolicyPeer"),
        ({**listener, "name": "proxied-listener"}, "proxied-listener"),
    ):
        broken = {**kafka, "spec": {**kafka["spec"], "kafka": {**kafka["spec"]["kafka"], "listeners": [bad]}}}
        assert any(named in error.message for error in validator.iter_errors(broken))
    pool = pools(recipe, "broker")[0]
    missing_roles = {**pool, "spec": {k: v for k, v in pool["spec"].items() if k != "roles"}}
    validator = crd_validator(STRIMZI_CRDS, pool["apiVersion"], "KafkaNodePool")
    assert any("'roles' is a required property" in error.message for error in validator.iter_errors(missing_roles))


def test_the_pools_belong_to_the_cluster_and_the_brokers_have_the_only_client_listener(
    recipe: list[dict[str, Any]],
) -> None:
    kafka = kind(recipe, "Kafka")
    for pool in pools(recipe, "broker") + pools(recipe, "controller"):
        assert pool["metadata"]["labels"]["strimzi.io/cluster"] == kafka["metadata"]["name"]
        assert pool["metadata"]["namespace"] == kafka["metadata"]["namespace"] == NAMESPACE
    # One client listener: any other would be a way around the proxy.
    [listener] = kafka["spec"]["kafka"]["listeners"]
    assert listener["type"] == "internal" and listener["networkPolicyPeers"]


def test_strimzis_broker_ids_are_the_charts_broker_node_ids_and_their_ports_never_go_sparse(
    recipe: list[dict[str, Any]], values: dict[str, Any], rendering: Path
) -> None:
    """Brokers take ids from their own range (strimzi.io/next-node-ids), lowest first, so the
    ports node_port_base + id are contiguous; the chart's brokerNodeIds are exactly those ids,
    and every id of the range has a port that fits and collides with no other port of the proxy."""
    [brokers] = pools(recipe, "broker")
    [controllers] = pools(recipe, "controller")
    broker_range = node_id_range(brokers["metadata"]["annotations"]["strimzi.io/next-node-ids"])
    controller_range = node_id_range(controllers["metadata"]["annotations"]["strimzi.io/next-node-ids"])
    assert not set(broker_range) & set(controller_range)
    assert max(broker_range + controller_range) <= KAFKA_MAX_NODE_ID
    # Scaling down removes the highest broker id first.
    removal = node_id_range(brokers["metadata"]["annotations"]["strimzi.io/remove-node-ids"])
    assert removal == sorted(broker_range, reverse=True)
    ids = assigned_ids(brokers)
    assert ids == values["brokerNodeIds"] == list(range(ids[0], ids[0] + len(ids)))
    [listener] = values["config"]["listeners"]
    base = listener["node_port_base"]
    docs = documents(rendering.read_text())
    service_ports = {p["name"]: p["port"] for p in kind(docs, "Service")["spec"]["ports"]}
    assert sorted(port for name, port in service_ports.items() if name.startswith("l0-b")) == [base + i for i in ids]
    assert [base + i for i in ids] == list(range(base + ids[0], base + ids[-1] + 1))
    others = {int(listener["bind"].rsplit(":", 1)[1]), service_ports["admin"]}
    for node_id in broker_range:  # the pool may grow to the whole range
        assert 1024 <= base + node_id <= 65535 and base + node_id not in others
    assert set(rendered_config(docs)["listeners"][0].items()) >= {("node_port_base", base)}


def test_the_listener_admits_exactly_the_proxys_pods_and_the_proxy_dials_it_with_strimzis_ca(
    recipe: list[dict[str, Any]], rendering: Path
) -> None:
    kafka = kind(recipe, "Kafka")
    cluster = kafka["metadata"]["name"]
    [listener] = kafka["spec"]["kafka"]["listeners"]
    docs = documents(rendering.read_text())
    deployment = kind(docs, "Deployment")
    assert deployment["metadata"]["namespace"] == kafka["metadata"]["namespace"]  # no namespaceSelector needed
    [peer] = listener["networkPolicyPeers"]
    assert set(peer) == {"podSelector"}
    # The peer selects the proxy's pods, by the labels the Deployment selects them by.
    selector = peer["podSelector"]["matchLabels"]
    assert selector == deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    config = rendered_config(docs)
    assert config["mode"] == "cluster"
    assert config["upstream"]["bootstrap_servers"] == [f"{cluster}-kafka-bootstrap.{NAMESPACE}.svc:{listener['port']}"]
    assert config["upstream"]["tls"]["enabled"] is listener["tls"] is True
    # The CA file is ca.crt of Strimzi's cluster CA Secret, mounted as a directory.
    ca_file = Path(config["upstream"]["tls"]["ca_file"])
    assert ca_file.name == "ca.crt"
    mounts = {m["mountPath"]: m["name"] for m in proxy_container(deployment)["volumeMounts"]}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mounts[str(ca_file.parent)]]["secret"]["secretName"] == f"{cluster}-cluster-ca-cert"
    # Clients are told the proxy's Service, never a broker.
    service = kind(docs, "Service")
    assert config["listeners"][0]["advertised_host"] == f"{service['metadata']['name']}.{NAMESPACE}.svc"


def test_the_recipe_values_pass_helm_lint_kubernetes_validate_and_checkov(
    helm: Helm, rendering: Path, tmp_path: Path
) -> None:
    result = helm.run("lint", "--strict", str(CHART), "-f", str(RECIPE / "values.yaml"))
    assert result.returncode == 0 and "0 chart(s) failed" in result.stdout, result.stdout + result.stderr
    result = subprocess.run(
        [deploy_tool("kubernetes-validate"), "--strict", "--quiet", str(rendering)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (result.stdout + result.stderr).strip() == ""
    result = subprocess.run(
        [
            deploy_tool("checkov"),
            "--config-file",
            str(CHART / ".checkov.yaml"),
            "--output",
            "json",
            "-f",
            str(rendering),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
