"""deploy/kafka-admission-proxy.service: `systemd-analyze verify` accepts it
unchanged (in a root that holds the unit, the system's units and the console
script at the unit's path), it is sandboxed, and its exact ExecStartPre,
ExecStart and ExecReload command lines work against a real broker."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import ROOT, wait_until
from tests.deploy.conftest import IMAGE_CONFIG, IMAGE_VENV, produce_and_consume, proxy_config, system_tool

UNIT = ROOT / "deploy" / "kafka-admission-proxy.service"


def service_section() -> dict[str, list[str]]:
    """The [Service] keys and their values; systemd keys repeat, so every value is kept."""
    values: dict[str, list[str]] = {}
    section = None
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        if section == "Service":
            key, _, value = line.partition("=")
            values.setdefault(key, []).append(value)
    return values


def command_line(key: str, venv: Path, config_path: Path) -> list[str]:
    """The unit's command line for ``key``, with the install's paths mapped to the test's."""
    [value] = service_section()[key]
    argv = shlex.split(value)
    mapped = [arg.replace(IMAGE_VENV, str(venv)) for arg in argv]
    return [str(config_path) if arg == IMAGE_CONFIG else arg for arg in mapped]


def test_systemd_analyze_verify_accepts_the_unit_without_a_warning(tmp_path: Path, runtime_venv: Path) -> None:
    analyze = system_tool("systemd-analyze", "systemd")
    root = tmp_path / "root"
    (root / "etc" / "systemd" / "system").mkdir(parents=True)
    shutil.copy(UNIT, root / "etc" / "systemd" / "system" / UNIT.name)
    shutil.copytree("/usr/lib/systemd/system", root / "usr" / "lib" / "systemd" / "system", symlinks=True)
    # The executables the unit names, where it names them.
    script = root / IMAGE_VENV.lstrip("/") / "bin" / "kafka-admission-proxy"
    script.parent.mkdir(parents=True)
    shutil.copy(runtime_venv / "bin" / "kafka-admission-proxy", script)
    (root / "usr" / "bin").mkdir()
    shutil.copy("/usr/bin/kill", root / "usr" / "bin" / "kill")
    (root / "bin").symlink_to("usr/bin")
    result = subprocess.run([analyze, "verify", f"--root={root}", UNIT.name], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr  # a misspelt value is only a warning: none allowed


def test_the_unit_is_sandboxed_and_reloads_with_sighup() -> None:
    service = service_section()
    expected = {
        "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes", "NoNewPrivileges": "yes",
        "CapabilityBoundingSet": "", "DynamicUser": "yes", "PrivateDevices": "yes",
        "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX", "SystemCallFilter": "@system-service",
        "ExecReload": "/bin/kill -HUP $MAINPID", "RestartPreventExitStatus": "2",
    }
    assert {key: service.get(key, [None])[-1] for key in expected} == expected
    # The stop timeout leaves room for the drain.
    [start] = service["ExecStart"]
    drain = float(shlex.split(start)[shlex.split(start).index("--drain-timeout") + 1])
    assert float(service["TimeoutStopSec"][0]) > drain


def test_exec_start_pre_refuses_a_bad_config_with_exit_2(tmp_path: Path, runtime_venv: Path) -> None:
    config_path = tmp_path / "config.yaml"
    config_path.write_text("upstream: {bootstrap_servers: ['127.0.0.1:9092']}\nlisteners: []\nadmn: {}\n")
    result = subprocess.run(command_line("ExecStartPre", runtime_venv, config_path), capture_output=True, text=True)
    assert result.returncode == 2
    assert "admn: unknown key (did you mean 'admin'?)" in result.stderr
    assert "Traceback" not in result.stderr


def test_exec_start_pre_start_and_reload_run_the_proxy_against_a_broker(
    tansu: Any, runtime_venv: Path, launch: Any, tmp_path: Path
) -> None:
    config_path = tmp_path / "config.yaml"
    config = proxy_config(tansu.bootstrap)
    config_path.write_text(yaml.safe_dump(config))
    pre = subprocess.run(command_line("ExecStartPre", runtime_venv, config_path), capture_output=True, text=True)
    assert pre.returncode == 0, pre.stderr
    proxy = launch(config, command_line("ExecStart", runtime_venv, config_path), config_path)
    assert len(produce_and_consume(proxy.bootstrap)) == 20
    # ExecReload, with $MAINPID as systemd would fill it in.
    assert proxy.process is not None
    pid = str(proxy.process.pid)
    reload = [arg.replace("$MAINPID", pid) for arg in command_line("ExecReload", runtime_venv, config_path)]
    subprocess.run(reload, check=True)
    wait_until(lambda: proxy.metric("kafka_admission_config_reloads_total", outcome="success") == 1)
    assert len(produce_and_consume(proxy.bootstrap)) == 20
    proxy.stop()
    assert proxy.returncode == 0
