"""deploy/kafka-admission-proxy.service: `systemd-analyze verify` accepts it
unchanged (in a root that holds the unit, the system's units and the console
script at the unit's path), it is sandboxed, and its exact ExecStartPre,
ExecStart and ExecReload command lines work against a real broker.

No systemd runs here, so what it would do for the unit is done by the test: the
command lines run as an unprivileged uid (as DynamicUser= would run them), with
the config directory in the unit's mode and the keys handed in as
LoadCredential= hands them (a copy readable by that uid only). Not tested: systemd
making the copy itself, the dynamic uid's allocation, the sandboxing options'
effect and MemoryMax='s enforcement (a cgroup)."""

from __future__ import annotations

import os
import shlex
import shutil
import ssl
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml

from demo.tansu import free_port
from proxy.config.model import parse_config
from proxy.workers.sizing import available_cpus
from tests import raw_kafka
from tests.conftest import ROOT, wait_until
from tests.deploy.conftest import (
    IMAGE_CONFIG,
    IMAGE_VENV,
    image_install,
    produce_and_consume,
    proxy_config,
    system_tool,
)

UNIT = ROOT / "deploy" / "kafka-admission-proxy.service"
# Where systemd puts a system service's credentials ($CREDENTIALS_DIRECTORY, %d in the unit).
CREDENTIALS = "/run/credentials/kafka-admission-proxy.service"
# A uid as DynamicUser= allocates them (61184-65519): no file here belongs to it.
DYNAMIC_UID = 61184


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
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "NoNewPrivileges": "yes",
        "CapabilityBoundingSet": "",
        "DynamicUser": "yes",
        "PrivateDevices": "yes",
        "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
        "SystemCallFilter": "@system-service",
        "ExecReload": "/bin/kill -HUP $MAINPID",
        "RestartPreventExitStatus": "2",
        "LoadCredential": "private:/etc/kafka-admission-proxy/private",
        "MemoryMax": "512M",
        "CPUQuota": "100%",
    }
    assert {key: service.get(key, [None])[-1] for key in expected} == expected
    # The stop timeout leaves room for the drain.
    [start] = service["ExecStart"]
    drain = float(shlex.split(start)[shlex.split(start).index("--drain-timeout") + 1])
    assert float(service["TimeoutStopSec"][0]) > drain


def test_the_units_cpu_quota_is_what_workers_auto_runs_and_the_example_configs_workers(tmp_path: Path) -> None:
    """CPUQuota= is the service cgroup's cpu.max as systemd writes it (P% is P * 1000 us per
    100,000 us period): `workers: auto` reads it, so the unit's quota gives the example config's
    `workers` (1), and a quota raised in the unit raises auto with it, rounded up."""
    [quota] = service_section()["CPUQuota"]
    percent = int(quota.removesuffix("%"))
    example = parse_config(yaml.safe_load((ROOT / "deploy" / "config.example.yaml").read_text()))
    for raised, workers in ((percent, example.workers), (150, 2), (400, 4)):
        tree = tmp_path / f"quota-{raised}"
        service = tree / "sys-fs-cgroup" / "system.slice" / UNIT.name
        service.mkdir(parents=True)
        (service / "cpu.max").write_text(f"{raised * 1000} 100000\n")
        (tree / "proc-self-cgroup").write_text(f"0::/system.slice/{UNIT.name}\n")
        assert available_cpus(64, tree / "proc-self-cgroup", tree / "sys-fs-cgroup") == workers


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


@pytest.fixture(scope="module")
def daemon_venv() -> Iterator[Path]:
    """deploy/README.md's daemon install, made from the system's python3 (a venv from this test's
    Python would live under /root, which an unprivileged uid cannot enter), in a folder any uid
    can read, as /opt is."""
    base = shutil.which("python3", path="/usr/bin:/bin")
    if base is None:
        pytest.skip("no system python3 (apt-get install python3-venv)")
    folder = Path(tempfile.mkdtemp(prefix="kap-daemon-"))
    try:
        folder.chmod(0o755)
        yield image_install(folder, base)
    finally:
        shutil.rmtree(folder)


def as_dynamic_user(argv: list[str]) -> list[str]:
    return ["setpriv", f"--reuid={DYNAMIC_UID}", f"--regid={DYNAMIC_UID}", "--clear-groups", "--", *argv]


def load_credentials(private: Path, credentials: Path) -> None:
    """What systemd does for the unit's LoadCredential=ID:DIRECTORY at start: each file of the
    directory copied as credential ID_<file name>, readable by the service's user only."""
    [value] = service_section()["LoadCredential"]
    ident, _, source = value.partition(":")
    assert source == f"{IMAGE_CONFIG.rsplit('/', 1)[0]}/{private.name}"
    credentials.mkdir(parents=True)
    for path in private.iterdir():
        copy = credentials / f"{ident}_{path.name}"
        shutil.copyfile(path, copy)
        os.chown(copy, DYNAMIC_UID, DYNAMIC_UID)
        copy.chmod(0o400)
    os.chown(credentials, DYNAMIC_UID, DYNAMIC_UID)
    credentials.chmod(0o500)


def api_versions_over_tls(address: str, ca_file: str) -> int:
    return raw_kafka.api_versions_over_tls(address, ssl.create_default_context(cafile=ca_file), 5)[0]


def test_the_dynamic_user_reads_a_root_only_key_only_as_the_units_credential(
    tansu: Any, daemon_venv: Path, launch: Any
) -> None:
    if os.geteuid() != 0:
        pytest.skip("running the unit's command lines as another uid (DynamicUser=) needs root")
    root = Path(tempfile.mkdtemp(prefix="kap-unit-"))
    try:
        root.chmod(0o755)
        etc = root / "etc"
        etc.mkdir(mode=int(service_section()["ConfigurationDirectoryMode"][-1], 8))
        etc.chmod(int(service_section()["ConfigurationDirectoryMode"][-1], 8))  # whatever the umask
        ca = trustme.CA()
        leaf = ca.issue_cert("localhost", "127.0.0.1")
        leaf.cert_chain_pems[0].write_to_path(str(etc / "server.pem"))
        ca.cert_pem.write_to_path(str(root / "ca.pem"))
        private = etc / "private"
        private.mkdir(mode=0o700)
        leaf.private_key_pem.write_to_path(str(private / "server.key"))
        (private / "server.key").chmod(0o600)  # root's alone, as deploy/README.md installs it
        config_path = etc / "config.yaml"

        def write_config(key_file: Path) -> dict[str, Any]:
            config = proxy_config(tansu.bootstrap)
            tls = {"cert_file": str(etc / "server.pem"), "key_file": str(key_file)}
            config["listeners"].append(
                {
                    "name": "tls",
                    "bind": f"127.0.0.1:{free_port()}",
                    "tls": tls,
                    "node_port_base": config["listeners"][0]["node_port_base"] + 100,
                }
            )
            config_path.write_text(yaml.safe_dump(config))
            config_path.chmod(0o644)
            return config

        # The finding: the key where it lies is out of the dynamic user's reach.
        write_config(private / "server.key")
        refused = subprocess.run(
            as_dynamic_user(command_line("ExecStartPre", daemon_venv, config_path)),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode == 2, refused.stderr
        assert f"listeners[1].tls.key_file: cannot read '{private / 'server.key'}': Permission denied" in (
            refused.stderr.splitlines()
        ), refused.stderr

        # The unit's way: the key as the credential systemd hands in.
        credentials = root / CREDENTIALS.lstrip("/")
        load_credentials(private, credentials)
        config = write_config(credentials / "private_server.key")
        pre = subprocess.run(
            as_dynamic_user(command_line("ExecStartPre", daemon_venv, config_path)),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert pre.returncode == 0, pre.stderr
        proxy = launch(config, as_dynamic_user(command_line("ExecStart", daemon_venv, config_path)), config_path)
        assert api_versions_over_tls(proxy.listener_bind("tls"), str(root / "ca.pem")) == 5
        assert len(produce_and_consume(proxy.bootstrap)) == 20
        assert "readable by" not in proxy.log()  # the credential is the proxy user's alone
        proxy.stop()
        assert proxy.returncode == 0, proxy.log()
    finally:
        shutil.rmtree(root)
