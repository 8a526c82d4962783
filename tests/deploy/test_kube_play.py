"""The chart's standalone rendering run with ``podman kube play``: the ConfigMap and the
Deployment exactly as ``helm template`` writes them (command, args, env, mounts, security
context, probes), on the image deploy/Dockerfile builds (``proxy_image``, once per session),
with real traffic through it. One pod per mode: about 15 s on top of the image builds.

The pod runs on podman's default bridge network (``podman``): its containerPorts are published on the same
host ports, so clients on the host reach the proxy at 127.0.0.1 (the address it advertises),
and the proxy reaches a Tansu broker bound to the bridge's gateway address (a local address
of this host; Tansu advertises it too). The listener serves TLS from the chart's ``tlsSecrets``
volume with the certificate of this pod, ``/etc/kafka-admission-proxy-tls/server/${POD_NAME}.crt``:
the config names it through ``${POD_NAME}``, which the chart sets from the downward API and the
proxy expands at load; the key is encrypted, and its password reaches ``key_password_env`` as
the chart's ``secretEnv`` (a ``secretKeyRef``).

What ``kube play`` (podman 4.3, Debian 12's) cannot express, and what this test does instead:
- Secrets: a ``Secret`` document is stored whole as YAML, which a ``secret`` volume then writes
  still base64-encoded, and which a ``secretKeyRef`` cannot read (it wants a JSON map of base64
  values). The test creates the two Secrets as podman secrets in the forms 4.3 reads (the same
  bytes); the chart's volume and ``secretKeyRef`` refer to them unchanged. A ``secret`` volume
  without ``optional`` crashes 4.3 (a nil dereference): the chart writes ``optional: false``.
- Probes: readiness and startup probes are ignored; the liveness probe becomes a healthcheck
  that runs ``curl`` inside the container (the image has none) on port 0 (a named port is not
  resolved). The test asks each probe's path on its port as the kubelet would.
- ``preStop``, ``terminationGracePeriodSeconds`` (podman stops with its own timeout), ``fsGroup``
  and ``seccompProfile`` (podman's default profile applies) are ignored; the Service,
  ServiceAccount and PodDisruptionBudget are not kinds it runs, so they are left out.
- It has no ``--ulimit``: the limits podman may set here come from a CONTAINERS_CONF file.

The sidecar example (exampleBroker: the proxy in an Apache Kafka broker's pod) runs too, one
broker: Apache Kafka 4.4 from Maven Central's jars on Debian's Java 17 (kafka-broker/), the
proxy sidecar in front of it, kafka-python through the proxy's published port. Beyond the
above, kube play runs no StatefulSet, so the test makes the pod the StatefulSet controller
and the kubelet would (``as_kubelet_would_run``: its name and pod-index label, emptyDirs for
the volume claims, ``$(POD_NAME)`` in env values expanded, which 4.3 leaves as written) and
stands in for the cluster DNS: a host alias in the pod and a name map in the client process.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import shutil
import socket
import tempfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from prometheus_client.parser import text_string_to_metric_families

from demo.tansu import TansuBroker, free_port
from tests.apache_kafka.broker import fetch_java_parts
from tests.clients import consume, create_topic, produce, unique
from tests.conftest import free_node_port_base, wait_until
from tests.deploy.conftest import deploy_tool
from tests.deploy.podman import CONTAINERS_CONF, JRE_COMMAND, debian_image, podman
from tests.deploy.test_helm_chart import CHART, Helm

KEY_PASSWORD = "kube-play-key-password"
TLS_DIR = "/etc/kafka-admission-proxy-tls/server"
# podman's default bridge, named: kube play would otherwise make its own network on first use,
# whose gateway is unknown until then.
NETWORK = "podman"


@dataclass
class Pod:
    name: str
    container: str
    spec: dict[str, Any]  # the proxy container as the chart rendered it
    listener_port: int
    admin_port: int
    certificate: x509.Certificate
    ca_file: Path

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.listener_port}"

    def get(self, path: str, port: int | None = None) -> tuple[int, str]:
        url = f"http://127.0.0.1:{port or self.admin_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()
        except OSError as err:
            return 0, str(err)

    def metric(self, name: str, **labels: str) -> float:
        _, text = self.get("/metrics")
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
        )

    def log(self) -> str:
        logs = podman("logs", self.container, check=False)
        return logs.stdout + logs.stderr

    def tls(self) -> dict[str, str]:
        return {"security.protocol": "SSL", "ssl.ca.location": str(self.ca_file)}


def gateway() -> str:
    """The bridge network's gateway: the host, as the pod sees it."""
    [network] = json.loads(podman("network", "inspect", NETWORK).stdout)
    return str(network["subnets"][0]["gateway"])


def podman_secret(name: str, payload: dict[str, Any], folder: Path) -> None:
    path = folder / f"{name}.json"
    path.write_text(json.dumps(payload))
    podman("secret", "create", name, str(path))
    path.unlink()


@pytest.fixture(scope="module", autouse=True)
def pause_init() -> None:
    """kube play starts every pod with a pause container run by catatonit, which podman only
    recommends (tools/apt-install installs no recommends): without it, a skip naming it."""
    if shutil.which("catatonit") is None:
        pytest.skip(
            "catatonit not installed: podman kube play runs a pod's pause container with it"
            " (tools/apt-install catatonit)"
        )


@pytest.fixture(scope="module")
def pod(proxy_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    folder = tmp_path_factory.mktemp("kube-play")
    release = f"kp{uuid.uuid4().hex[:6]}"  # the ConfigMap and Secret volumes are named after it
    fullname = f"{release}-kafka-admission-proxy"
    pod_name = f"{fullname}-pod-0"  # kube play's name for a Deployment's first pod
    tls_secret, password_secret = f"{release}-tls", f"{release}-key-password"
    listener_port, admin_port, broker_port = free_port(), free_port(), free_port()
    node_port_base = free_node_port_base([TansuBroker.NODE_ID])
    host = gateway()

    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    key = serialization.load_pem_private_key(server.private_key_pem.bytes(), None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(KEY_PASSWORD.encode()),
    )
    certificate = server.cert_chain_pems[0].bytes()
    listener = {
        "name": "external",
        "bind": f"0.0.0.0:{listener_port}",
        "advertised_host": "127.0.0.1",
        "node_port_base": node_port_base,
        "tls": {
            "cert_file": f"{TLS_DIR}/${{POD_NAME}}.crt",
            "key_file": f"{TLS_DIR}/${{POD_NAME}}.key",
            "key_password_env": "KEY_PASSWORD",
        },
    }
    repository, tag = proxy_image.rsplit(":", 1)
    values = {
        "image.repository": repository,
        "image.tag": tag,
        "replicaCount": 1,  # every replica would publish the same host ports
        "brokerNodeIds": [TansuBroker.NODE_ID],
        "config.upstream.bootstrap_servers": [f"{host}:{broker_port}"],
        "config.listeners": [listener],
        "config.admin": {"bind": f"0.0.0.0:{admin_port}"},
        "tlsSecrets": [{"name": "server", "secretName": tls_secret}],
        "secretEnv": [{"name": "KEY_PASSWORD", "secretName": password_secret, "key": "password"}],
    }
    args = [arg for key, value in values.items() for arg in ("--set-json", f"{key}={json.dumps(value)}")]
    helm = Helm(deploy_tool("helm"), folder / "helm-home")
    rendered = helm.run("template", release, str(CHART), "--namespace", "kafka", *args)
    assert rendered.returncode == 0, rendered.stderr
    docs = [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]
    played = [doc for doc in docs if doc["kind"] in ("ConfigMap", "Deployment")]
    assert [doc["kind"] for doc in played] == ["ConfigMap", "Deployment"], [doc["kind"] for doc in docs]
    [deployment] = [doc for doc in played if doc["kind"] == "Deployment"]
    [spec] = deployment["spec"]["template"]["spec"]["containers"]
    play_file = folder / "standalone.yaml"
    play_file.write_text(yaml.safe_dump_all(played))
    conf = folder / "containers.conf"
    conf.write_text(CONTAINERS_CONF)

    found = Pod(
        pod_name,
        f"{pod_name}-{spec['name']}",
        spec,
        listener_port,
        admin_port,
        x509.load_pem_x509_certificate(certificate),
        folder / "ca.pem",
    )
    try:
        # The forms podman 4.3 reads (module docstring): a secret volume's files as plain text
        # under data, a secretKeyRef's values base64-encoded in a JSON map.
        podman_secret(
            tls_secret,
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": tls_secret},
                "data": {f"{pod_name}.crt": certificate.decode(), f"{pod_name}.key": encrypted.decode()},
            },
            folder,
        )
        podman_secret(password_secret, {"password": base64.b64encode(KEY_PASSWORD.encode()).decode()}, folder)
        podman("kube", "play", "--network", NETWORK, str(play_file), env={"CONTAINERS_CONF": str(conf)}, timeout=180)
        # The bridge (and so its gateway address) exists once a pod is on it.
        with TansuBroker(port=broker_port, advertised=f"{host}:{broker_port}", host=host):
            try:
                wait_until(lambda: found.get("/readyz")[0] == 200, timeout=60, interval=0.5)
            except AssertionError:
                raise AssertionError(f"the pod never became ready; its log:\n{found.log()}") from None
            yield found
    finally:
        podman("kube", "down", str(play_file), check=False, timeout=180)
        for name in (tls_secret, password_secret):
            podman("secret", "rm", name, check=False)
        podman("volume", "rm", "--force", fullname, tls_secret, check=False)


def test_the_pod_runs_the_chart_command_line_restricted_as_the_security_context_says(pod: Pod) -> None:
    [found] = json.loads(podman("container", "inspect", pod.container).stdout)
    assert [found["Path"], *found["Args"]] == pod.spec["command"] + pod.spec["args"]
    assert found["HostConfig"]["ReadonlyRootfs"] is True
    status = dict(
        line.split(":\t", 1)
        for line in podman("exec", pod.container, "cat", "/proc/1/status").stdout.splitlines()
        if ":\t" in line
    )
    assert status["Uid"].split() == ["10001"] * 4 and status["Gid"].split() == ["10001"] * 4
    assert int(status["CapEff"], 16) == 0 and int(status["CapBnd"], 16) == 0
    assert status["NoNewPrivs"].strip() == "1"
    wrote = podman("exec", pod.container, "python", "-c", "open('/etc/probe', 'w')", check=False)
    assert wrote.returncode != 0 and "Read-only file system" in wrote.stderr


def test_a_config_naming_pod_name_loads_this_pods_certificate_with_the_password_from_a_secret(pod: Pod) -> None:
    env = podman("exec", pod.container, "printenv", "POD_NAME").stdout.strip()
    assert env == pod.name
    # The listener presents the certificate named <pod>.crt: its notAfter, as the proxy exports it.
    expiry = pod.metric("kafka_admission_tls_certificate_expiry_timestamp_seconds", listener="external")
    assert expiry == pod.certificate.not_valid_after_utc.timestamp()
    assert pod.metric("kafka_admission_config_last_reload_successful") == 1
    assert "proxy started" in pod.log()


def test_clients_produce_and_consume_over_tls_through_the_published_ports(pod: Pod) -> None:
    topic = unique("kube-play")
    create_topic(pod.bootstrap, topic, **pod.tls())
    assert produce(pod.bootstrap, topic, 20, **pod.tls()) == 20
    assert len(consume(pod.bootstrap, topic, unique("kube-play-group"), 20, **pod.tls())) == 20
    # Metadata sent the clients to the broker's port the chart publishes (node_port_base + 111).
    assert pod.metric("kafka_admission_responses_rewritten_total", api="metadata") >= 1
    assert pod.metric("kafka_admission_requests_total", api="produce") >= 1


def test_every_probe_the_chart_writes_answers_on_its_named_port(pod: Pod) -> None:
    """As the kubelet would ask them (kube play runs none of them faithfully)."""
    ports = {port["name"]: port["containerPort"] for port in pod.spec["ports"]}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        http = pod.spec[probe]["httpGet"]
        assert pod.get(http["path"], ports[http["port"]])[0] == 200, probe


def test_sigterm_drains_the_proxy_to_exit_0(pod: Pod) -> None:
    """Last in the module: it stops the pod's proxy."""
    podman("stop", "--time", "40", pod.container, timeout=60)
    [found] = json.loads(podman("container", "inspect", pod.container).stdout)
    assert found["State"]["ExitCode"] == 0, pod.log()
    assert "shutting down" in pod.log()


# --- the sidecar example: the proxy in an Apache Kafka broker's pod ---------------------

BROKER_IMAGE_DIR = Path(__file__).parent / "kafka-broker"
SIDECAR_VALUES = CHART / "examples" / "sidecar-values.yaml"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
# A Kubernetes env value's $(NAME): the kubelet expands it from the variables before it.
DEPENDENT_ENV = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


@pytest.fixture(scope="module")
def broker_image() -> Iterator[str]:
    """Apache Kafka's jars from Maven Central (tools/fetch-apache-kafka) on Debian's Java 17
    runtime (an mmdebstrap base, cached like the proxy's: about 30 s once, 351 MB), with an
    entrypoint that reads KAFKA_* as the apache/kafka image does (kafka-broker/run)."""
    if shutil.which("java") is None or shutil.which("mvn") is None:
        pytest.skip("java or mvn not installed (apt-get install default-jre-headless maven)")
    jars = fetch_java_parts().kafka_lib
    jre = debian_image("kafka-broker-jre", JRE_COMMAND)
    tag = f"localhost/kafka-broker:test-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="kafka-broker-image-") as context:
        shutil.copytree(jars, Path(context) / "libs")
        for name in ("Containerfile", "run"):
            shutil.copy2(BROKER_IMAGE_DIR / name, Path(context) / name)
        podman("build", "--build-arg", f"JRE_IMAGE={jre}", "-f", f"{context}/Containerfile", "-t", tag, context)
    yield tag
    podman("rmi", tag, check=False)


def expand_dependent(value: str, known: dict[str, str]) -> str:
    return DEPENDENT_ENV.sub(lambda m: known.get(m.group(1), m.group(0)), value)


def as_kubelet_would_run(statefulset: dict[str, Any], index: int, fqdn: str) -> dict[str, Any]:
    """Pod ``index`` of ``statefulset`` as Kubernetes would make it, for kube play, which runs no
    StatefulSet: named <name>-<index> with the pod-index label, the volumeClaimTemplates as
    emptyDirs, $(NAME) in env values expanded, and the cluster DNS name of the pod as a host
    alias (kube play has no cluster DNS). The broker's containerPorts are left out: kube play
    would publish its replication and controller ports on the host, which nothing here needs."""
    template = copy.deepcopy(statefulset["spec"]["template"])
    name = f"{statefulset['metadata']['name']}-{index}"
    spec = template["spec"]
    for container in spec["containers"]:
        known: dict[str, str] = {}
        for env in container.get("env", []):
            if env.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
                known[env["name"]] = name
            elif "value" in env:
                env["value"] = expand_dependent(env["value"], known)
                known[env["name"]] = env["value"]
        if container["name"] != "kafka-admission-proxy":
            container.pop("ports", None)
    claims = [claim["metadata"]["name"] for claim in statefulset["spec"].get("volumeClaimTemplates", [])]
    spec["volumes"] = [*spec.get("volumes", []), *({"name": claim, "emptyDir": {}} for claim in claims)]
    spec["hostAliases"] = [{"ip": "127.0.0.1", "hostnames": [fqdn]}]
    labels = {**template["metadata"].get("labels", {}), POD_INDEX_LABEL: str(index)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": spec}


@dataclass
class BrokerPod:
    name: str
    fqdn: str
    client_port: int
    admin_port: int

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def log(self, container: str) -> str:
        logs = podman("logs", f"{self.name}-{container}", check=False)
        return logs.stdout + logs.stderr

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/readyz", timeout=10) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def metric(self, name: str, **labels: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/metrics", timeout=10) as response:
            text = response.read().decode()
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
        )


@pytest.fixture(scope="module")
def broker_pod(proxy_image: str, broker_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerPod]:
    folder = tmp_path_factory.mktemp("kube-play-sidecar")
    fullname = f"ks{uuid.uuid4().hex[:6]}"  # the ConfigMap (a podman volume) is named after it
    client_port, broker_client_port, admin_port = free_port(), free_port(), free_port()
    repository, tag = proxy_image.rsplit(":", 1)
    values = {
        "fullnameOverride": fullname,
        "image.repository": repository,
        "image.tag": tag,
        "exampleBroker.image": broker_image,
        "exampleBroker.replicas": 1,  # one pod: every pod would publish the same host ports
        "exampleBroker.clientPort": client_port,
        "exampleBroker.brokerClientPort": broker_client_port,
        "config.upstream.bootstrap_servers": [f"127.0.0.1:{broker_client_port}"],
        "config.listeners": [{"name": "client", "bind": f"0.0.0.0:{client_port}"}],
        "config.admin": {"bind": f"0.0.0.0:{admin_port}"},
    }
    args = [arg for key, value in values.items() for arg in ("--set-json", f"{key}={json.dumps(value)}")]
    helm = Helm(deploy_tool("helm"), folder / "helm-home")
    rendered = helm.run("template", "kafka", str(CHART), "--namespace", "kafka", "-f", str(SIDECAR_VALUES), *args)
    assert rendered.returncode == 0, rendered.stderr
    docs = [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]
    [statefulset] = [doc for doc in docs if doc["kind"] == "StatefulSet"]
    [config_map] = [doc for doc in docs if doc["kind"] == "ConfigMap" and "config.yaml" in doc.get("data", {})]
    name = f"{statefulset['metadata']['name']}-0"
    fqdn = f"{name}.{statefulset['spec']['serviceName']}.kafka.svc.cluster.local"
    play_file = folder / "sidecar.yaml"
    play_file.write_text(yaml.safe_dump_all([config_map, as_kubelet_would_run(statefulset, 0, fqdn)]))
    conf = folder / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    found = BrokerPod(name, fqdn, client_port, admin_port)
    try:
        podman("kube", "play", "--network", NETWORK, str(play_file), env={"CONTAINERS_CONF": str(conf)}, timeout=180)
        try:
            # The proxy's /readyz asks the broker for ApiVersions: ready once Kafka serves.
            wait_until(found.ready, timeout=120, interval=1)
        except AssertionError:
            raise AssertionError(
                f"the broker pod never became ready; kafka:\n{found.log('kafka')[-4000:]}\n"
                f"proxy:\n{found.log('kafka-admission-proxy')[-2000:]}"
            ) from None
        yield found
    finally:
        podman("kube", "down", str(play_file), check=False, timeout=180)
        podman("volume", "rm", "--force", config_map["metadata"]["name"], check=False)


def test_the_sidecar_example_carries_traffic_to_apache_kafka_in_its_pod(
    broker_pod: BrokerPod, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kafka-python through the proxy's published port. In sidecar mode the proxy passes the
    broker's metadata through, so clients are sent to the name the broker advertises (its pod's
    cluster DNS name): here that name resolves to 127.0.0.1 in this process only, in place of
    the cluster DNS."""
    resolve = socket.getaddrinfo

    def cluster_dns(host: Any, *args: Any, **kwargs: Any) -> Any:
        return resolve("127.0.0.1" if host == broker_pod.fqdn else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", cluster_dns)
    topic = unique("kube-play-sidecar")
    admin = KafkaAdminClient(bootstrap_servers=broker_pod.bootstrap, request_timeout_ms=30000)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=broker_pod.bootstrap, acks="all")
    try:
        for i in range(20):
            producer.send(topic, f"record-{i}".encode())
        producer.flush(timeout=30)
    finally:
        producer.close()
    # No group: the example's single broker cannot make __consumer_offsets (replication 3).
    consumer = KafkaConsumer(
        bootstrap_servers=broker_pod.bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=30000
    )
    try:
        consumer.assign([TopicPartition(topic, 0)])
        values = [record.value for _, record in zip(range(20), consumer, strict=False)]
    finally:
        consumer.close()
    assert values == [f"record-{i}".encode() for i in range(20)]
    assert broker_pod.metric("kafka_admission_requests_total", api="produce") >= 1
    assert broker_pod.metric("kafka_admission_requests_total", api="fetch") >= 1
    assert "Kafka Server started" in broker_pod.log("kafka")
