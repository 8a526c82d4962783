"""deploy/config.example.yaml cannot drift from the config model: every key is
written, with its default unless marked "example", and the commented TLS and
per-listener examples validate (with real certificate files in their place)."""

from __future__ import annotations

import ipaddress
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from proxy.config.model import ListenerPolicies, ListenerTls, UpstreamTls, parse_config
from tests.conftest import ROOT, Certs

EXAMPLE = ROOT / "deploy" / "config.example.yaml"
# Keys the example sets on purpose (no default, or a default that is wrong for a deployment).
EXAMPLE_VALUES = {
    ("upstream", "bootstrap_servers"),
    ("listeners", 0, "name"),
    ("listeners", 0, "bind"),
    ("listeners", 0, "advertised_host"),
    # The two limits a deployment with a memory limit sets, whose defaults (Kafka's) are off.
    ("policies", "max.connections.per.ip"),
    ("policies", "queued.max.request.bytes"),
}
BLOCK = re.compile(r"^ *# >>> example: (?P<title>[^(\n]+?) \(.*?\n(?P<body>.*?)^ *# <<<$", re.M | re.S)


def leaves(data: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    if isinstance(data, dict):
        for key, value in data.items():
            yield from leaves(value, (*path, key))
    elif isinstance(data, list) and data and all(isinstance(item, dict) for item in data):
        for index, item in enumerate(data):
            yield from leaves(item, (*path, index))
    else:
        yield path, data


def at(data: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        data = data[part]
    return data


def commented_examples() -> dict[str, Any]:
    blocks = {}
    for match in BLOCK.finditer(EXAMPLE.read_text()):
        body = "\n".join(re.sub(r"^ *# ?", "", line) for line in match["body"].splitlines())
        blocks[match["title"]] = yaml.safe_load(body)
    return blocks


def test_every_key_is_written_with_its_default_unless_marked_example() -> None:
    raw = yaml.safe_load(EXAMPLE.read_text())
    # effective() fills in every default: equal means no key is missing or spelt differently.
    assert parse_config(raw).effective() == raw
    defaults = parse_config(
        {"upstream": {"bootstrap_servers": ["x:1"]}, "listeners": [{"name": "x", "bind": "x:1"}]}
    ).effective()
    for path, value in leaves(raw):
        if path not in EXAMPLE_VALUES:
            assert value == at(defaults, path), f"{path}: {value!r} is not the default {at(defaults, path)!r}"
    marked = [line for line in EXAMPLE.read_text().splitlines() if re.search(r"#\s*example\b", line)]
    assert len(marked) == len(EXAMPLE_VALUES), marked


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def test_a_listener_on_every_interface_advertises_a_name_remote_clients_can_reach() -> None:
    config = parse_config(yaml.safe_load(EXAMPLE.read_text()))
    tls_listener = commented_examples()["TLS listener"][0]
    for bind, advertised in [(lst.bind_address[0], lst.advertised_host) for lst in config.listeners] + [
        (tls_listener["bind"].rsplit(":", 1)[0], tls_listener["advertised_host"])
    ]:
        if bind in ("0.0.0.0", "::"):
            assert not _is_loopback(advertised), f"binds {bind} but advertises {advertised}"
        if _is_loopback(bind):
            assert _is_loopback(advertised), f"binds {bind} but advertises {advertised}"


def test_the_commented_examples_are_complete_and_validate(certs: Certs) -> None:
    blocks = commented_examples()
    assert set(blocks) == {"TLS listener", "per-listener overrides", "upstream TLS"}
    real_files = {"tls.crt": certs.server_cert, "tls.key": certs.server_key, "ca.crt": certs.ca_file}

    def with_real_files(section: dict[str, Any]) -> dict[str, Any]:
        return {
            k: real_files.get(Path(v).name, v) if isinstance(v, str) and v.startswith("/etc/") else v
            for k, v in section.items()
        }

    raw = yaml.safe_load(EXAMPLE.read_text())
    tls_listener = blocks["TLS listener"][0]
    assert set(tls_listener["tls"]) == set(ListenerTls.model_fields)
    raw["listeners"].append({**tls_listener, "tls": with_real_files(tls_listener["tls"])})
    per_listener = blocks["per-listener overrides"]
    assert {key.rsplit(".external.", 1)[1] for key in per_listener} == {
        f.alias for f in ListenerPolicies.model_fields.values()
    }
    raw["policies"].update(per_listener)
    assert set(blocks["upstream TLS"]) == set(UpstreamTls.model_fields)
    raw["upstream"]["tls"] = with_real_files(blocks["upstream TLS"])
    config = parse_config(raw)
    assert config.listeners[1].tls is not None and config.listeners[1].tls.client_auth == "required"
    assert config.policies.max_response_size_for("external") == 52428800
    assert config.upstream.tls.enabled


def test_check_config_accepts_the_example_and_prints_it_back() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "check-config", "--config", str(EXAMPLE)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout) == yaml.safe_load(EXAMPLE.read_text())
