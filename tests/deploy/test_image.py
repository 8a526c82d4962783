"""deploy/Dockerfile built and run for real with podman (tests/deploy/podman.py): the build
context .dockerignore leaves, the image's labels and HEALTHCHECK, and a container run
read-only as uid 10001 with no capabilities and no new privileges, on the host network in
front of a Tansu broker on 127.0.0.1, with a produce and a consume through it, its
HEALTHCHECK going healthy, and SIGTERM draining it to exit 0.

The container shares the host's network (``--network host``): it reaches the broker on
127.0.0.1, and its admin port is the image's 9464 on the host, which the demo binds too,
hence ``demo_ports`` (one xdist worker runs them one after another)."""

from __future__ import annotations

import json
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer

from tests.clients import GROUP_CONF, create_topic, produce, unique
from tests.conftest import ROOT, wait_until
from tests.deploy.conftest import IMAGE_CONFIG, produce_and_consume, proxy_config
from tests.deploy.podman import IMAGE_SOURCE, ULIMITS, podman, revision
from tests.deploy.test_dockerfile import instructions

pytestmark = pytest.mark.demo_ports

# The base (tests/deploy/podman.py: bookworm minbase with python3, venv, pip, ca-certificates)
# is 199 MB; the proxy's venv adds 48 MB: 247 MB measured. A bound above it catches a heavy
# layer slipping in.
IMAGE_SIZE_BOUND_MB = 280
# What .dockerignore leaves of the checkout: 0.7 MB measured (66 files: the sources and the locks).
CONTEXT_SIZE_BOUND_MB = 5
ADMIN_PORT = 9464  # the HEALTHCHECK's, fixed in the image
SOURCE = IMAGE_SOURCE


@pytest.fixture(scope="module")
def image(proxy_image: str) -> str:
    """The image built once per session (tests/deploy/conftest.py ``proxy_image``)."""
    return proxy_image


def inspect(image: str) -> dict[str, Any]:
    [found] = json.loads(podman("image", "inspect", image).stdout)
    assert isinstance(found, dict)
    return found


def context_files(folder: Path) -> dict[str, int]:
    return {
        str(path.relative_to(folder)): path.stat().st_size
        for path in folder.rglob("*")
        if path.is_file() and not path.is_symlink()
    }


def test_the_build_context_is_small_and_holds_what_the_dockerfile_copies(tmp_path: Path) -> None:
    """The engine's own reading of .dockerignore: a build that copies the whole context into
    an empty image, whose files are then read from its mount."""
    (tmp_path / "Dockerfile").write_text("FROM scratch\nCOPY . /context\n")
    tag = f"localhost/kafka-admission-proxy-context:{uuid.uuid4().hex[:8]}"
    podman("build", "-f", str(tmp_path / "Dockerfile"), "-t", tag, str(ROOT))
    try:
        mount = Path(podman("image", "mount", tag).stdout.strip())
        try:
            files = context_files(mount / "context")
        finally:
            podman("image", "unmount", tag)
    finally:
        podman("rmi", tag)
    build = instructions(0)
    sources = [part for copy in build["COPY"] if not copy.startswith("--from") for part in copy.split()[:-1]]
    assert sources, build["COPY"]
    for source in sources:
        assert source in files or any(name.startswith(f"{source}/") for name in files), f"{source} not in the context"
    assert any(name.startswith("proxy/") and name.endswith(".py") for name in files)
    for left_out in (".git", ".venv", ".cache", "tests", "helm", "bench"):
        assert not any(name == left_out or name.startswith(f"{left_out}/") for name in files), left_out
    assert not any("__pycache__" in name for name in files)
    size = sum(files.values())
    assert size < CONTEXT_SIZE_BOUND_MB * 1e6, f"the build context is {size / 1e6:.1f} MB"


def test_the_image_carries_its_labels_healthcheck_and_user(image: str) -> None:
    found = inspect(image)
    labels = found["Labels"]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert labels["org.opencontainers.image.version"] == version
    assert labels["org.opencontainers.image.revision"] == revision()
    assert labels["org.opencontainers.image.source"] == SOURCE
    assert labels["org.opencontainers.image.title"] == "kafka-admission-proxy"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    # The docker format keeps HEALTHCHECK (podman's default OCI format drops it, warning only).
    assert found["Healthcheck"]["Test"][0] == "CMD"
    assert found["Config"]["User"] == "10001:10001"
    assert found["Size"] < IMAGE_SIZE_BOUND_MB * 1e6, f"the image is {found['Size'] / 1e6:.0f} MB"


@pytest.fixture
def container(image: str, tansu: Any, tmp_path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """The image run as a restricted pod runs it: read-only root (and no tmpfs), the image's
    uid 10001, every capability dropped, no new privileges; its config mounted read-only."""
    config = proxy_config(tansu.bootstrap, admin_port=ADMIN_PORT)
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    config_file.chmod(0o644)
    name = f"kap-test-{uuid.uuid4().hex[:8]}"
    podman(
        "run",
        "--detach",
        "--name",
        name,
        "--network",
        "host",
        "--read-only",
        "--read-only-tmpfs=false",
        "--cap-drop=ALL",
        "--security-opt",
        "no-new-privileges",
        *ULIMITS,
        "-v",
        f"{config_file}:{IMAGE_CONFIG}:ro",
        image,
    )
    try:
        yield name, config
    finally:
        podman("rm", "--force", name, check=False)


def container_log(name: str) -> str:
    logs = podman("logs", name)
    return logs.stdout + logs.stderr


def test_the_image_runs_restricted_carries_traffic_goes_healthy_and_drains_on_sigterm(
    container: tuple[str, dict[str, Any]],
) -> None:
    name, config = container

    def healthy() -> bool:
        return podman("healthcheck", "run", name, check=False).returncode == 0

    try:
        wait_until(healthy, timeout=60, interval=0.5)
    except AssertionError:
        raise AssertionError(f"never healthy; its log:\n{container_log(name)}") from None
    state = json.loads(podman("container", "inspect", name).stdout)[0]["State"]
    assert state["Health"]["Status"] == "healthy", state

    # The proxy is pid 1: its uid, capabilities and no_new_privs as the kernel holds them.
    status = dict(
        line.split(":\t", 1)
        for line in podman("exec", name, "cat", "/proc/1/status").stdout.splitlines()
        if ":\t" in line
    )
    assert status["Uid"].split() == ["10001"] * 4 and status["Gid"].split() == ["10001"] * 4
    assert int(status["CapEff"], 16) == 0 and int(status["CapBnd"], 16) == 0
    assert status["NoNewPrivs"].strip() == "1"
    # Nothing is writable, not even /tmp (mode 1777, which uid 10001 could write otherwise).
    wrote = podman("exec", name, "python", "-c", "open('/tmp/probe', 'w')", check=False)
    assert wrote.returncode != 0 and "Read-only file system" in wrote.stderr

    bootstrap = config["listeners"][0]["bind"]
    assert len(produce_and_consume(bootstrap)) == 20

    # SIGTERM with a consumer attached: librdkafka keeps a Fetch long-poll in flight through
    # the proxy, which answers it and closes the connection (drained), well inside the drain time.
    topic = unique("drain")
    create_topic(bootstrap, topic)
    assert produce(bootstrap, topic, 1) == 1
    # A slow reconnect: after the proxy is gone, close() retries less often (a quieter log).
    quiet = {"reconnect.backoff.ms": 1000, "reconnect.backoff.max.ms": 1000}
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("drain-group"), **GROUP_CONF, **quiet})
    try:
        consumer.subscribe([topic])
        wait_until(lambda: (m := consumer.poll(0.2)) is not None and m.error() is None, timeout=30)
        podman("kill", "--signal", "SIGTERM", name)
        exit_code = podman("wait", name, timeout=60).stdout.strip()  # 0.6-2.4 s measured
    finally:
        consumer.close()
    log = container_log(name)
    assert exit_code == "0", log
    events = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    messages = [event["msg"] for event in events]
    assert "proxy ready" in messages, log
    assert any(msg.startswith("shutting down: no new connections, draining") for msg in messages), log
    assert not any(msg.startswith("drain time over") for msg in messages), log
