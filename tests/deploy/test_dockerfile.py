"""deploy/Dockerfile: hadolint passes, and the image's install is also built outside a
container (a venv made as the build stage makes it) so its ENTRYPOINT + CMD and
HEALTHCHECK command lines run against a real Tansu broker, with a produce and a consume
through the proxy, in seconds. The image itself is built and run with podman in
test_image.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.deploy.conftest import (
    EXTRAS_MODULES,
    IMAGE_CONFIG,
    IMAGE_PACKAGE_SOURCES,
    IMAGE_VENV,
    deploy_tool,
    produce_and_consume,
    proxy_config,
)

DOCKERFILE = ROOT / "deploy" / "Dockerfile"
# Measured with `make runtime-size`: 47.5 MB of files (54 MB on disk). A bound well above it catches
# a heavy dependency slipping into the runtime install.
RUNTIME_SIZE_BOUND_MB = 75


def instructions(stage: int = -1) -> dict[str, list[str]]:
    """Every instruction's values in one build stage (default: the final one)."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stages: list[dict[str, list[str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        if keyword.upper() == "FROM":
            stages.append({})
        if stages:
            stages[-1].setdefault(keyword.upper(), []).append(re.sub(r"\s+", " ", rest).strip())
    return stages[stage]


def last(stage: dict[str, list[str]], keyword: str) -> str:
    return stage[keyword][-1]


def exec_form(value: str) -> list[str]:
    parsed = json.loads(value)
    assert isinstance(parsed, list) and all(isinstance(a, str) for a in parsed), value
    return parsed


def image_env(venv: Path) -> dict[str, str]:
    """The final stage's PATH, with the image's venv path mapped to the test's venv."""
    path = last(instructions(), "ENV").split()[0]
    assert path.startswith(f"PATH={IMAGE_VENV}/bin:"), path
    return {**os.environ, "PATH": f"{venv}/bin:{os.environ['PATH']}"}


def test_hadolint_passes() -> None:
    result = subprocess.run([deploy_tool("hadolint"), str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""


def test_the_image_is_multi_stage_and_runs_as_a_numeric_non_root_user() -> None:
    build, final = instructions(0), instructions()
    assert any("--require-hashes -r requirements/runtime.txt" in run for run in build["RUN"])
    # The build backend comes from its hash-locked file, never from an isolated build's own fetch.
    assert any("--require-hashes -r requirements/build.txt" in run for run in build["RUN"])
    copied = [path for copy in build["COPY"] for path in copy.split()[:-1]]
    assert [p for p in copied if not p.startswith("requirements/")] == list(IMAGE_PACKAGE_SOURCES)
    [package] = [run for run in build["RUN"] if " ./" in run]
    assert "pip wheel --no-cache-dir --no-deps --no-build-isolation" in package and "--no-index" in package
    assert final["COPY"] == [f"--from=build {IMAGE_VENV} {IMAGE_VENV}"]
    assert "RUN" not in final  # the final stage only copies the venv in
    user, _, group = last(final, "USER").partition(":")
    assert user.isdigit() and int(user) != 0 and group.isdigit() and int(group) != 0
    assert exec_form(last(final, "ENTRYPOINT")) == ["kafka-admission-proxy"]
    assert last(final, "STOPSIGNAL") == "SIGTERM"


def test_the_image_install_carries_only_the_runtime(runtime_venv: Path) -> None:
    python = runtime_venv / "bin" / "python"
    for module in (*EXTRAS_MODULES, "pip"):
        found = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True)
        assert found.returncode != 0, f"{module} is in the image's install"
    version = subprocess.run(
        [str(runtime_venv / "bin" / "kafka-admission-proxy"), "--version"], capture_output=True, text=True, check=True
    )
    assert re.fullmatch(r"kafka-admission-proxy \d+\.\d+\.\d+\S*\n", version.stdout)
    size = sum(f.stat().st_size for f in runtime_venv.rglob("*") if f.is_file() and not f.is_symlink())
    assert size < RUNTIME_SIZE_BOUND_MB * 1e6, f"the runtime install is {size / 1e6:.0f} MB"


def _healthcheck(venv: Path, admin: str) -> subprocess.CompletedProcess[str]:
    value = last(instructions(), "HEALTHCHECK")
    options, _, command = value.partition(" CMD ")
    assert "--timeout=" in options
    argv = [arg.replace("127.0.0.1:9464", admin) for arg in exec_form(command)]
    return subprocess.run(argv, capture_output=True, text=True, env=image_env(venv), timeout=30)


def test_entrypoint_and_cmd_carry_a_produce_and_consume_and_the_healthcheck_follows_the_proxy(
    tansu: Any, runtime_venv: Path, launch: Any, tmp_path: Path
) -> None:
    final = instructions()
    argv = exec_form(last(final, "ENTRYPOINT")) + exec_form(last(final, "CMD"))
    assert IMAGE_CONFIG in argv and "9464" in last(final, "EXPOSE").split()
    config_path = tmp_path / "etc" / "config.yaml"
    config_path.parent.mkdir()
    argv = [str(runtime_venv / "bin" / argv[0])] + [str(config_path) if a == IMAGE_CONFIG else a for a in argv[1:]]
    proxy = launch(proxy_config(tansu.bootstrap), argv, config_path)
    admin = proxy.config["admin"]["bind"]
    assert _healthcheck(runtime_venv, admin).returncode == 0
    assert len(produce_and_consume(proxy.bootstrap)) == 20
    assert proxy.metric("kafka_admission_requests_total", api="produce") >= 1
    assert '"msg": "proxy ready"' in proxy.log()  # CMD's --log-format json
    proxy.stop()
    assert proxy.returncode == 0  # SIGTERM (STOPSIGNAL) drains and exits 0
    failed = _healthcheck(runtime_venv, admin)
    assert failed.returncode != 0 and "Connection refused" in failed.stderr


@pytest.mark.parametrize("argv", [["run"], ["check-config", "--config", "/nonexistent.yaml"]])
def test_a_bad_command_line_exits_2_without_a_traceback(runtime_venv: Path, argv: list[str]) -> None:
    result = subprocess.run(
        [str(runtime_venv / "bin" / "kafka-admission-proxy"), *argv], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and result.stderr.strip()


def test_demo_in_the_runtime_install_names_the_extra_it_needs(runtime_venv: Path) -> None:
    result = subprocess.run(
        [str(runtime_venv / "bin" / "kafka-admission-proxy"), "demo"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "pip install 'kafka-admission-proxy[demo]'" in result.stderr
    assert "Traceback" not in result.stderr
