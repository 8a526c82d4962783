"""Operator mistakes on the command line end in one clear line and a non-zero
exit, never a traceback: a port already in use (Kafka listener, admin, the
demo's fixed ports) and an unknown log level."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from demo.tansu import free_port
from tests.conftest import ROOT


@contextmanager
def port_in_use(host: str, port: int) -> Iterator[None]:
    """Something else listens on ``host:port`` (if it already does, that is fine too)."""
    sock = socket.socket()
    try:
        try:
            sock.bind((host, port))
            sock.listen()
        except OSError:
            pass  # already taken by someone else: in use all the same
        yield
    finally:
        sock.close()


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout
    )


def assert_one_clear_line(result: subprocess.CompletedProcess[str], line: str) -> None:
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "ExceptionGroup" not in result.stderr, result.stderr
    assert result.stderr.splitlines()[-1] == line, result.stderr


def write_config(tmp_path: Path, listener_port: int, admin_port: int, **sections: object) -> Path:
    path = tmp_path / "proxy.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "upstream": {"bootstrap_servers": ["127.0.0.1:9"]},
                "listeners": [{"name": "external", "bind": f"127.0.0.1:{listener_port}"}],
                "admin": {"bind": f"127.0.0.1:{admin_port}"},
                **sections,
            }
        )
    )
    return path


def test_a_kafka_listener_port_in_use_names_the_listener_and_address(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path, port, free_port())
    with port_in_use("127.0.0.1", port):
        result = cli("run", "--config", str(config))
    assert_one_clear_line(
        result, f"kafka-admission-proxy: listener external: cannot listen on 127.0.0.1:{port}: Address already in use"
    )


def test_the_admin_port_in_use_is_named(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path, free_port(), port)
    with port_in_use("127.0.0.1", port):
        result = cli("run", "--config", str(config))
    assert_one_clear_line(
        result, f"kafka-admission-proxy: admin: cannot listen on 127.0.0.1:{port}: Address already in use"
    )


def test_workers_on_a_port_another_proxys_workers_serve_say_it_is_in_use(tmp_path: Path, start_proxy) -> None:  # type: ignore[no-untyped-def]
    # Workers bind with SO_REUSEPORT, which would join the first proxy's workers on the port
    # (the kernel then spreads clients over both proxies, with no error): the supervisor's plain
    # bind before its workers start refuses, as one process does.
    first = start_proxy("127.0.0.1:9", workers=2)
    port = int(first.bootstrap.rsplit(":", 1)[1])
    config = write_config(tmp_path, port, free_port(), workers=2)
    result = cli("run", "--config", str(config), timeout=30)
    assert_one_clear_line(
        result, f"kafka-admission-proxy: listener external: cannot listen on 127.0.0.1:{port}: Address already in use"
    )
    assert first.process is not None and first.process.poll() is None


@pytest.mark.demo_ports
def test_the_demo_with_its_listener_port_in_use_says_so() -> None:
    # The demo's sample config binds fixed ports (29092, admin 9464): hold the first.
    with port_in_use("127.0.0.1", 29092):
        result = cli("demo", "--exit-after-workload", "--records", "1")
    assert_one_clear_line(
        result, "kafka-admission-proxy: listener external: cannot listen on 127.0.0.1:29092: Address already in use"
    )


def test_an_unknown_log_level_is_refused_with_the_valid_choices(tmp_path: Path) -> None:
    result = cli("run", "--config", str(tmp_path / "unused.yaml"), "--log-level", "LOUD")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "kafka-admission-proxy run: error: argument --log-level: invalid choice: 'LOUD' "
        "(choose from 'DEBUG', 'INFO', 'WARNING', 'ERROR', 'CRITICAL') (see --help)"
    ]


def test_log_levels_are_case_insensitive(tmp_path: Path) -> None:
    config = write_config(tmp_path, free_port(), free_port())
    result = cli("check-config", "--config", str(config), "--log-level", "debug")
    assert result.returncode == 0, result.stderr
